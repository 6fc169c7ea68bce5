"""tvmc with --target "dpu, llvm": compile, run with --profile/--trace, disassemble."""

import json

from helpers import models
from tvm_accel.cli import main


def test_tvmc_compile_run_profile_trace_and_disassemble(tmp_path, capsys):
    import onnx

    model = tmp_path / "block.onnx"
    onnx.save(models.quantized("conv_residual", power_of_two=True, c=16, hw=8, batch=2), model)
    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", "dpu, llvm", "--target-dpu-config",
                 "dpu_default", "-o", str(pkg), "--dump-offloads"]) == 0
    out = capsys.readouterr().out
    assert "on dpu" in out and "dpu.qconv2d" in out
    trace = tmp_path / "t.json"
    assert main(["run", str(pkg), "--profile", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "dpu" in out and "conv2d" in out and ("compute bound" in out or "off-chip bound" in out)
    assert json.loads(trace.read_text())
    assert main(["disassemble", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert "CONV DPON=LOAD" in out or "LOAD DPON=- DPBY=CONV" in out
