"""Upstream tvmc's flags that apply to our toolchain (issue 27): ``tvmc compile -O/--opt-level``
and ``--pass-config``, ``tvmc run --print-top`` and ``--number/--repeat``. A bad value is one
stderr line ``tvmc <verb>: error: ...`` and exit code 2, before any work is done."""

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from helpers import models
from helpers.cli import tvmc

SHAPE = (1, 16, 8, 8)  # the input of the single conv model


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli_upstream_flags")
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), root / "conv.onnx")
    assert tvmc("compile", root / "conv.onnx", "--target", "vta, llvm", "-o",
                root / "vta.tar") == 0
    rng = np.random.default_rng(1)
    np.savez(root / "x.npz", input=rng.uniform(-1, 1, SHAPE).astype(np.float32))
    np.savez(root / "x3.npz", input=rng.uniform(-1, 1, (3, *SHAPE[1:])).astype(np.float32))
    return root


def compile_(*flags):
    return lambda w: ["compile", w / "conv.onnx", "--target", "vta, llvm", "-o", w / "o.tar",
                      *flags]


def run(*flags):
    return lambda w: ["run", w / "vta.tar", *flags]


ERRORS = [
    ("opt-level-4", compile_("-O", "4"), ["--opt-level"]),
    ("opt-level-word", compile_("--opt-level", "max"), ["--opt-level"]),
    ("pass-config-unknown", compile_("--pass-config", "nope.key=1"),
     ["--pass-config nope.key", "not a pass config"]),
    ("pass-config-typo", compile_("--pass-config", "tirx.disable_vectorise=true"),
     ["nearest: tirx.disable_vectorize"]),
    ("pass-config-no-value", compile_("--pass-config", "tirx.disable_vectorize"),
     ["KEY=VALUE"]),
    ("pass-config-not-bool", compile_("--pass-config", "tirx.disable_vectorize=maybe"),
     ["tirx.disable_vectorize", "true or false"]),
    ("pass-config-not-int", compile_("--pass-config", "relax.FuseOps.max_depth=deep"),
     ["relax.FuseOps.max_depth", "integer"]),
    ("pass-config-struct", compile_("--pass-config", "tirx.UnrollLoop=1"),
     ["tirx.UnrollLoop", "cannot be given on the command line"]),
    ("print-top-zero", run("--print-top", "0"), ["--print-top 0"]),
    ("print-top-word", run("--print-top", "all"), ["--print-top"]),
    ("number-zero", run("--number", "0"), ["--number 0"]),
    ("number-negative", run("--print-time", "--number", "-2"), ["--number -2"]),
    ("repeat-on-a-dataset", lambda w: ["run", w / "vta.tar", "--inputs", w / "x3.npz",
                                        "--repeat", "2"], ["--repeat times one run"]),
]


@pytest.mark.parametrize("make, expect", [pytest.param(m, e, id=i) for i, m, e in ERRORS])
def test_bad_upstream_flag_is_one_line_and_exit_2(ws, capsys, make, expect):
    rc = tvmc(*make(ws))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], err
    assert all(w in lines[0] for w in expect), lines[0]
    assert not (ws / "o.tar").exists()


@pytest.mark.parametrize("flags, level, config", [
    ((), 2, {}),
    (("-O", "0"), 0, {}),
    (("--opt-level", "3", "--pass-config", "tirx.disable_vectorize=true",
      "--pass-config", "relax.FuseOps.max_depth=4"), 3,
     {"tirx.disable_vectorize": True, "relax.FuseOps.max_depth": 4}),
])
@pytest.mark.parametrize("target", ["vta, llvm", "llvm"])
def test_opt_level_and_pass_config_reach_the_compile(ws, capsys, monkeypatch, target, flags,
                                                     level, config):
    import tvm

    from tvm_accel import pipeline

    seen = []

    def spy(real):
        def compile_(*a, **kw):
            ctx = tvm.transform.PassContext.current()
            seen.append((ctx.opt_level, {str(k): v for k, v in ctx.config.items()}))
            return real(*a, **kw)
        return compile_

    for name in ("compile_model", "compile_reference"):
        monkeypatch.setattr(pipeline, name, spy(getattr(pipeline, name)))
    assert tvmc("compile", ws / "conv.onnx", "--target", target, "-o", ws / "p.tar",
                *flags) == 0, capsys.readouterr()
    ((got_level, got_config),) = seen
    assert got_level == level
    assert {k: (bool(v) if isinstance(config.get(k), bool) else int(v))
            for k, v in got_config.items()} == config


def _top(out: str) -> list[list[tuple[int, float]]]:
    """The ``sample i: c: score, ...`` lines of ``--print-top``, as (class, score) per sample."""
    rows = [ln.split(": ", 1)[1] for ln in out.splitlines() if ln.strip().startswith("sample ")]
    return [[(int(c), float(s)) for c, s in re.findall(r"(\d+): (\S+?)(?:,|$)", r)]
            for r in rows]


def test_print_top_names_the_highest_scores_of_the_output(ws, capsys):
    assert tvmc("run", ws / "vta.tar", "--inputs", ws / "x.npz", "--outputs", ws / "y.npz",
                "--print-top", "5") == 0
    out = capsys.readouterr().out
    assert "top-5 classes of output" in out, out
    y = next(iter(np.load(ws / "y.npz").values())).reshape(1, -1)[0]
    ((top,),) = [_top(out)]
    assert [c for c, _ in top] == list(np.argsort(-y.astype(np.float64), kind="stable")[:5])
    assert [s for _, s in top] == pytest.approx([float(y[c]) for c, _ in top], rel=1e-3)


def test_print_top_has_a_line_per_sample_of_a_dataset(ws, capsys):
    assert tvmc("run", ws / "vta.tar", "--inputs", ws / "x3.npz", "--print-top", "2") == 0
    top = _top(capsys.readouterr().out)
    assert len(top) == 3 and all(len(t) == 2 for t in top), top


def test_number_and_repeat_time_the_run_without_changing_its_cycles(ws, capsys):
    assert tvmc("run", ws / "vta.tar", "--inputs", ws / "x.npz", "--profile") == 0
    plain = capsys.readouterr().out
    assert tvmc("run", ws / "vta.tar", "--inputs", ws / "x.npz", "--profile",
                "--number", "2", "--repeat", "4") == 0
    timed = capsys.readouterr().out
    assert "4 measurement(s) of 2 run(s)" in timed, timed
    head = next(ln for ln in timed.splitlines() if "mean (ms)" in ln)
    assert head.split() == ["mean", "(ms)", "median", "(ms)", "max", "(ms)", "min", "(ms)",
                            "std", "(ms)"]
    cycles = [json.loads(o.strip().splitlines()[-1].removeprefix("summary: "))
              for o in (plain, timed)]
    assert cycles[0] == cycles[1]
    assert "wall time" not in plain
