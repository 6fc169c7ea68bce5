"""MARSELLUS tuning measurements report the simulated CLUSTER energy beside the cycles, and the
energy survives the worker round trip and the tuning records."""

import pytest

from helpers import models
from tvm_accel.frontend import load_onnx
from tvm_accel.tuning import MeasureInput, Measurer, measure_option
from tvm_accel.tuning.extract import extract_tasks
from tvm_accel.tuning.layer_tasks import run_layer
from tvm_accel.tuning.records import append_record, load_records, measured_pairs


@pytest.fixture(scope="module")
def tasks():
    import tvm_marsellus

    mod, _ = load_onnx(models.quantized("conv_residual", c=32, hw=8))
    return extract_tasks(mod, tvm_marsellus.TARGET, None)


def test_measurement_reports_the_runs_energy_at_the_nominal_point(tasks):
    from tvm_marsellus.energy import NOMINAL, energy_uj

    assert {t.name for t in tasks} >= {"marsellus.conv2d"}
    for task in tasks:
        config = task.space.default()
        cycles, seconds, energy = task.measure(task.context, config)
        _, stats = run_layer(task.context, config)
        assert cycles > 0 and seconds > 0
        assert energy == pytest.approx(sum(energy_uj(st, NOMINAL) for _, st in stats))
        assert energy > 0


def test_energy_flows_through_the_worker_and_round_trips_through_records(tasks, tmp_path):
    task = next(t for t in tasks if t.name == "marsellus.conv2d")
    configs = [task.space.point(i) for i in range(min(task.space.size, 4))]
    configs = [c for c in configs if task.space.is_valid(c)]
    inputs = [MeasureInput(task, c) for c in configs]
    with Measurer(measure_option(timeout=120, n_parallel=2)) as measurer:
        results = measurer.run(inputs)
    ok = [(i, r) for i, r in zip(inputs, results, strict=True) if r.ok]
    assert ok and all(r.energy_uj is not None and r.energy_uj > 0 for _, r in ok)
    assert ok[0][1].energy_uj == pytest.approx(task.measure(task.context, ok[0][0].config)[2])

    path = tmp_path / "records.json"
    for inp, res in ok:
        append_record(path, inp, res)
    entries = load_records(path)
    assert [e.energy_uj for e in entries] == [r.energy_uj for _, r in ok]
    resumed = measured_pairs(entries, task)
    assert [(r.cycles, r.energy_uj) for _, r in resumed] == [(r.cycles, r.energy_uj)
                                                            for _, r in ok]
