"""``tvmc sweep`` and ``tvmc compare-targets`` (tvm_accel.explore): a small grid with points
the hardware rules reject, resuming, the Pareto front, energy on MARSELLUS, and the bundled
model on every target."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import onnx
import pytest

from helpers.cli import tvmc
from helpers.models import conv_residual, quantized
from tvm_accel.explore.sweep import pareto_front

MODELS = Path(__file__).resolve().parents[2] / "python" / "tvm_accel" / "models"


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def vta_sweep(tmp_path_factory):
    """A 2 x 2 VTA grid (GEMM block in x out) over a conv + residual add: the two points with
    block in != block out break VTA's packing rule."""
    d = tmp_path_factory.mktemp("sweep")
    onnx.save(quantized("conv_residual"), d / "conv_residual.onnx")
    (d / "spec.json").write_text(json.dumps({
        "target": "vta", "base": "vta_8x8x8",
        "axes": {"LOG_BLOCK_IN": [3, 4], "LOG_BLOCK_OUT": [3, 4]}}))
    code = tvmc("sweep", d / "spec.json", d / "conv_residual.onnx", "-o", d / "out.csv", "-q")
    return d, code


def test_sweep_records_rejected_points_with_the_rule(vta_sweep):
    d, code = vta_sweep
    assert code == 0
    rows = _rows(d / "out.csv")
    assert [(r["point"], r["LOG_BLOCK_IN"], r["LOG_BLOCK_OUT"], r["status"]) for r in rows] == [
        ("0", "3", "3", "ok"), ("1", "3", "4", "invalid"), ("2", "4", "3", "invalid"),
        ("3", "4", "4", "ok")]
    for r in rows:
        if r["status"] == "invalid":
            assert r["reason"].startswith("field LOG_BLOCK_OUT: must equal LOG_BLOCK_IN")
            assert not r["cycles"]
        else:
            assert r["bit_exact"] == "true"
            assert int(r["cycles"]) > 0 and float(r["latency_us"]) > 0
            assert r["layers_offloaded"] == r["layers"] == "2"
            assert int(r["on_chip_bytes"]) == 2**15 + 2**15 + 2**18 + 2**17
    assert (d / "out.png").stat().st_size > 10_000


def test_sweep_resume_measures_only_missing_points(vta_sweep, capsys):
    d, _ = vta_sweep
    before = _rows(d / "out.csv")
    assert tvmc("sweep", d / "spec.json", d / "conv_residual.onnx", "-o", d / "out.csv",
                "-q") == 0
    assert "0 point(s) measured, 4 already in the CSV" in capsys.readouterr().out
    assert _rows(d / "out.csv") == before
    with open(d / "out.csv", "w", newline="") as f:  # lose point 3's row
        w = csv.DictWriter(f, fieldnames=list(before[0]))
        w.writeheader()
        w.writerows(before[:3])
    assert tvmc("sweep", d / "spec.json", d / "conv_residual.onnx", "-o", d / "out.csv",
                "-q") == 0
    assert "1 point(s) measured, 3 already in the CSV" in capsys.readouterr().out
    after = _rows(d / "out.csv")
    assert [r["point"] for r in after] == ["0", "1", "2", "3"]
    assert after[3]["cycles"] == before[3]["cycles"]
    # an edited axis: points 1 and 3 now stand for other configs (both rejected, no compile)
    (d / "spec.json").write_text(json.dumps({
        "target": "vta", "base": "vta_8x8x8",
        "axes": {"LOG_BLOCK_IN": [3, 4], "LOG_BLOCK_OUT": [3, 5]}}))
    assert tvmc("sweep", d / "spec.json", d / "conv_residual.onnx", "-o", d / "out.csv",
                "-q") == 0
    assert "2 point(s) measured, 2 already in the CSV" in capsys.readouterr().out
    assert [(r["LOG_BLOCK_OUT"], r["status"]) for r in _rows(d / "out.csv")] == [
        ("3", "ok"), ("5", "invalid"), ("3", "invalid"), ("5", "invalid")]


@pytest.mark.parametrize("axes, msg", [
    ({"BLOCK_SIZE": [8, 16]}, "axis 'BLOCK_SIZE' is neither a field of vta_1x16x16"),
    ({"model": [{"LOG_BATCH": 0}]}, "axis 'model' has the name of a CSV column")])
def test_sweep_refuses_an_axis_it_cannot_name(tmp_path, capsys, axes, msg):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"target": "vta", "axes": axes}))
    onnx.save(quantized("conv_residual"), tmp_path / "m.onnx")
    assert tvmc("sweep", spec, tmp_path / "m.onnx", "-o", tmp_path / "o.csv") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.slow
def test_sweep_operating_points_trade_energy_for_latency(tmp_path, capsys):
    """Two MARSELLUS operating points of a float model (quantized uint8 for the target): the
    lower voltage is slower and spends less energy, so both are on the front."""
    onnx.save(conv_residual(), tmp_path / "float.onnx")
    (tmp_path / "spec.json").write_text(json.dumps({
        "target": "marsellus", "axes": {"vdd": [0.8, 0.5]}}))
    assert tvmc("sweep", tmp_path / "spec.json", tmp_path / "float.onnx", "-o",
                tmp_path / "m.csv", "-q", "-j", "2") == 0
    out = capsys.readouterr().out
    fast, slow = _rows(tmp_path / "m.csv")
    assert fast["bit_exact"] == slow["bit_exact"] == "true"
    assert float(fast["latency_us"]) < float(slow["latency_us"])
    assert float(fast["energy_uj"]) > float(slow["energy_uj"])
    assert "float: Pareto front of latency vs energy: point(s) 0, 1" in out


def test_pareto_front_drops_dominated_points():
    def row(p, lat, e):
        return {"point": p, "model": "m", "status": "ok", "latency_us": lat, "energy_uj": e}

    front, objective = pareto_front([row("0", "1", "5"), row("1", "2", "6"), row("2", "3", "1"),
                                     {**row("3", "", ""), "status": "invalid"}])
    assert front == {("0", "m"), ("2", "m")} and objective == {"m": "energy"}


@pytest.mark.slow
def test_compare_targets_on_the_bundled_model(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert tvmc("compare-targets", MODELS / "tiny_cnn_int8.onnx", "--targets",
                "vta,vta:vta_8x8x8,dpu,marsellus", "--model-for",
                f"dpu={MODELS / 'tiny_cnn_pow2.onnx'}", "-o", png, "--wide") == 0
    out = capsys.readouterr().out
    summary = out[out.index(": summary"):].splitlines()[3:]
    assert [line.split()[0] for line in summary[:4]] == ["vta", "vta:vta_8x8x8", "dpu",
                                                         "marsellus"]
    for line in summary[:4]:
        assert " yes " in line  # bit-exact against the CPU reference
    assert "tiny_cnn_pow2.onnx" in summary[2]
    assert "uJ" in out.split(": summary")[0]  # MARSELLUS's energy column per layer
    assert png.stat().st_size > 10_000
