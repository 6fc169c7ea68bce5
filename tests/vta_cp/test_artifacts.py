"""Compiled artifacts: ResNet-18 exported and run in a fresh process, CLI round trip, and
corrupt or mismatched blobs rejected with a clear error."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import models
from helpers.cli import table_rows
from tvm_accel.blob import Blob, pack_blob, unpack_blob
from tvm_accel.errors import BlobError, SimulatorError
from tvm_accel.package import PackageMetadata, TensorSpec, save_package


def _compile(model, config="vta_1x16x16"):
    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model

    mod, info = load_onnx(model)
    ex, report = compile_model(mod, tvm_vta_cp.TARGET, config)
    return ex, report, list(random_inputs(info, seed=1).values())


def test_resnet18_exports_and_runs_identically_in_a_fresh_process(tmp_path, compare):
    model = models.quantized("resnet18")
    r = compare(model, "vta_1x16x16")
    r.assert_bit_exact()
    assert len([o for o in r.offloaded if o.op == "conv2d"]) == 20
    pkg = tmp_path / "resnet18.tar"
    save_package(str(pkg), r.ex, PackageMetadata("vta", "llvm", "vta_1x16x16",
                                                 [TensorSpec("x", list(r.inputs[0].shape),
                                                             "float32")], []))
    np.save(tmp_path / "x.npy", r.inputs[0])
    script = textwrap.dedent(f"""
        import numpy as np, tvm
        from tvm_accel.package import load_package, outputs_to_numpy
        pkg = load_package({str(pkg)!r})
        x = tvm.runtime.tensor(np.load({str(tmp_path / "x.npy")!r}))
        np.save({str(tmp_path / "y.npy")!r}, outputs_to_numpy(pkg.vm()["main"](x))[0])
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), r.outputs[0])


def _vta_blob():
    ex, report, inputs = _compile(models.quantized("single_conv", cin=16, cout=16, k=3, pad=1,
                                                hw=8))
    (fn,) = report.functions
    return fn.blob, fn.graph


def _run_blob(blob, graph):
    from tvm_vta_cp.runtime import run_blob

    x = np.zeros(graph.tensors[graph.inputs[0]].shape, graph.tensors[graph.inputs[0]].dtype)
    return run_blob(np.frombuffer(blob, dtype=np.uint8), [x])


def test_corrupt_blobs_give_clear_errors():
    blob, graph = _vta_blob()
    _run_blob(blob, graph)
    with pytest.raises(BlobError, match="truncated|checksum"):
        _run_blob(blob[: len(blob) // 2], graph)
    with pytest.raises(BlobError, match="magic"):
        _run_blob(b"XXXXXXXX" + blob[8:], graph)


def test_out_of_range_address_in_an_instruction_is_a_simulator_error():
    from tvm_vta_cp.codegen import ISA, MemInsn, load_blob

    blob, graph = _vta_blob()
    b = unpack_blob(blob)
    program, cfg, _ = load_blob(blob)
    isa = ISA(cfg)
    insns = isa.decode_stream(b.sections["INSN"])
    idx = next(i for i, ins in enumerate(insns) if isinstance(ins, MemInsn) and ins.x_size)
    insns[idx].dram_base = (1 << 32) - 1
    b.sections["INSN"] = isa.encode_stream(insns)
    with pytest.raises(SimulatorError, match="DRAM"):
        _run_blob(pack_blob(Blob(b.target, b.fingerprint, b.sections)), graph)


def test_blob_for_another_config_is_rejected_by_fingerprint():
    from tvm_vta_cp.codegen import load_blob
    from tvm_vta_cp.hw_config import load_config

    blob, _ = _vta_blob()
    with pytest.raises(BlobError, match="another hardware config"):
        load_blob(blob, expect_config=load_config("vta_8x8x8"))


def test_cli_compile_run_and_disassemble_round_trip(tmp_path):
    from tvm_accel.cli import main

    model = tmp_path / "m.onnx"
    import onnx

    onnx.save(models.quantized("conv_residual", c=16, hw=8), str(model))
    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", "vta, llvm", "-o", str(pkg),
                 "--dump-offloads"]) == 0
    out = tmp_path / "y.npz"
    trace = tmp_path / "t.json"
    assert main(["run", str(pkg), "--fill-mode", "random", "--outputs", str(out), "--profile",
                 "--trace", str(trace)]) == 0
    assert np.load(out).files
    import json

    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("GEMM") for e in events)
    assert main(["disassemble", str(pkg), "--limit", "5"]) == 0


def _host_rows(out: str) -> list[list[str]]:
    """The rows of the profile's host-pass table (before its TOTAL)."""
    lines = out[out.index("host passes"):].replace(",", "").splitlines()[3:]
    return [r.split() for r in lines[:lines.index(next(r for r in lines
                                                        if r.startswith("TOTAL")))]]


def test_profile_prices_host_gathers_and_copies_at_their_own_rates(tmp_path, capsys):
    from tvm_accel.cli import main
    from tvm_vta_cp.hw_config import load_config

    model = tmp_path / "m.onnx"
    import onnx

    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", "vta, llvm", "-o", str(pkg),
                 "--target-vta-config", "vta_8x8x8", "--dump-offloads"]) == 0
    assert "pack" in capsys.readouterr().out  # batch 1 on BATCH=8: auto picks an image pack
    assert main(["run", str(pkg), "--fill-mode", "random", "--profile"]) == 0
    out = capsys.readouterr().out
    rows = {r[1]: r for r in _host_rows(out)}
    assert set(rows) == {"pack", "unpack"}
    cfg = load_config("vta_8x8x8")
    rate = {"gather": cfg.HOST_GATHER_BYTES_PER_CYCLE, "copy": cfg.HOST_COPY_BYTES_PER_CYCLE}
    assert rows["pack"][2] == "gather" and rows["unpack"][2] == "copy"
    for _, _, kind, nbytes, cycles, measured in rows.values():
        assert int(nbytes) > 0 and float(measured) > 0
        assert float(cycles) == pytest.approx(int(nbytes) / rate[kind], abs=0.5)
        assert float(cycles) != int(nbytes)


def test_profile_total_is_accelerator_plus_host_cycles(tmp_path, capsys):
    from tvm_accel.cli import main

    model = tmp_path / "m.onnx"
    import json

    import onnx

    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", "vta, llvm", "-o", str(pkg),
                 "--target-vta-strategy", "static"]) == 0
    assert main(["run", str(pkg), "--fill-mode", "random", "--profile"]) == 0
    raw = capsys.readouterr().out
    out = raw.replace(",", "")
    # the static template: the runtime blocks the input and unblocks the output
    assert sorted(r[1] for r in _host_rows(out)) == ["block", "unblock"]
    table = out[:out.index("host passes")].splitlines()
    head = next(r for r in table if r.startswith("layer "))
    col = [h.strip() for h in head.split("  ") if h.strip()].index("cycles")
    rows = table_rows("\n".join(table))
    acc, host, total = (int(rows[r][col]) for r in ("accelerator", "host (model)", "TOTAL"))
    assert acc > 0 and host > 0 and total == acc + host
    summary = json.loads(next(ln for ln in raw.splitlines()
                              if ln.startswith("summary: "))[len("summary: "):])
    assert summary["total_cycles"] == pytest.approx(summary["cycles"]
                                                    + summary["host_model_cycles"])


def test_unknown_config_is_one_error_line(tmp_path, capsys):
    from tvm_accel.cli import main

    model = tmp_path / "m.onnx"
    import onnx

    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    rc = main(["compile", str(model), "--target", "vta, llvm", "--target-vta-config",
               str(tmp_path / "missing.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "missing.json" in err[0]


def test_mutated_blobs_fail_with_clear_errors_and_never_crash():
    """Random byte mutations with a repaired checksum reach the META/INSN parsers and the
    simulator; every outcome is success or an AccelError (run in-process: a crash fails)."""
    import zlib

    from tvm_accel.errors import AccelError

    blob, graph = _vta_blob()
    rng = np.random.default_rng(7)
    outcomes = {"ok": 0, "error": 0}
    meta_at = blob.find(b'{"name"')
    for i in range(300):
        data = bytearray(blob)
        if i % 3 == 0:  # numbers inside the META JSON: offsets, sizes, shapes
            digits = [j for j in range(meta_at, meta_at + 2000) if 48 <= data[j] <= 57]
            for j in rng.choice(digits, size=3):
                data[j] = int(rng.integers(48, 58))
        else:
            for j in rng.integers(48, len(data), size=int(rng.integers(1, 8))):
                data[j] = int(rng.integers(0, 256))
        data[44:48] = zlib.crc32(bytes(data[48:])).to_bytes(4, "little")
        try:
            _run_blob(bytes(data), graph)
            outcomes["ok"] += 1
        except AccelError as e:
            assert str(e) and "\n" not in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 50
