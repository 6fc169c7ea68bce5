"""tvmc with --target "marsellus, llvm" (operating point flags, --profile with energy,
disassemble), a package run in a fresh process, and blobs the runtime must reject."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import models
from tvm_accel.cli import main
from tvm_accel.errors import BlobError


def test_tvmc_compile_run_profile_and_disassemble(tmp_path, capsys):
    import onnx

    model = tmp_path / "block.onnx"
    onnx.save(models.quantized("conv_residual", c=32, hw=8), model)
    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", "marsellus, llvm",
                 "--target-marsellus-config", "marsellus_default", "--target-marsellus-vdd",
                 "0.65", "--target-marsellus-abb", "-o", str(pkg), "--dump-offloads"]) == 0
    out = capsys.readouterr().out
    assert "on marsellus" in out and "marsellus.qconv2d" in out
    csv_path = tmp_path / "profile.csv"
    assert main(["run", str(pkg), "--profile", "--profile-csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "energy at 0.65 V, 400 MHz with ABB" in out
    import csv
    import json

    rows = list(csv.DictReader(csv_path.open()))
    assert [r["layer"] for r in rows] == ["conv", "add"]
    assert all(float(r["energy_uj"]) > 0 and r["bound"].endswith(" bound") for r in rows)
    summary = json.loads(next(ln for ln in out.splitlines()
                              if ln.startswith("summary: "))[len("summary: "):])
    assert summary["layers"] == 2 and summary["cycles"] == sum(int(r["cycles"]) for r in rows)
    assert summary["energy_uj"] > 0 and sum(summary["bound"].values()) == 2
    assert "RBE" in out and "cluster" in out and "energy (uJ)" in out
    # Fig. 18's labels: every layer says what bounds it
    rows = [ln for ln in out.splitlines() if ln.startswith(("conv ", "add "))]
    assert len(rows) == 2 and all(ln.rstrip().endswith(("compute", "on-chip", "off-chip"))
                                  for ln in rows), out
    assert main(["disassemble", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert "RBE wait=" in out and "on rbe" in out
    assert main(["compile", str(model), "--target", "marsellus, llvm", "--target-marsellus-vdd",
                 "0.5", "--target-marsellus-freq", "300", "-o", str(pkg)]) == 2
    assert "above the maximum" in capsys.readouterr().err


def test_package_runs_identically_in_a_fresh_process(tmp_path, compare):
    from tvm_accel.package import PackageMetadata, TensorSpec, save_package

    r = compare(models.quantized("conv_pool", kind="max", c=32, hw=8))
    r.assert_bit_exact()
    pkg = tmp_path / "m.tar"
    save_package(str(pkg), r.ex, PackageMetadata("marsellus", "llvm", "marsellus_default",
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


def test_run_blob_rejects_wrong_inputs_and_corrupt_blobs():
    import tvm_marsellus
    from tvm_accel.blob import Blob, pack_blob, unpack_blob
    from tvm_accel.frontend import load_onnx
    from tvm_accel.pipeline import compile_model
    from tvm_marsellus.runtime import run_blob

    mod, _ = load_onnx(models.quantized("single_conv", cin=32, cout=32, k=3, pad=1, hw=6))
    _, report = compile_model(mod, tvm_marsellus.TARGET)
    (fn,) = report.functions
    blob = np.frombuffer(fn.blob, dtype=np.uint8)
    x = np.zeros(fn.graph.tensors[fn.graph.inputs[0]].shape, np.int8)
    (y,) = run_blob(blob, [x])
    assert y.dtype == np.int8 and y.shape == (1, 32, 6, 6)
    with pytest.raises(BlobError, match="expects"):
        run_blob(blob, [x.astype(np.uint8)])
    with pytest.raises(BlobError):
        run_blob(np.frombuffer(fn.blob[:-5], dtype=np.uint8), [x])
    b = unpack_blob(fn.blob)
    cmds = bytearray(b.sections["CMDS"])
    cmds[64 * 4] = 0x77  # an unknown opcode
    with pytest.raises(BlobError, match="CMDS"):
        tvm_marsellus.program.load_blob(pack_blob(Blob(b.target, b.fingerprint,
                                                       dict(b.sections, CMDS=bytes(cmds)))))
    with pytest.raises(BlobError):
        tvm_marsellus.program.load_blob(pack_blob(Blob("dpu", b.fingerprint, b.sections)))
    text = tvm_marsellus.TARGET.disassemble(fn.blob, limit=3)
    assert "marsellus function" in text and "more" in text
