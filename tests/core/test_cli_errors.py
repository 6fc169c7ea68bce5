"""Every user error of ``tvmc compile`` / ``tvmc run`` is one stderr line naming its cause, with
exit code 2 (issue 12, items 1-3): bad flags, models, hardware configs (field widths, NaN,
Infinity), precision configs, errors raised inside TVM passes or inside the VM call, damaged,
truncated or edited packages, and bad input files.

One small package per target is compiled once for the module; each case damages a copy of it or
writes the bad file it needs, then runs ``tvmc`` in-process. The truncated ``mod.so``, which
killed the process with SIGBUS before packages were checked, runs in a subprocess.
"""

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from helpers import models
from tvm_accel import cli
from tvm_accel.errors import AccelError, BlobError, ConfigError
from tvm_accel.package import file_record, metadata_digest

MODELS = {
    "vta": lambda: models.quantized("single_conv", cin=16, cout=16, hw=8),
    "dpu": lambda: models.quantized("single_conv", power_of_two=True, cin=16, cout=16, hw=8),
    "marsellus": lambda: models.quantized("single_conv", cin=32, cout=32, hw=8),
}
CONFIGS = {"vta": "vta_1x16x16", "dpu": "dpu_default", "marsellus": "marsellus_default"}
RECOMPILE = "recompile the model"


class Workspace:
    """A directory with a model and a compiled package per target, and makers of bad files."""

    def __init__(self, root: Path):
        self.root = root
        self.out = str(root / "out.tar")

    def model(self, target: str) -> str:
        return str(self.root / f"{target}.onnx")

    def package(self, target: str) -> str:
        return str(self.root / f"{target}.tar")

    def file(self, name: str, data: bytes | str) -> str:
        p = self.root / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    def config(self, target: str, name: str, **changes) -> str:
        """The target's bundled config with ``changes`` (JSON allows NaN and Infinity)."""
        from tvm_accel.target import get_target

        pkg = __import__(get_target(target).package + ".hw_config", fromlist=["CONFIG_DIR"])
        d = json.loads((pkg.CONFIG_DIR / f"{CONFIGS[target]}.json").read_text())
        return self.file(name, json.dumps({**d, **changes}))

    def npz(self, name: str, **arrays) -> str:
        p = self.root / name
        np.savez(p, **arrays)
        return str(p)

    def members(self, target: str) -> dict[str, bytes]:
        with tarfile.open(self.package(target)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}

    def tar(self, name: str, members: dict[str, bytes]) -> str:
        p = self.root / name
        with tarfile.open(p, "w") as tar:
            for n, data in members.items():
                info = tarfile.TarInfo(n)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return str(p)

    def edited(self, target: str, name: str, meta=None, mod_so=None, drop=(),
               resign: bool = False) -> str:
        """A copy of the target's package with ``metadata.json`` passed through ``meta``,
        ``mod.so`` through ``mod_so(data, members)`` and the ``drop`` members left out.
        ``resign`` recomputes the checksums and digest, as a consistent but wrong package."""
        m = self.members(target)
        raw = json.loads(m["metadata.json"])
        if mod_so is not None:
            m["mod.so"] = mod_so(m["mod.so"], m)
        if meta is not None:
            raw = meta(raw)
        if resign:
            raw["files"] = {n: file_record(d) for n, d in m.items() if n != "metadata.json"}
            raw["digest"] = metadata_digest(raw)
        m["metadata.json"] = json.dumps(raw).encode()
        return self.tar(name, {n: d for n, d in m.items() if n not in drop})


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    w = Workspace(tmp_path_factory.mktemp("cli_errors"))
    for target, make in MODELS.items():
        onnx.save(make(), w.model(target))
        assert cli.main(["compile", w.model(target), "--target", f"{target}, llvm", "-o",
                         w.package(target)]) == 0
    return w


def _tvmc(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse
        return e.code


def _blob(members: dict[str, bytes]) -> bytes:
    return next(d for n, d in members.items() if n.startswith("blobs/"))


def _corrupt_blob(so: bytes, members: dict[str, bytes]) -> bytes:
    """``mod.so`` with bytes inside the embedded program blob overwritten."""
    at = so.find(_blob(members)[:64])
    assert at >= 0
    return so[:at + 100] + b"\xa5" * 40 + so[at + 140:]


def _input(meta: dict, **changes) -> dict:
    return {**meta, "inputs": [{**meta["inputs"][0], **changes}]}


# --- the cases: (argv maker, words the one error line must contain) ---------------------------
def compile_(target: str, *flags: str, model: str | None = None):
    return lambda w: ["compile", model or w.model(target), "--target", f"{target}, llvm",
                      "-o", w.out, *flags]


def config(target: str, name: str, **changes):
    return lambda w: compile_(target, f"--target-{target}-config",
                              w.config(target, name, **changes))(w)


def run(make_package, *flags):
    return lambda w: ["run", make_package(w), *flags]


def vta(w: Workspace) -> str:
    return w.package("vta")


def _save_npy(path: Path) -> str:
    np.save(path, np.zeros((1, 16, 8, 8), np.float32))
    return str(path)


NAN, INF = float("nan"), float("inf")

CASES = [
    # flags
    ("target-empty", lambda w: ["compile", w.model("vta"), "--target", ""], ["--target"]),
    ("target-host-first", lambda w: ["compile", w.model("vta"), "--target", "llvm, vta"],
     ["host"]),
    ("target-unknown", lambda w: ["compile", w.model("vta"), "--target", "npu, llvm"],
     ["npu"]),
    ("target-two-accels", lambda w: ["compile", w.model("vta"), "--target", "vta, dpu, llvm"],
     ["at most one"]),
    ("target-missing", lambda w: ["compile", w.model("vta")], ["--target"]),
    ("bad-strategy-choice", compile_("vta", "--target-vta-strategy", "best"),
     ["--target-vta-strategy"]),
    ("bad-layout-choice", compile_("vta", "--target-vta-layout-choice", "greedy"),
     ["--target-vta-layout-choice"]),
    ("embedding-weights", compile_("vta", "--target-vta-embedding-weights", "a,b"),
     ["--target-vta-embedding-weights"]),
    ("top-k-zero", compile_("vta", "--target-vta-top-k", "0"), ["--target-vta-top-k 0"]),
    ("marsellus-vdd", compile_("marsellus", "--target-marsellus-vdd", "0.2"), ["VDD 0.2"]),
    ("output-dir-missing", lambda w: compile_("vta")(w)[:-1] + [str(w.root / "no" / "m.tar")],
     ["does not exist"]),
    ("output-is-dir", lambda w: compile_("vta")(w)[:-1] + [str(w.root)], ["is a directory"]),
    ("tuning-records-missing", compile_("vta", "--tuning-records", "/nonexistent/r.json"),
     ["r.json"]),
    # models
    ("model-missing", lambda w: compile_("vta", model=str(w.root / "nope.onnx"))(w),
     ["nope.onnx"]),
    ("model-garbage", lambda w: compile_("vta", model=w.file("junk.onnx", b"\0\1junk"))(w),
     ["junk.onnx"]),
    ("model-is-dir", lambda w: compile_("vta", model=str(w.root))(w), ["is a directory"]),
    # hardware configs: files
    ("config-missing", compile_("vta", "--target-vta-config", "vta_4x4x4"), ["vta_4x4x4"]),
    ("config-not-json", lambda w: compile_("vta", "--target-vta-config",
                                           w.file("c.json", "{nope"))(w), ["not valid JSON"]),
    ("config-not-object", lambda w: compile_("dpu", "--target-dpu-config",
                                             w.file("l.json", "[1, 2]"))(w), ["JSON object"]),
    ("config-unknown-field", config("vta", "u.json", LOG_BLOK_IN=4), ["LOG_BLOK_IN"]),
    ("config-wrong-type", config("marsellus", "t.json", L1_BYTES="big"), ["L1_BYTES"]),
    # VTA fields: the int32 width of the simulator binding, finite floats (issue 12, item 3)
    ("vta-dram-latency-2^31", config("vta", "v1.json", DRAM_LATENCY_CYCLES=2**31),
     ["DRAM_LATENCY_CYCLES", "2147483647"]),
    ("vta-gemm-cycles-2^32+1", config("vta", "v2.json", GEMM_CYCLES_PER_UOP=2**32 + 1),
     ["GEMM_CYCLES_PER_UOP"]),
    ("vta-alu-cycles-0", config("vta", "v3.json", ALU_CYCLES_PER_UOP=0),
     ["ALU_CYCLES_PER_UOP"]),
    ("vta-pipeline-latency-2^40", config("vta", "v4.json", PIPELINE_LATENCY_CYCLES=2**40),
     ["PIPELINE_LATENCY_CYCLES"]),
    ("vta-log-batch-2^31", config("vta", "v5.json", LOG_BATCH=2**31), ["LOG_BATCH"]),
    ("vta-log-uop-2^31", config("vta", "v6.json", LOG_UOP_BUFF_SIZE=2**31),
     ["LOG_UOP_BUFF_SIZE"]),
    ("vta-clock-nan", config("vta", "v7.json", CLOCK_MHZ=NAN), ["CLOCK_MHZ", "finite"]),
    ("vta-clock-inf", config("vta", "v8.json", CLOCK_MHZ=INF), ["CLOCK_MHZ", "finite"]),
    ("vta-dram-bw-minus-inf", config("vta", "v9.json", DRAM_BYTES_PER_CYCLE=-INF),
     ["DRAM_BYTES_PER_CYCLE"]),
    ("vta-dram-bw-10^400", config("vta", "v10.json", DRAM_BYTES_PER_CYCLE=10**400),
     ["DRAM_BYTES_PER_CYCLE", "too large"]),
    ("vta-host-bw-nan", config("vta", "v11.json", HOST_GATHER_BYTES_PER_CYCLE=NAN),
     ["HOST_GATHER_BYTES_PER_CYCLE"]),
    # DPU and MARSELLUS range-check every field that crosses ctypes (verified here)
    ("dpu-num-pe-2^32", config("dpu", "d1.json", NUM_PE=2**32), ["NUM_PE"]),
    ("dpu-pm-2^31", config("dpu", "d2.json", PM_BYTES=2**31), ["PM_BYTES"]),
    ("dpu-clock-nan", config("dpu", "d3.json", CLOCK_MHZ=NAN), ["CLOCK_MHZ"]),
    ("dpu-ddr-bw-inf", config("dpu", "d4.json", DDR_BYTES_PER_CYCLE=INF),
     ["DDR_BYTES_PER_CYCLE"]),
    ("dpu-latency-2^31", config("dpu", "d5.json", LOAD_LATENCY_CYCLES=2**31),
     ["LOAD_LATENCY_CYCLES"]),
    ("mars-l1-2^31", config("marsellus", "m1.json", L1_BYTES=2**31), ["L1_BYTES"]),
    ("mars-cores-2^32+9", config("marsellus", "m2.json", RBE_CORES=2**32 + 9), ["RBE_CORES"]),
    ("mars-clock-nan", config("marsellus", "m3.json", CLOCK_MHZ=NAN), ["CLOCK_MHZ"]),
    ("mars-dma-inf", config("marsellus", "m4.json", DMA_BYTES_PER_CYCLE=INF),
     ["DMA_BYTES_PER_CYCLE"]),
    ("mars-speedup-10^400", config("marsellus", "m5.json", CL_4B_SPEEDUP=10**400),
     ["CL_4B_SPEEDUP"]),
    # raised inside the compile pass, back through TVM's FFI
    ("precision-unknown-layer", lambda w: compile_("vta", "--precision-config", w.file(
        "p1.json", '{"layers": {"nope": {"w": 4}}}'))(w), ["p1.json", "layers.nope"]),
    ("precision-missing", compile_("vta", "--precision-config", "/nonexistent/p.json"),
     ["p.json"]),
    ("precision-not-json", lambda w: compile_("vta", "--precision-config",
                                              w.file("p2.json", "{"))(w), ["p2.json"]),
    # packages
    ("package-missing", run(lambda w: str(w.root / "none.tar")), ["none.tar", "no such file"]),
    ("package-is-dir", run(lambda w: str(w.root)), ["is a directory"]),
    ("package-garbage", run(lambda w: w.file("g.tar", b"garbage" * 100)),
     ["g.tar", "not a compiled package"]),
    ("package-truncated-tar", run(lambda w: w.file(
        "t.tar", Path(vta(w)).read_bytes()[:len(Path(vta(w)).read_bytes()) * 2 // 3])),
     ["t.tar", "truncated"]),
    ("package-foreign-tvmc", run(lambda w: w.tar("f.tar", {
        "mod.so": w.members("vta")["mod.so"], "mod.json": b"{}", "mod.params": b""})),
     ["f.tar", "metadata.json"]),
    ("package-no-mod-so", run(lambda w: w.edited("vta", "n.tar", drop=["mod.so"])),
     ["n.tar", "mod.so"]),
    ("package-no-blob", run(lambda w: w.edited("vta", "nb.tar", drop=[
        n for n in w.members("vta") if n.startswith("blobs/")])), ["nb.tar", "blobs/"]),
    ("metadata-not-json", run(lambda w: w.tar("mj.tar", {
        **w.members("vta"), "metadata.json": b"{oops"})), ["mj.tar", "metadata.json"]),
    ("metadata-old-format", run(lambda w: w.edited("vta", "of.tar", lambda m: {
        **m, "format": 1}, resign=True)), ["of.tar", "format 1"]),
    ("metadata-other-target", run(lambda w: w.edited("vta", "ot.tar", lambda m: {
        **m, "target": "dpu"})), ["ot.tar", "metadata.json", "checksum"]),
    ("metadata-wrong-shape", run(lambda w: w.edited("vta", "ws.tar", lambda m: _input(
        m, shape=[1, 16, 9, 9]))), ["ws.tar", "metadata.json", "checksum"]),
    ("metadata-other-target-resigned", run(lambda w: w.edited("vta", "otr.tar", lambda m: {
        **m, "target": "dpu"}, resign=True)), ["otr.tar", "'dpu'", "vta program"]),
    ("metadata-unknown-target-resigned", run(lambda w: w.edited(
        "vta", "utr.tar", lambda m: {**m, "target": "npu"}, resign=True)), ["utr.tar", "npu"]),
    ("metadata-wrong-shape-resigned", run(lambda w: w.edited("vta", "wsr.tar", lambda m: _input(
        m, shape=[1, 16, 9, 9]), resign=True)), ["wsr.tar", "input 'input'", "mod.so"]),
    ("metadata-wrong-dtype-resigned", run(lambda w: w.edited("dpu", "wdr.tar", lambda m: _input(
        m, dtype="int8"), resign=True)), ["wdr.tar", "input 'input'", "mod.so"]),
    ("mod-so-truncated", run(lambda w: w.edited("dpu", "ts.tar", mod_so=lambda s, m: s[
        :len(s) // 2])), ["ts.tar", "mod.so", "truncated"]),
    ("mod-so-blob-corrupt", run(lambda w: w.edited("vta", "bc.tar", mod_so=_corrupt_blob)),
     ["bc.tar", "mod.so", "sha256"]),
    ("blob-file-corrupt", run(lambda w: w.tar("bf.tar", {**w.members("vta"), **{
        n: d[:-1] + bytes([d[-1] ^ 1]) for n, d in w.members("vta").items()
        if n.startswith("blobs/")}})),
     ["bf.tar", "blobs/"]),
    # raised inside the VM call (the runtime's blob check), back through TVM's FFI
    ("vta-blob-corrupt-resigned", run(lambda w: w.edited(
        "vta", "vbr.tar", mod_so=_corrupt_blob, resign=True)),
     ["vbr.tar", "checksum mismatch", RECOMPILE]),
    ("mars-blob-corrupt-resigned", run(lambda w: w.edited(
        "marsellus", "mbr.tar", mod_so=_corrupt_blob, resign=True)),
     ["mbr.tar", "checksum mismatch"]),
    # inputs and run flags
    ("inputs-missing", run(vta, "--inputs", "/nonexistent/in.npz"), ["in.npz"]),
    ("inputs-npy", lambda w: ["run", vta(w), "--inputs", _save_npy(w.root / "x.npy")],
     ["x.npy", ".npz"]),
    ("inputs-object-npz", lambda w: ["run", vta(w), "--inputs", w.npz(
        "o.npz", input=np.array([{}, None], dtype=object))], ["o.npz", "pickle"]),
    ("inputs-string-npz", lambda w: ["run", vta(w), "--inputs", w.npz(
        "s.npz", input=np.full((1, 16, 8, 8), "ab"))], ["s.npz", "dtype <U2"]),
    ("inputs-complex", lambda w: ["run", vta(w), "--inputs", w.npz(
        "c.npz", input=np.zeros((1, 16, 8, 8), complex))], ["c.npz", "complex128"]),
    ("inputs-nan", lambda w: ["run", vta(w), "--inputs", w.npz(
        "nan.npz", input=np.full((1, 16, 8, 8), np.nan, np.float32))], ["nan.npz", "NaN"]),
    ("inputs-wrong-shape", lambda w: ["run", vta(w), "--inputs", w.npz(
        "sh.npz", input=np.zeros((1, 16, 4, 4), np.float32))], ["sh.npz", "[1, 16, 8, 8]"]),
    ("inputs-wrong-name", lambda w: ["run", vta(w), "--inputs", w.npz(
        "nm.npz", data=np.zeros((1, 16, 8, 8), np.float32))], ["nm.npz", "'input'", "data"]),
    ("inputs-garbage", lambda w: ["run", vta(w), "--inputs", w.file("j.npz", b"junk")],
     ["j.npz", "not a .npz"]),
    ("inputs-truncated-npz", lambda w: ["run", vta(w), "--inputs", w.file("tr.npz", Path(w.npz(
        "full.npz", input=np.zeros((1, 16, 8, 8), np.float32))).read_bytes()[:300])],
     ["tr.npz", "cannot read inputs"]),
    ("repeat-zero", run(vta, "--print-time", "--repeat", "0"), ["--repeat 0"]),
    ("repeat-negative", run(vta, "--repeat", "-3"), ["--repeat -3"]),
    ("repeat-not-int", run(vta, "--repeat", "x"), ["--repeat"]),
    ("fill-mode-choice", run(vta, "--fill-mode", "nan"), ["--fill-mode"]),
    ("outputs-dir-missing", run(vta, "--outputs", "/nonexistent/o.npz"), ["o.npz"]),
    ("trace-dir-missing", run(vta, "--trace", "/nonexistent/t.json"), ["t.json"]),
    ("disassemble-truncated", lambda w: ["disassemble", w.file(
        "dt.tar", Path(vta(w)).read_bytes()[:3000])], ["dt.tar"]),
    # conventions (item 7): input shapes, host target strings, timeline and zoo verbs
    ("input-shapes-syntax", compile_("vta", "--input-shapes", "input=1,16,8,8"),
     ["--input-shapes", "name:[d0,d1,...]"]),
    ("input-shapes-zero-dim", compile_("vta", "--input-shapes", "input:[0,16,8,8]"),
     ["--input-shapes", "positive"]),
    ("input-shapes-unknown-input", compile_("vta", "--input-shapes", "image:[1,16,8,8]"),
     ["unknown input", "image", "input"]),
    ("input-shapes-wrong-rank", compile_("vta", "--input-shapes", "input:[1,16,8]"),
     ["input 'input'", "does not match"]),
    ("input-shapes-fixed-dim", compile_("vta", "--input-shapes", "input:[1,3,8,8]"),
     ["[1, 16, 8, 8]", "[1, 3, 8, 8]"]),
    ("host-unknown-option", lambda w: ["compile", w.model("vta"), "--target",
                                       "vta, llvm -bogus=1", "-o", w.out], ["bogus"]),
    ("host-option-not-key-value", lambda w: ["compile", w.model("vta"), "--target",
                                             "vta, llvm mcpu", "-o", w.out], ["-key=value"]),
    ("host-unknown-kind", lambda w: ["compile", w.model("vta"), "--target", "vta, cuda",
                                     "-o", w.out], ["host", "cuda"]),
    ("timeline-missing-package", lambda w: ["timeline", str(w.root / "none.tar")],
     ["none.tar"]),
    ("timeline-output-dir-missing", lambda w: ["timeline", vta(w), "-o", "/nonexistent/t.png"],
     ["t.png"]),
    ("zoo-unknown-model", lambda w: ["zoo", "resnet21"], ["resnet21", "resnet20"]),
    ("zoo-fixed-input-size", lambda w: ["zoo", "resnet20", "--hw", "64", "-o",
                                        str(w.root / "r.onnx")], ["--hw"]),
]


@pytest.mark.parametrize("argv, needles", [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_user_error_is_one_line_with_exit_code_2(ws, capsys, argv, needles):
    args = argv(ws)
    rc = _tvmc(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"tvmc {args[0]}: error: "), err[0]
    for word in needles:
        assert word in err[0], (word, err[0])


@pytest.mark.parametrize("target, field, word", [
    ("dpu", "PM_BYTES", "PM"), ("marsellus", "L1_BYTES", "L1"), ("marsellus", "L2_BYTES", "L2"),
])
def test_layers_that_do_not_fit_a_small_config_fall_back_to_the_cpu(ws, capsys, target, field,
                                                                     word):
    """A valid config too small for a layer: the compile succeeds and the layer runs on the CPU
    with the target's reason in --dump-offloads, never a failed compile."""
    argv = config(target, f"small_{field}.json", **{field: 1024})(ws) + ["--dump-offloads",
                                                                        "--wide"]
    assert _tvmc(argv) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.split()[:1] == ["conv"]]
    assert rows and "cpu" in rows[0] and word in rows[0], out
    assert _tvmc(["run", argv[argv.index("-o") + 1]]) == 0


def test_truncated_mod_so_is_one_line_in_a_fresh_process(ws):
    """dlopen of a truncated mod.so dies with SIGBUS; the package check refuses it first."""
    pkg = ws.edited("vta", "half.tar", mod_so=lambda s, m: s[:len(s) // 2])
    p = subprocess.run([sys.executable, "-m", "tvm_accel.cli", "run", pkg],
                       capture_output=True, text=True, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert "half.tar" in err[0] and "mod.so" in err[0] and "truncated" in err[0]


def test_verbose_adds_the_traceback_of_an_error_raised_inside_a_pass(ws, capsys):
    prec = ws.file("pv.json", '{"layers": {"nope": {"w": 4}}}')
    assert _tvmc(["-v", *compile_("vta", "--precision-config", prec)(ws)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("Traceback") and len(err) > 5
    assert err[-1].startswith("tvmc compile: error: ") and "layers.nope" in err[-1]
    assert _tvmc([*compile_("vta", "--precision-config", prec)(ws), "-v"]) == 2
    assert capsys.readouterr().err.startswith("Traceback")


def test_a_bug_is_one_internal_error_line_with_exit_code_1(monkeypatch, capsys, tmp_path):
    def boom(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli.disassembler, "cmd_disassemble", boom)
    assert _tvmc(["disassemble", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tvmc disassemble: internal error: KeyError")
    assert "-v" in err[0]


@pytest.mark.parametrize("cc", [None, "/nonexistent/g++"], ids=["none_on_PATH", "CXX_missing"])
def test_compile_without_a_compiler_to_link_mod_so_is_one_line(ws, monkeypatch, capsys, tmp_path,
                                                                cc):
    for var in ("CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    if cc:
        monkeypatch.setenv("CXX", cc)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, gcc, clang, cc
    out = tmp_path / "m.tar"
    assert _tvmc(["compile", ws.model("vta"), "--target", "vta, llvm", "-o",
                  str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "C/C++ compiler is needed to link the package's mod.so" in err[0]
    assert (cc or "none of g++") in err[0] and not out.exists()


def test_project_errors_cross_the_ffi_as_themselves():
    """A packed function (what a pass or the VM calls) raising an AccelError subclass, even one
    defined after import, is re-raised on the Python side as that class with its message."""
    import tvm_ffi

    class LateError(ConfigError):
        pass

    for cls in (BlobError, ConfigError, LateError, AccelError):
        def raiser(cls=cls):
            raise cls(f"{cls.__name__}: one line")

        f = tvm_ffi.convert(raiser)
        with pytest.raises(cls, match=f"^{cls.__name__}: one line$") as e:
            f()
        assert type(e.value) is cls


def test_package_records_checksums_of_mod_so_and_blobs(ws):
    members = ws.members("dpu")
    meta = json.loads(members["metadata.json"])
    assert meta["digest"] == metadata_digest(meta)
    assert set(meta["files"]) == {n for n in members if n != "metadata.json"}
    assert "mod.so" in meta["files"] and any(n.startswith("blobs/") for n in meta["files"])
    for name, rec in meta["files"].items():
        assert rec == file_record(members[name])
