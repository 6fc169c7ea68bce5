"""A farm of simulator servers behind TVM's RPC tracker (issue 25, item 3): ``tvmc run`` and
``tvmc tune`` with ``--rpc-tracker``, and what happens when a server dies mid-measurement.

One tracker and two servers run on localhost for the module (the servers import the repository
root, so the synthetic tasks of ``test_tuners`` unpickle there)."""

import contextlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from core.test_tuners import faulty_task, synthetic_task

from helpers import models
from helpers.cli import tvmc
from tvm_accel.evaluate import evaluate
from tvm_accel.farm import Farm, RPCMeasurer
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.tuning import MeasureError, MeasureInput, Task
from tvm_accel.tuning.records import load_records

pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
ROOT = Path(__file__).resolve().parents[2]
KEY = "accel-test"


@contextlib.contextmanager
def local_farm(servers: int = 2):
    """A tracker and ``servers`` farm servers on localhost; yields the tracker's HOST:PORT."""
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    from tvm_accel.rpc_server import register

    with pytest.MonkeyPatch.context() as mp:
        path = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
        tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
        procs = [rpc.Server(host="127.0.0.1", port=9300, port_end=9400, key=KEY,
                            tracker_addr=("127.0.0.1", tracker.port), silent=True,
                            server_init_callback=register) for _ in range(servers)]
    try:
        for _ in range(200):  # the servers register within a second or two
            with contextlib.suppress(Exception):
                if Farm(("127.0.0.1", tracker.port), KEY).servers == servers:
                    break
            time.sleep(0.1)
        yield f"127.0.0.1:{tracker.port}"
    finally:
        for s in procs:
            s.terminate()
        tracker.terminate()


@pytest.fixture(scope="module")
def farm():
    with local_farm() as address:
        yield address


def kill_server_once(context, config):
    """Kills the farm server running it (the session process above the measurement's) the
    first time, as a machine that dies mid-measurement; measures normally afterwards."""
    marker = Path(context["marker"])
    if not marker.exists():
        marker.write_text("killed")
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)
    return 7, 7e-8, None


def dying_task(marker: Path) -> Task:
    space = KnobSpace([Knob("k", (1,), 1)], name="dying")
    return Task("dying", "synthetic", ("dying",), space, kill_server_once,
                context={"marker": str(marker)})


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    d = tmp_path_factory.mktemp("farm")
    onnx.save(models.quantized("conv_flatten_dense"), d / "m.onnx")
    assert tvmc("compile", d / "m.onnx", "--target", "vta, llvm", "-o", d / "m.tar") == 0
    x = np.random.default_rng(0).standard_normal((20, 8, 4, 4)).astype(np.float32)
    np.savez(d / "data.npz", input=x)
    return d


def test_samples_run_on_the_farm_give_the_local_outputs_in_order(farm, ws, capsys):
    capsys.readouterr()
    assert tvmc("run", ws / "m.tar", "--inputs", ws / "data.npz", "--rpc-tracker", farm,
                "--rpc-key", KEY, "--outputs", ws / "farm.npz") == 0
    assert "20 samples in" in capsys.readouterr().out
    local = evaluate(ws / "m.tar", ws / "data.npz").outputs[0]
    assert np.array_equal(np.load(ws / "farm.npz")["fc_out"], local)


def test_a_simulator_error_on_a_server_is_the_users_one_line(farm, ws, capsys):
    capsys.readouterr()
    assert tvmc("run", ws / "m.tar", "--inputs", ws / "data.npz", "--rpc-tracker", farm,
                "--rpc-key", KEY, "--max-cycles", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raise --max-cycles" in err[0], err


def test_tuning_on_the_farm_measures_what_local_workers_measure(farm, ws, tmp_path):
    common = ("--target", "vta, llvm", "--tuner", "gridsearch", "--trials", "3")
    assert tvmc("tune", ws / "m.onnx", *common, "-o", tmp_path / "local.json",
                "--parallel", "1") == 0
    assert tvmc("tune", ws / "m.onnx", *common, "-o", tmp_path / "farm.json",
                "--rpc-tracker", farm, "--rpc-key", KEY) == 0

    def cycles(path):
        return sorted((r.task_name, r.index, r.costs, r.error) for r in load_records(path))

    assert cycles(tmp_path / "farm.json") == cycles(tmp_path / "local.json")
    assert len(cycles(tmp_path / "farm.json")) >= 3


@pytest.mark.slow
def test_a_measurement_that_crashes_or_hangs_is_an_error_and_the_servers_stay_up(farm):
    task, synth = faulty_task(), synthetic_task()
    inputs = [MeasureInput(task, {"mode": m, "k": 1})
              for m in ("ok", "exit", "segv", "simulator", "sleep")]
    inputs.append(MeasureInput(synth, {"tx": 16, "ty": 8, "order": "ij", "unroll": True}))
    host, port = farm.rsplit(":", 1)
    with RPCMeasurer(Farm((host, int(port)), KEY), timeout=1.0, load_allowance=2.0) as m:
        res = m.run(inputs)
    errors = [r.error for r in res]
    assert errors == [MeasureError.NO_ERROR, MeasureError.UNKNOWN_ERROR,
                      MeasureError.UNKNOWN_ERROR, MeasureError.RUNTIME_DEVICE,
                      MeasureError.RUN_TIMEOUT, MeasureError.NO_ERROR], [r.message for r in res]
    assert res[0].cycles == 10 and res[5].cycles == 980
    assert "measurement process died (exit code 3)" in res[1].message
    assert Farm((host, int(port)), KEY).servers == 2


@pytest.mark.slow
def test_a_server_dying_mid_measurement_is_retried_on_another(tmp_path):
    with local_farm(2) as address:
        host, port = address.rsplit(":", 1)
        farm = Farm((host, int(port)), KEY)
        with RPCMeasurer(farm, timeout=5.0, load_allowance=5.0) as m:
            res = m.run([MeasureInput(dying_task(tmp_path / "marker"), {"k": 1})])
        assert (tmp_path / "marker").exists()  # the first server did die
        assert res[0].error == MeasureError.NO_ERROR and res[0].cycles == 7, res[0].message


@pytest.mark.parametrize("argv, needle", [
    (["--rpc-tracker", "127.0.0.1:1"], "cannot reach the tracker"),
    (["--rpc-tracker", "localhost"], "give HOST:PORT"),
    (["--rpc-key", "k"], "give --rpc-tracker"),
])
def test_farm_flag_errors_are_one_line(ws, capsys, argv, needle):
    capsys.readouterr()
    assert tvmc("run", ws / "m.tar", "--inputs", ws / "data.npz", *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_a_key_without_servers_names_the_command_that_starts_one(farm, ws, capsys):
    capsys.readouterr()
    assert tvmc("run", ws / "m.tar", "--inputs", ws / "data.npz", "--rpc-tracker", farm,
                "--rpc-key", "nobody") == 2
    err = capsys.readouterr().err.strip()
    assert "no server of that key" in err and "tvm_accel.rpc_server" in err


def test_the_server_command_refuses_a_bad_tracker_in_one_line(capsys):
    from tvm_accel.rpc_server import main

    assert main(["--tracker", "nohost"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tvm_accel.rpc_server: error: --tracker 'nohost': give HOST:PORT, e.g. "
                   "127.0.0.1:9190"]
