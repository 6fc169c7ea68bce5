"""DPU package exported and run in a fresh process; runtime rejects mismatched inputs/blobs."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import BlobError
from tvm_accel.package import PackageMetadata, TensorSpec, save_package


def test_package_runs_identically_in_a_fresh_process(tmp_path, compare):
    r = compare(models.quantized("conv_residual", power_of_two=True, c=16, hw=8, batch=2))
    r.assert_bit_exact()
    pkg = tmp_path / "m.tar"
    save_package(str(pkg), r.ex, PackageMetadata("dpu", "llvm", "dpu_default",
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


def test_run_blob_rejects_wrong_inputs_and_foreign_blobs():
    import tvm_dpu
    from tvm_accel.frontend import load_onnx
    from tvm_accel.pipeline import compile_model
    from tvm_dpu.runtime import run_blob

    mod, _ = load_onnx(models.quantized("single_conv", power_of_two=True, cin=8, cout=8, k=3,
                                     pad=1, hw=6))
    _, report = compile_model(mod, tvm_dpu.TARGET)
    (fn,) = report.functions
    blob = np.frombuffer(fn.blob, dtype=np.uint8)
    x = np.zeros(fn.graph.tensors[fn.graph.inputs[0]].shape, np.int8)
    (y,) = run_blob(blob, [x])
    assert y.dtype == np.int8
    with pytest.raises(BlobError, match="expects"):
        run_blob(blob, [x.astype(np.uint8)])
    with pytest.raises(BlobError):
        run_blob(np.frombuffer(fn.blob[:-5], dtype=np.uint8), [x])
    from tvm_accel.blob import Blob, pack_blob, unpack_blob

    b = unpack_blob(fn.blob)
    with pytest.raises(BlobError):
        tvm_dpu.codegen.load_blob(pack_blob(Blob("vta", b.fingerprint, b.sections)))


def test_one_command_writes_a_model_trace_and_timeline_png(tmp_path, capsys):
    import json

    from tvm_dpu.timeline import main

    assert main(["resnet20", "-o", str(tmp_path / "r20")]) == 0
    assert "timeline written to" in capsys.readouterr().out
    events = json.loads((tmp_path / "r20.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert {e.get("name") for e in events} >= {"CONV", "SAVE"}
    assert (tmp_path / "r20.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["nosuchnet", "-o", str(tmp_path / "x")]) == 1
    assert "unknown model nosuchnet" in capsys.readouterr().out
