"""What a new user trips over (issue 27): input that was silently accepted with another meaning
is now an error or a one-line warning, and feedback names the cause and its fix.

One row per case: the ``tvmc`` command line, its exit code and what its output must (or must
not) hold. A user error is one stderr line ``tvmc <verb>: error: ...``; a warning is one
``tvmc <verb>: warning: ...`` line (never Python's two-line warning format).
"""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from helpers import models
from helpers.cli import tvmc
from tvm_accel.package import file_record, metadata_digest

SHAPE = (1, 16, 8, 8)  # the input of the single conv packages


class Workspace:
    """Models, packages and tuning records built once for the module."""

    def __init__(self, root: Path):
        self.root = root
        self.out = str(root / "out.tar")
        self.nodir = root / "nodir"  # never created: an output under it is refused

    def path(self, name: str) -> str:
        return str(self.root / name)

    def npz(self, name: str, **arrays) -> str:
        np.savez(self.root / name, **arrays)
        return self.path(name)

    def file(self, name: str, text: str) -> str:
        (self.root / name).write_text(text)
        return self.path(name)

    def resigned(self, name: str, edit) -> str:
        """A copy of vta.tar whose metadata.json is passed through ``edit``, checksums and
        digest recomputed: consistent, but no longer what mod.so computes."""
        import io
        import tarfile

        with tarfile.open(self.path("vta.tar")) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        meta = edit(json.loads(members["metadata.json"]))
        meta["files"] = {n: file_record(d) for n, d in members.items() if n != "metadata.json"}
        meta["digest"] = metadata_digest(meta)
        members["metadata.json"] = json.dumps(meta).encode()
        with tarfile.open(self.path(name), "w") as tar:
            for n, data in members.items():
                info = tarfile.TarInfo(n)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return self.path(name)


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    w = Workspace(tmp_path_factory.mktemp("cli_pitfalls"))
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), w.path("conv.onnx"))
    onnx.save(models.quantized("conv_residual", c=16, hw=8), w.path("residual.onnx"))
    onnx.save(models.conv_residual(c=16, hw=8), w.path("float.onnx"))
    onnx.save(models.quantized("conv_pool", kind="gap"), w.path("gap.onnx"))
    assert tvmc("compile", w.path("conv.onnx"), "--target", "vta, llvm", "-o",
                w.path("vta.tar")) == 0
    assert tvmc("tune", w.path("conv.onnx"), "--target", "vta, llvm", "-o",
                w.path("records.json"), "--tuner", "gridsearch", "--trials", "2",
                "--parallel", "1") == 0
    return w


def run(*flags):
    return lambda w: ["run", w.path("vta.tar"), *flags]


def compile_(*flags, model: str = "conv.onnx", target: str = "vta, llvm"):
    return lambda w: ["compile", w.path(model), "--target", target, "-o", w.out, *flags]


def inputs(**arrays):
    return lambda w: w.npz("in.npz", **arrays)


RNG = np.random.default_rng(0)
FLOAT64 = RNG.uniform(-1, 1, SHAPE)

#: (id, argv maker, exit code, {"err"/"out": words each in one line, "last": words of the
#: last stdout line, "not": words in no output line})
CASES = [
    # --- silently accepted -----------------------------------------------------------------
    ("inputs-float64-warns", lambda w: run("--inputs", inputs(input=FLOAT64)(w))(w), 0,
     {"err": ["tvmc run: warning:", "input 'input'", "float64", "float32"]}),
    ("inputs-int64-exact-is-quiet", lambda w: run("--inputs", inputs(
        input=np.ones(SHAPE, np.int64))(w))(w), 0, {"not": ["warning"]}),
    ("inputs-int64-wrapped-warns", lambda w: ["run", w.resigned("i8.tar", lambda m: {
        **m, "inputs": [{**m["inputs"][0], "dtype": "int8"}]}), "--inputs", inputs(
        input=np.full(SHAPE, 300, np.int64))(w)], 2,
     {"err": ["warning:", "int64", "int8", "changes 1024 of 1024"]}),
    ("inputs-unknown-name-with-fill-mode", lambda w: run("--inputs", inputs(
        image=FLOAT64.astype(np.float32))(w), "--fill-mode", "random")(w), 2,
     {"err": ["tvmc run: error:", "'image'", "inputs: 'input'"]}),
    ("fill-mode-fills-inputs-absent-from-the-file", lambda w: run(
        "--inputs", inputs()(w), "--fill-mode", "zeros")(w), 0, {"out": ["first values"]}),
    ("without-fill-mode-an-absent-input-is-an-error", lambda w: run(
        "--inputs", inputs()(w))(w), 2, {"err": ["no array named 'input'", "--fill-mode"]}),
    ("fill-mode-help-says-what-it-fills", lambda w: ["run", "--help"], 0,
     {"out": ["absent from --inputs"]}),
    ("host-unknown-mcpu", compile_(target="vta, llvm -mcpu=notacpu"), 2,
     {"err": ["tvmc compile: error:", "LLVM", "no CPU 'notacpu'"]}),
    ("host-misspelt-mcpu", compile_(target="vta, llvm -mcpu=skylak"), 2,
     {"err": ["no CPU 'skylak'", "nearest: skylake"]}),
    ("tune-output-dir-missing", lambda w: ["tune", w.path("conv.onnx"), "--target",
                                           "vta, llvm", "-o", str(w.nodir / "rec.json")], 2,
     {"err": ["tvmc tune: error: -o", "does not exist"]}),
    ("run-outputs-dir-missing", run("--outputs", "/nonexistent_dir/o.npz"), 2,
     {"err": ["--outputs", "does not exist"]}),
    ("run-profile-csv-dir-missing", lambda w: run("--profile-csv",
                                                  str(w.nodir / "p.csv"))(w), 2,
     {"err": ["--profile-csv", "does not exist"], "not": ["per-layer profile written"]}),
    ("run-trace-is-a-directory", lambda w: run("--trace", str(w.root))(w), 2,
     {"err": ["--trace", "is a directory"]}),
    ("dump-offloads-dir-slash", lambda w: compile_("--dump-offloads",
                                                   str(w.nodir) + "/")(w), 2,
     {"err": ["--dump-offloads", "is a directory"], "not": ["compiled"]}),
    ("disassemble-unknown-layer", lambda w: ["disassemble", w.path("vta.tar"), "--layer",
                                             "cnv"], 2,
     {"err": ["tvmc disassemble: error: --layer cnv", "nearest: conv"]}),
    ("metadata-output-shape-edited", lambda w: ["run", w.resigned("o.tar", lambda m: {
        **m, "outputs": [{**m["outputs"][0], "shape": [1, 16, 4, 4]}]})], 2,
     {"err": ["o.tar", "mod.so returns output", "[1, 16, 4, 4]", "recompile"]}),
    # --- feedback that was missing or misleading -------------------------------------------
    ("dpu-non-power-of-two-names-the-fix", compile_(model="residual.onnx",
                                                    target="dpu, llvm"), 0,
     {"out": ["note: 2 of the 2 layer(s) on the cpu", "not a power of two",
              "tvmc quantize --scheme power-of-two"]}),
    ("tune-float-model-points-to-quantize", lambda w: [
        "tune", w.path("float.onnx"), "--target", "vta, llvm", "-o", w.path("f.json")], 0,
     {"out": ["no tunable layers"], "last": ["not quantized", "tvmc quantize"]}),
    ("records-of-another-config-one-line-warning", compile_(
        "--target-vta-config", "vta_8x8x8", "--tuning-records", "records.json"), 0,
     {"err": ["tvmc compile: warning:", "vta_8x8x8", "not applied"],
      "not": ["UserWarning", "RecordWarning", "warnings.warn"]}),
    ("precision-unknown-layer-nearest", compile_("--precision-config", "cnv.json",
                                                 model="residual.onnx"), 2,
     {"err": ["layers.cnv", "nearest: conv, add"], "not": ["QuantizeLinear"]}),
    ("marsellus-freq-negative", compile_("--target-marsellus-freq", "-100",
                                         target="marsellus, llvm"), 2,
     {"err": ["--target-marsellus-freq -100", "must be a positive"],
      "not": ["above the maximum"]}),
    ("marsellus-freq-too-high", compile_("--target-marsellus-freq", "500",
                                         target="marsellus, llvm"), 2,
     {"err": ["--target-marsellus-freq 500", "above the maximum of 420 MHz"],
      "not": ["not positive"]}),
    ("vta-top-k-zero-names-the-flag", compile_("--target-vta-top-k", "0"), 2,
     {"err": ["--target-vta-top-k 0"], "not": ["top_k", "time_limit"]}),
    ("no-verb-lists-the-verbs", lambda w: [], 2,
     {"err": ["tvmc: error:", "compile", "run", "disassemble"], "not": ["required: verb"]}),
    ("unknown-flag-points-to-the-verb-help", compile_("--bogus"), 2,
     {"err": ["--bogus", "tvmc compile --help"]}),
    ("tuning-records-header-counts-the-records", compile_("--tuning-records",
                                                          "records.json"), 0,
     {"out": ["tuning records: 1 layer(s) from", "records.json"], "not": ["knobs {}"]}),
    # --- reports ---------------------------------------------------------------------------
    ("global-average-pool-keeps-its-name-on-vta", compile_("--dump-offloads", "--wide",
                                                           model="gap.onnx"), 0,
     {"out": ["gap", "global_avg_pool2d", "matched vta.globalavgpool"],
      "not": ["pattern for sum"]}),
    ("dump-offloads-defines-its-columns", compile_("--dump-offloads"), 0,
     {"out": ["scale err: largest relative error", "vs its float scale"]}),
    ("profile-summary-is-the-last-line", run("--profile"), 0, {"last": ["summary: {"]}),
    ("profile-names-util-peak-and-clock", run("--profile"), 0,
     {"out": ["us: time, cycles at the engine's clock", "vta at 333 MHz"]}),
]


def _argv(w: Workspace, make) -> list[str]:
    """``make(w)`` with a bare file name of the workspace (records.json, cnv.json) as a path."""
    w.file("cnv.json", '{"layers": {"cnv": {"w": 4}}}')
    return [w.path(a) if a in ("records.json", "cnv.json") else a for a in make(w)]


@pytest.mark.parametrize("make, code, expect", [pytest.param(m, c, e, id=i)
                                                for i, m, c, e in CASES])
def test_pitfall_is_an_error_a_warning_or_a_note(ws, capsys, make, code, expect):
    argv = _argv(ws, make)
    rc = tvmc(*argv)
    out, err = capsys.readouterr()
    assert rc == code, (out, err)
    err_lines, out_lines = err.strip().splitlines(), out.strip().splitlines()
    if code == 2:
        errors = [ln for ln in err_lines if ": error: " in ln]
        assert len(errors) == 1, err
    for stream, lines in (("err", err_lines), ("out", out_lines)):
        if stream in expect:
            assert any(all(w in ln for w in expect[stream]) for ln in lines), (expect, lines)
    if "last" in expect:
        assert all(w in out_lines[-1] for w in expect["last"]), out_lines[-1:]
    for word in expect.get("not", []):
        assert word not in out + err, (word, out, err)
    assert not ws.nodir.exists()  # refused outputs create nothing


@pytest.mark.parametrize("limit", [3, 12])
def test_disassemble_limit_bounds_the_whole_listing(ws, capsys, limit):
    assert tvmc("disassemble", ws.path("vta.tar")) == 0
    full = capsys.readouterr().out.strip().splitlines()
    assert len(full) > 12
    assert tvmc("disassemble", ws.path("vta.tar"), "--limit", limit) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:limit] == full[:limit] and len(lines) == limit + 1
    assert lines[-1] == f"; ... {len(full) - limit} more lines (--limit {limit})"


def test_compile_progress_lines_carry_their_total_from_the_first(ws, capsys, monkeypatch):
    from tvm_accel.cli import compiler

    monkeypatch.setattr(compiler._ProgressLines, "AFTER", 0.0)
    onnx.save(models.quantized("aspp_head", c=16, hw=8), ws.path("aspp.onnx"))  # 5 convs
    assert tvmc("compile", ws.path("aspp.onnx"), "--target", "vta, llvm", "-o", ws.out) == 0
    steps = [ln.split("]")[0].strip(" [") for ln in capsys.readouterr().err.splitlines()
             if ln.startswith("  [embedding")]
    assert len(steps) > 1 and all(s.endswith(f"/{len(steps)}") for s in steps), steps


def test_timeline_drops_idle_units_and_tells_rbe_from_dma():
    from matplotlib.colors import rgb_to_hsv, to_rgb

    from tvm_accel.timeline import kind_colors, lanes

    units = ["IODMA", "DMA_IN", "DMA_OUT", "RBE", "CLUSTER"]
    names = {(1, tid): name for tid, name in enumerate(units)}
    xs = [{"name": "DMA", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0},
          {"name": "RBE", "pid": 1, "tid": 3, "ts": 1.0, "dur": 2.0},
          {"name": "DMA", "pid": 1, "tid": 1, "ts": 3.0, "dur": 1.0}]
    assert [names[k] for k in lanes(xs, names)] == ["DMA_IN", "RBE"]
    hue = {k: rgb_to_hsv(to_rgb(c))[0] for k, c in kind_colors(["DMA", "RBE"]).items()
           if k in ("DMA", "RBE")}
    assert abs(hue["DMA"] - hue["RBE"]) > 0.1, hue
