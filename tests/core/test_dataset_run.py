"""``tvmc run --inputs data.npz`` on N stacked samples, ``--labels``, ``--reference`` and
:func:`tvm_accel.evaluate.evaluate` (issue 21, item 3)."""

import io

import numpy as np
import onnx
import pytest

from helpers import models
from helpers.cli import tvmc
from tvm_accel.compare import ort_session
from tvm_accel.evaluate import ProgressBar, evaluate, top_k


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A small classifier (conv, Flatten, Gemm: 10 classes) quantized and compiled for VTA at
    batch 1 and batch 2, and 6 samples; returns the directory."""
    d = tmp_path_factory.mktemp("dataset")
    for batch in (1, 2):
        onnx.save(models.quantized("conv_flatten_dense", batch=batch), d / f"m{batch}.onnx")
        assert tvmc("compile", d / f"m{batch}.onnx", "--target", "vta, llvm", "-o",
                     d / f"m{batch}.tar") == 0
    x = np.random.default_rng(0).standard_normal((6, 8, 4, 4)).astype(np.float32)
    np.savez(d / "data.npz", input=x)
    return d


def _single(d, name: str, x: np.ndarray) -> np.ndarray:
    np.savez(d / "one.npz", input=x)
    assert tvmc("run", d / name, "--inputs", d / "one.npz", "--outputs", d / "one_y.npz") == 0
    return next(iter(np.load(d / "one_y.npz").values()))


@pytest.mark.parametrize("batch", [1, 2])
def test_stacked_samples_give_the_outputs_of_one_run_each(ws, batch):
    x = np.load(ws / "data.npz")["input"]
    res = evaluate(ws / f"m{batch}.tar", ws / "data.npz")
    assert res.n == 6 and res.outputs[0].shape == (6, 10)
    for i in range(0, 6, batch):
        assert np.array_equal(res.outputs[0][i:i + batch],
                              _single(ws, f"m{batch}.tar", x[i:i + batch]))
    assert res.top1 is None and res.top1_disagree is None


def test_labels_give_top1_and_top5_accuracy(ws):
    scores = evaluate(ws / "m1.tar", ws / "data.npz").outputs[0]
    order = np.argsort(-scores, axis=1, kind="stable")
    # two samples right at top-1, two at rank 3 (top-5 only), two at the last rank (neither)
    labels = np.array([order[0, 0], order[1, 0], order[2, 2], order[3, 2], order[4, 9],
                       order[5, 9]])
    res = evaluate(ws / "m1.tar", ws / "data.npz", labels=labels)
    assert res.top1 == pytest.approx(2 / 6) and res.top5 == pytest.approx(4 / 6)
    assert top_k(scores[:, :3], labels % 3, 5) is None  # fewer classes than 5


def test_reference_counts_samples_whose_top1_differs_from_onnxruntime(ws):
    x = np.load(ws / "data.npz")["input"]
    sess = ort_session(onnx.load(ws / "m1.onnx"))
    theirs = np.concatenate([sess.run(None, {"input": x[i:i + 1]})[0] for i in range(6)])
    ours = evaluate(ws / "m1.tar", ws / "data.npz").outputs[0]
    labels = theirs.argmax(axis=1)
    res = evaluate(ws / "m1.tar", ws / "data.npz", labels=labels, reference=ws / "m1.onnx")
    assert res.ref_top1 == 1.0
    assert res.top1_disagree == int(np.sum(ours.argmax(axis=1) != labels))
    assert res.top1 == pytest.approx(1 - res.top1_disagree / 6)


def test_cli_prints_accuracy_and_writes_stacked_outputs(ws, capsys):
    x = np.load(ws / "data.npz")["input"]
    np.savez(ws / "labelled.npz", input=x, labels=np.arange(6))
    capsys.readouterr()
    assert tvmc("run", ws / "m1.tar", "--inputs", ws / "labelled.npz", "--reference",
                 ws / "m1.onnx", "--outputs", ws / "y.npz") == 0
    out = capsys.readouterr().out
    res = evaluate(ws / "m1.tar", ws / "data.npz", labels=np.arange(6), reference=ws / "m1.onnx")
    assert f"top-1 {100 * res.top1:.2f}%, top-5 {100 * res.top5:.2f}%" in out
    assert f"differs on {res.top1_disagree} of 6 samples" in out and "6 samples in" in out
    assert np.array_equal(np.load(ws / "y.npz")["fc_out"], res.outputs[0])
    np.save(ws / "labels.npy", np.arange(6)[::-1].copy())
    assert tvmc("run", ws / "m1.tar", "--inputs", ws / "data.npz", "--labels",
                 ws / "labels.npy") == 0
    assert "accuracy: top-1" in capsys.readouterr().out


@pytest.mark.parametrize("batch", [1, 2])
def test_samples_spread_over_processes_give_the_same_outputs_in_order(ws, batch):
    one = evaluate(ws / f"m{batch}.tar", ws / "data.npz", jobs=1)
    three = evaluate(ws / f"m{batch}.tar", ws / "data.npz", jobs=3)
    assert three.jobs == 3 and one.jobs == 1  # 6 samples: 6 or 3 batches
    assert np.array_equal(one.outputs[0], three.outputs[0])
    assert "on 3 processes" in three.format()
    auto = evaluate(ws / f"m{batch}.tar", ws / "data.npz", jobs=None)
    assert auto.jobs == 1 and np.array_equal(auto.outputs[0], one.outputs[0])  # too small


def test_spawned_workers_give_the_same_outputs_as_forked_ones(ws, monkeypatch):
    import tvm_accel.evaluate as ev

    forked = evaluate(ws / "m1.tar", ws / "data.npz", jobs=2)
    monkeypatch.setattr(ev, "worker_start_method", lambda: "spawn")  # an OS without fork
    spawned = evaluate(ws / "m1.tar", ws / "data.npz", jobs=2)
    assert spawned.jobs == forked.jobs == 2
    assert np.array_equal(spawned.outputs[0], forked.outputs[0])


def test_cli_jobs_runs_the_dataset_on_processes_and_keeps_user_errors_one_line(ws, capsys):
    capsys.readouterr()
    assert tvmc("run", ws / "m1.tar", "--inputs", ws / "data.npz", "--jobs", "2",
                "--outputs", ws / "yj.npz") == 0
    assert "6 samples in" in capsys.readouterr().out
    assert np.array_equal(np.load(ws / "yj.npz")["fc_out"],
                          evaluate(ws / "m1.tar", ws / "data.npz").outputs[0])
    for argv, needle in ((["--jobs", "0"], "--jobs 0: give at least 1"),
                         (["--jobs", "2", "--max-cycles", "1"], "raise --max-cycles")):
        assert tvmc("run", ws / "m1.tar", "--inputs", ws / "data.npz", *argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_progress_bar_draws_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(stream=stream)
        for i in range(1, 4):
            bar(i, 3)
    assert tty.getvalue().endswith("3/3 samples\n") and "\r[" in tty.getvalue()
    assert pipe.getvalue() == ""


@pytest.mark.parametrize("files, args, needle", [
    ({"data.npz": {"input": np.zeros((6, 8, 4, 4))}, "l.npy": np.arange(5)},
     ["--labels", "l.npy"], "5 labels for 6 samples"),
    ({"data.npz": {"input": np.zeros((6, 8, 4, 5))}}, [], "give [N, 8, 4, 4]"),
    ({"data.npz": {"input": np.zeros((3, 8, 4, 4))}}, ["--m2"], "not a multiple of the "
     "model's batch 2"),
    ({"data.npz": {"input": np.zeros((6, 8, 4, 4))}, "l.npy": np.ones((6, 2))},
     ["--labels", "l.npy"], "one integer class index per sample"),
    ({"data.npz": {"input": np.zeros((6, 8, 4, 4))}, "l.npy": np.full(6, 10)},
     ["--labels", "l.npy"], "class 10 is outside the model's 10 classes"),
    ({"data.npz": {"input": np.zeros((6, 8, 4, 4))}}, ["--profile"], "--profile profiles one"),
    ({"data.npz": {"input": np.zeros((6, 8, 4, 4))}}, ["--reference", "nope.onnx"],
     "nope.onnx: no such file"),
    ({}, ["--labels", "l.npy"], "give --inputs"),
])
def test_dataset_user_errors_are_one_line_exit_2(ws, tmp_path, monkeypatch, capsys, files,
                                                  args, needle):
    monkeypatch.chdir(tmp_path)
    for name, value in files.items():
        if isinstance(value, dict):
            np.savez(name, **{k: v.astype(np.float32) for k, v in value.items()})
        else:
            np.save(name, value)
    package = ws / ("m2.tar" if "--m2" in args else "m1.tar")
    args = [a for a in args if a != "--m2"]
    inputs = ["--inputs", "data.npz"] if files else []
    capsys.readouterr()
    assert tvmc("run", package, *inputs, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tvmc run: error:") and needle in err[0], err
