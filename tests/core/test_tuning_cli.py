"""`tvmc tune` then `tvmc compile --tuning-records`, end to end for each target: records are
written as measured, a second run resumes without measuring, the compile applies exactly the
best recorded configuration per layer and stays bit-exact, and bad input is one error line."""

import json

import numpy as np
import onnx
import pytest

from helpers import models
from tvm_accel.cli import main

MODELS = {
    "vta": lambda: models.quantized("conv_residual", c=16, hw=8),
    "dpu": lambda: models.quantized("conv_residual", power_of_two=True, c=16, hw=8, batch=2),
    "marsellus": lambda: models.quantized("conv_residual", c=32, hw=8),
}


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("target", list(MODELS))
def test_tune_then_compile_with_records_is_bit_exact_and_uses_the_best(tmp_path, capsys,
                                                                        compare_on, target):
    from tvm_accel.tuning.records import ApplyHistoryBest, load_records, pick_best

    model = tmp_path / "m.onnx"
    onnx.save(MODELS[target](), str(model))
    records = tmp_path / "r.json"
    argv = ["tune", str(model), "--target", f"{target}, llvm", "-o", str(records),
            "--tuner", "random", "--trials", "4", "--parallel", "2", "--timeout", "60"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "default cycles" in out and "tuned cycles" in out
    assert ("tuned uJ" in out) == (target == "marsellus")  # energy only where it is modelled
    lines = _lines(records)
    assert lines and all(r["version"] == 0.2 and len(r["input"]) == 4 for r in lines)
    energies = [r["measure"]["energy_uj"] for r in lines if r["result"][1] == 0]
    assert energies and all((e is not None and e > 0) == (target == "marsellus")
                            for e in energies)
    assert main(argv) == 0  # resumed: every point is already measured
    assert len(_lines(records)) == len(lines)

    best = pick_best(load_records(str(records)))
    with ApplyHistoryBest(str(records)) as ctx:
        r = compare_on(target)(MODELS[target]())
    r.assert_bit_exact()
    tuned = {ly: cfg for f in r.report.functions for ly, cfg in f.tuned.items()}
    assert tuned and set(tuned) <= {ly for e in ctx.used.values() for ly in e.layers}
    recorded = {tuple(sorted(e.config.items())) for e in best.values()}
    assert all(tuple(sorted(c.items())) in recorded for c in tuned.values())

    pkg = tmp_path / "m.tar"
    assert main(["compile", str(model), "--target", f"{target}, llvm", "-o", str(pkg),
                 "--tuning-records", str(records), "--dump-offloads"]) == 0
    assert "record" in capsys.readouterr().out


def test_records_of_another_config_are_not_applied(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    records = tmp_path / "r.json"
    assert main(["tune", str(model), "--target", "vta, llvm", "-o", str(records),
                 "--tuner", "gridsearch", "--trials", "2", "--parallel", "1"]) == 0
    capsys.readouterr()
    assert main(["compile", str(model), "--target", "vta, llvm", "--target-vta-config",
                 "vta_8x8x8", "-o", str(tmp_path / "m.tar"), "--tuning-records",
                 str(records), "--dump-offloads"]) == 0
    out, err = capsys.readouterr()
    assert "tuning records: 0 layer(s)" in out
    assert "record" not in out.split("knobs", 1)[1]
    assert any(ln.startswith("tvmc compile: warning:") and "vta_8x8x8" in ln
               for ln in err.splitlines()), err


@pytest.mark.parametrize("flags, needle", [
    (["--trials", "0"], "--trials"),
    (["--tuner", "annealing"], "--tuner"),
    (["--timeout", "0"], "--timeout"),
])
def test_bad_tune_flags_are_one_error_line(tmp_path, capsys, flags, needle):
    model = tmp_path / "m.onnx"
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    rc = main(["tune", str(model), "--target", "vta, llvm", "-o", str(tmp_path / "r.json"),
               *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0]


def test_records_file_that_is_not_json_lines_is_one_error_line(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), str(model))
    bad = tmp_path / "bad.json"
    bad.write_text("layer,cycles\nconv,12\n")
    rc = main(["compile", str(model), "--target", "vta, llvm", "-o", str(tmp_path / "m.tar"),
               "--tuning-records", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.json" in err[0]


def test_extracted_tasks_merge_identical_workloads():
    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx
    from tvm_accel.tuning.extract import extract_tasks

    mod, _ = load_onnx(models.quantized("resnet20"))
    tasks = extract_tasks(mod, tvm_vta_cp.TARGET, "vta_1x16x16")
    assert len({t.key for t in tasks}) == len(tasks)
    assert sum(t.weight for t in tasks) == sum(len(t.layers) for t in tasks) == 21 + 9 + 1
    assert any(t.weight > 1 for t in tasks)
    default = tasks[0].space.default()
    cycles, seconds, _ = tasks[0].measure(tasks[0].context, default)
    assert cycles > 0 and np.isclose(seconds, cycles / 333e6)
