"""Tuning records: AutoTVM 0.2 JSON lines, resuming, pick-best and applying the best config."""

import dataclasses
import json
import warnings

import pytest

from tvm_accel.errors import AccelError
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.tuning.records import (
    FAILED_COST,
    ApplyHistoryBest,
    RecordWarning,
    append_record,
    compiler_version,
    current,
    decode,
    encode,
    load_records,
    log_to_file,
    measured_pairs,
    pick_best,
    pick_best_file,
)
from tvm_accel.tuning.task import MeasureError, MeasureInput, MeasureResult, Task

FP1 = "11" * 16
FP2 = "22" * 16


def _measure(context, config):
    return 100, 1e-7, None


def _space() -> KnobSpace:
    return KnobSpace([
        Knob("tile", (1, 2, 4, 8), 4),
        Knob("ratio", (0.5, 1 / 3, 2.0), 0.5),
        Knob("db", (False, True), True),
        Knob("order", ("nchw", "nhwc"), "nchw"),
        Knob("shape", ((1, 2), (2, 1), (4, (1, 2))), (1, 2)),
        Knob("lanes", (None, 1, 1.0), None),
    ], name="toy")


def _task(name="vta.conv2d", workload=("conv2d", (1, 16, 8, 8), "int8"), fp=FP1,
          config_name="vta_1x16x16") -> Task:
    return Task(name=name, target="vta", workload=workload, space=_space(), measure=_measure,
                layers=["conv1"], config_name=config_name, config_fingerprint=fp)


def _ok(cost: float, ts: float = 1700000000.5) -> MeasureResult:
    return MeasureResult(costs=(cost, cost * 1.5), cycles=int(cost * 1e9), energy_uj=0.25,
                         all_cost=0.75, timestamp=ts)


def _line(task, config, res) -> str:
    return encode(MeasureInput(task, config), res)


def _write(path, lines) -> None:
    path.write_text("".join(line + "\n" for line in lines))


# --- format ----------------------------------------------------------------------------------
def test_line_has_autotvm_0_2_layout():
    import tvm

    task = _task()
    row = json.loads(_line(task, {"tile": 2}, _ok(1e-6)))
    assert list(row)[:5] == ["input", "config", "result", "version", "tvm_version"]
    target, name, args, kwargs = row["input"]
    assert target == f"vta -model=vta_1x16x16 -fingerprint={FP1}"
    assert name == "vta.conv2d" and args == ["conv2d", [1, 16, 8, 8], "int8"]
    assert kwargs == {"compiler": compiler_version()} and compiler_version() == "0.1.0"
    assert row["config"]["index"] == task.space.index_of({"tile": 2})
    assert row["config"]["code_hash"] is None
    assert row["config"]["entity"][0] == ["tile", "ot", 2]
    assert [e[0] for e in row["config"]["entity"]] == task.space.names  # completed
    assert row["result"] == [[1e-6, 1.5e-6], 0, 0.75, 1700000000.5]
    assert row["version"] == 0.2 and row["tvm_version"] == tvm.__version__
    assert row["measure"] == {"cycles": 1000, "energy_uj": 0.25}


@pytest.mark.parametrize("config", [
    {"tile": 8, "ratio": 1 / 3, "db": False, "order": "nhwc", "shape": (4, (1, 2)),
     "lanes": 1.0},
    {"tile": 1, "ratio": 2.0, "db": True, "order": "nchw", "shape": (2, 1), "lanes": 1},
    {"tile": 4, "ratio": 0.5, "db": True, "order": "nchw", "shape": (1, 2), "lanes": None},
])
def test_encode_decode_round_trips_values_exactly(config):
    task = _task()
    line = _line(task, config, _ok(3e-6))
    e = decode(line, task.space)
    assert e.config == config
    for k, v in config.items():  # same types: tuples stay tuples, 1.0 stays a float, bools
        assert type(e.config[k]) is type(v), k
    assert e.costs == (3e-6, 4.5e-6) and e.error == MeasureError.NO_ERROR
    assert e.all_cost == 0.75 and e.timestamp == 1700000000.5
    assert e.cycles == 3000 and e.energy_uj == 0.25
    assert e.index == task.space.index_of(config)
    assert e.accel == "vta" and e.model == "vta_1x16x16" and e.fingerprint == FP1
    assert e.compiler == compiler_version()
    raw = decode(line)  # without the space: JSON values
    assert raw.config["shape"] == list(json.loads(json.dumps(config["shape"])))
    assert decode(raw.to_line(), task.space) == e


def test_failed_measurement_records_autotvm_failure_cost():
    task = _task()
    res = MeasureResult(costs=(), error=MeasureError.RUN_TIMEOUT, message="timed out\nafter 5 s",
                        all_cost=5.0, timestamp=1.0)
    e = decode(_line(task, {}, res))
    assert e.costs == (FAILED_COST,) and e.error == MeasureError.RUN_TIMEOUT
    assert e.message == "timed out" and not e.ok


# --- appending, reading ----------------------------------------------------------------------
def test_append_is_incremental(tmp_path):
    task, path = _task(), tmp_path / "sub" / "log.json"
    for i, tile in enumerate((1, 2, 4), 1):
        append_record(path, MeasureInput(task, {"tile": tile}), _ok(i * 1e-6))
        assert len(load_records(path)) == i
    cb = log_to_file(path)
    cb(None, [MeasureInput(task, {"tile": 8}), MeasureInput(task, {"db": False})],
       [_ok(1e-6), _ok(2e-6)])
    entries = load_records(path)
    assert [e.config["tile"] for e in entries] == [1, 2, 4, 8, 4]
    assert [e.where for e in entries[:2]] == [f"{path}:1", f"{path}:2"]


def test_truncated_last_line_is_skipped_with_a_warning_then_repaired(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    lines = [_line(task, {"tile": t}, _ok(1e-6)) for t in (1, 2, 4)]
    path.write_text("".join(x + "\n" for x in lines) + lines[0][:40])  # killed mid-write
    with pytest.warns(RecordWarning, match=r"log.json:4: skipped a truncated last record"):
        assert len(load_records(path)) == 3
    with pytest.warns(RecordWarning, match="dropped a truncated last record"):
        append_record(path, MeasureInput(task, {"tile": 8}), _ok(1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [e.config["tile"] for e in load_records(path)] == [1, 2, 4, 8]


def test_complete_last_line_without_newline_is_kept(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    path.write_text(_line(task, {"tile": 1}, _ok(1e-6)))
    append_record(path, MeasureInput(task, {"tile": 2}), _ok(1e-6))
    assert [e.config["tile"] for e in load_records(path)] == [1, 2]


def test_corrupt_middle_line_is_an_error(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    good = _line(task, {}, _ok(1e-6))
    _write(path, [good, good[:40], good])
    with pytest.raises(AccelError, match=r"log.json:2: not a JSON tuning record"):
        load_records(path)


def test_not_json_lines_file_is_an_error(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(AccelError, match=r"log.csv:1: not a JSON tuning record"):
        load_records(path)
    path.write_text("hello")  # one unterminated line that is not a record
    with pytest.raises(AccelError, match=r"log.csv:1: not a JSON tuning record"):
        load_records(path)
    with pytest.raises(AccelError, match="no such tuning records file"):
        load_records(tmp_path / "missing.json")


@pytest.mark.parametrize("field", ["input", "config", "result", "version"])
def test_line_missing_a_field_is_an_error(tmp_path, field):
    task, path = _task(), tmp_path / "log.json"
    row = json.loads(_line(task, {}, _ok(1e-6)))
    del row[field]
    _write(path, [_line(task, {}, _ok(1e-6)), json.dumps(row)])
    with pytest.raises(AccelError, match=rf"log.json:2: tuning record without the '{field}'"):
        load_records(path)


def test_invalid_result_and_version_are_errors():
    line = _line(_task(), {}, _ok(1e-6))
    row = json.loads(line)
    row["result"][1] = 42
    with pytest.raises(AccelError, match="error number 42"):
        decode(json.dumps(row), where="x:3")
    row = json.loads(line)
    row["version"] = 0.1
    with pytest.raises(AccelError, match=r"x:3: record version 0.1 is not supported"):
        decode(json.dumps(row), where="x:3")


# --- resuming --------------------------------------------------------------------------------
def test_measured_pairs_filters_by_task_workload_and_fingerprint(tmp_path):
    path = tmp_path / "log.json"
    mine, other_fp = _task(), _task(fp=FP2)
    other_name = _task(name="vta.dense")
    other_args = _task(workload=("conv2d", (1, 32, 8, 8), "int8"))
    failed = MeasureResult(costs=(), error=MeasureError.COMPILE_DEVICE, timestamp=2.0)
    _write(path, [
        _line(mine, {"tile": 1, "shape": (4, (1, 2))}, _ok(1e-6)),
        _line(other_fp, {"tile": 2}, _ok(1e-6)),
        _line(other_name, {"tile": 2}, _ok(1e-6)),
        _line(other_args, {"tile": 2}, _ok(1e-6)),
        _line(mine, {"tile": 8}, failed),
    ])
    pairs = measured_pairs(path, mine)
    assert len(pairs) == 2
    (inp0, res0), (inp1, res1) = pairs
    assert inp0.task is mine and inp0.config == mine.space.complete({"tile": 1,
                                                                     "shape": (4, (1, 2))})
    assert inp0.index == mine.space.index_of(inp0.config)
    assert res0.ok and res0.costs == (1e-6, 1.5e-6) and res0.cycles == 1000
    assert res1.error == MeasureError.COMPILE_DEVICE and res1.costs == (FAILED_COST,)
    assert [p[0].config["tile"] for p in measured_pairs(load_records(path), other_fp)] == [2]


def test_unknown_knob_is_an_error_naming_file_line_and_knob(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    row = json.loads(_line(task, {}, _ok(1e-6)))
    row["config"]["entity"].append(["unroll", "ot", 4])
    _write(path, [_line(task, {}, _ok(1e-6)), json.dumps(row)])
    with pytest.raises(AccelError, match=r"log.json:2: knob 'unroll' is not in the space"):
        measured_pairs(path, task)
    row["config"]["entity"] = [e for e in row["config"]["entity"] if e[0] != "unroll"]
    row["config"]["entity"][0][2] = 3
    _write(path, [json.dumps(row)])
    with pytest.raises(AccelError, match=r"log.json:1: knob tile: recorded value 3"):
        measured_pairs(path, task)


# --- pick best -------------------------------------------------------------------------------
def test_pick_best_takes_lowest_mean_cost_and_ignores_errors(tmp_path):
    a, b, a2 = _task(), _task(name="vta.add", workload=("add", (1, 16))), _task(fp=FP2)
    entries = [decode(_line(a, {"tile": t}, _ok(c)), where=f"l{i}")
               for i, (t, c) in enumerate([(1, 5e-6), (2, 2e-6), (4, 3e-6), (8, 2e-6)])]
    bad = dataclasses.replace(entries[0], costs=(1e-9,), error=MeasureError.WRONG_ANSWER,
                              where="bad")
    entries += [bad, decode(_line(b, {"tile": 8}, _ok(9e-6))),
                decode(_line(a2, {"tile": 1}, _ok(7e-6)))]
    best = pick_best(entries)
    assert len(best) == 3
    assert best[entries[0].workload_key].where == "l1"  # 2e-6, the earliest of the tie
    assert {e.task_name for e in best.values()} == {"vta.conv2d", "vta.add"}

    src, out = tmp_path / "all.json", tmp_path / "best.json"
    _write(src, [e.to_line() for e in entries])
    assert pick_best_file(src, out) == 3
    picked = load_records(out)
    assert [(e.task_name, e.fingerprint, e.config["tile"]) for e in picked] == [
        ("vta.conv2d", FP1, 2), ("vta.add", FP1, 8), ("vta.conv2d", FP2, 1)]


# --- applying --------------------------------------------------------------------------------
def test_apply_history_best_returns_the_best_config_and_records_use(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    _write(path, [_line(task, {"tile": 1}, _ok(5e-6)),
                  _line(task, {"tile": 2, "shape": (2, 1)}, _ok(1e-6)),
                  _line(task, {"tile": 8}, MeasureResult((), MeasureError.RUNTIME_DEVICE))])
    assert current() is None and ApplyHistoryBest.current() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ApplyHistoryBest(path) as ctx:
            assert current() is ctx and ApplyHistoryBest.current() is ctx
            cfg = ctx.query(task)
            assert ctx.query(_task(name="vta.dense")) is None
            with ApplyHistoryBest([]) as inner:
                assert current() is inner
            assert current() is ctx
    assert current() is None
    assert cfg == task.space.complete({"tile": 2, "shape": (2, 1)})
    assert type(cfg["shape"]) is tuple
    used = ctx.used[task.key]
    assert used.layers == ("conv1",) and used.where == f"{path}:2" and used.config == cfg
    assert ctx.ignored == []


def test_apply_history_best_refuses_another_config_with_one_warning(tmp_path):
    task, other = _task(), _task(fp=FP2, config_name="vta_8x8x8")
    path = tmp_path / "log.json"
    _write(path, [_line(other, {"tile": 1}, _ok(1e-6)),
                  _line(other, {"tile": 2}, _ok(2e-6)),
                  _line(task, {"tile": 4}, _ok(3e-6))])
    ctx = ApplyHistoryBest(path)
    with pytest.warns(RecordWarning, match=r"2 record\(s\) for vta config vta_8x8x8 .* not "
                      r"applied: this compile is for vta_1x16x16"):
        assert ctx.query(task)["tile"] == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx.query(task)  # reported once
    assert len(ctx.ignored) == 1 and ctx.ignored[0].count == 2

    only_other = ApplyHistoryBest(load_records(path)[:2])
    with pytest.warns(RecordWarning, match="vta_8x8x8"):
        assert only_other.query(task) is None
    assert only_other.used == {}


def test_apply_history_best_refuses_another_compiler_version():
    task = _task()
    e = decode(_line(task, {"tile": 1}, _ok(1e-6)))
    old = dataclasses.replace(e, kwargs={"compiler": "0.0.1"})
    ctx = ApplyHistoryBest([old])
    with pytest.warns(RecordWarning, match=r"written by compiler 0.0.1 not applied: this is "
                      + compiler_version()):
        assert ctx.query(task) is None
    assert "0.0.1" in str(ctx.ignored[0])
    assert ApplyHistoryBest([old], compiler="0.0.1").query(task)["tile"] == 1


def test_apply_history_best_rejects_unknown_knob_in_the_best_record(tmp_path):
    task, path = _task(), tmp_path / "log.json"
    row = json.loads(_line(task, {}, _ok(1e-6)))
    row["config"]["entity"].append(["unroll", "ot", 4])
    _write(path, [json.dumps(row)])
    with pytest.raises(AccelError, match=r"log.json:1: knob 'unroll'"):
        ApplyHistoryBest(path).query(task)
