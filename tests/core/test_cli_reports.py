"""Reports a new user reads and compares (issue 27): one shape column format for every target
in every report, tables that fit 120 columns (``--wide`` for the rest), the layer boundaries
on the timeline, and ``tvmc tune``'s cycles next to ``tvmc run --profile``'s.

Table-driven: one row per case, its input and the report text it must give.
"""

from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest

from helpers import models
from helpers.cli import tvmc
from tvm_accel.layers import PoolLayer, UpsampleLayer, layer_shape_text
from tvm_accel.report import format_table

BUNDLED = Path(__file__).parents[2] / "python" / "tvm_accel" / "models"

# --- 1. one shape format ---------------------------------------------------------------------
CONV = SimpleNamespace(kernel=(3, 3), strides=(1, 1), padding=(1, 1, 1, 1))
SHAPE_TEXTS = [
    ("conv", CONV, [(1, 3, 32, 32)], (1, 16, 32, 32), "",
     "1x3x32x32 -> 1x16x32x32 k3x3 s1 p1"),
    ("strided-conv-no-pad", SimpleNamespace(kernel=(1, 1), strides=(2, 2), padding=(0,) * 4),
     [(1, 16, 32, 32)], (1, 32, 16, 16), "", "1x16x32x32 -> 1x32x16x16 k1x1 s2"),
    ("uneven", SimpleNamespace(kernel=(5, 20), strides=(2, 1), padding=(2, 0, 2, 0),
                               dilation=(2, 1), groups=4),
     [(4, 8, 20, 40)], (4, 8, 10, 21), "",
     "4x8x20x40 -> 4x8x10x21 k5x20 s2x1 p2,0,2,0 d2x1 g4"),
    ("dense", SimpleNamespace(is_dense=True, kernel=(1, 1), strides=(1, 1)), [(1, 64)],
     (1, 10), "", "1x64 -> 1x10"),
    ("add", None, [(1, 16, 8, 8)] * 2, (1, 16, 8, 8), "", "1x16x8x8, 1x16x8x8 -> 1x16x8x8"),
    ("global-pool", PoolLayer("p", "x", "y", "max", (8, 8), (1, 1), (0,) * 4),
     [(1, 64, 8, 8)], (1, 64, 1, 1), "", "1x64x8x8 -> 1x64x1x1 k8x8 s1"),
    ("upsample", UpsampleLayer("u", "x", "y", (2, 2)), [(1, 8, 6, 6)], (1, 8, 12, 12), "",
     "1x8x6x6 -> 1x8x12x12 x2"),
    ("target-note", CONV, [(1, 8, 8, 8)], (1, 8, 16, 16), "(4 phases)",
     "1x8x8x8 -> 1x8x16x16 k3x3 s1 p1 (4 phases)"),
]


@pytest.mark.parametrize("layer, ins, out, note, text",
                         [pytest.param(*c[1:], id=c[0]) for c in SHAPE_TEXTS])
def test_layer_shape_text_is_the_one_format(layer, ins, out, note, text):
    assert layer_shape_text(layer, ins, out, note) == text


CONV8 = "1x16x8x8 -> 1x16x8x8 k3x3 s1 p1"
#: (id, target, model, options, shape text every report shows for the model's layer)
TARGET_SHAPES = [
    ("vta", "vta, llvm", models.quantized("single_conv"), [], CONV8),
    ("vta-8x8x8-rewritten-layer", "vta, llvm", models.quantized("single_conv", hw=32),
     ["--target-vta-config", "vta_8x8x8"], "1x16x32x32 -> 1x16x32x32 k3x3 s1 p1"),
    ("vta-dense", "vta, llvm", models.quantized("single_dense"), [], "1x64 -> 1x32"),
    ("dpu-batch-4", "dpu, llvm", models.quantized("single_conv", batch=4, power_of_two=True),
     [], "4x16x8x8 -> 4x16x8x8 k3x3 s1 p1"),
    ("marsellus", "marsellus, llvm", models.quantized("single_conv", activation_type="uint8"),
     [], CONV8),
]


@pytest.mark.parametrize("target, model, options, text",
                         [pytest.param(*c[1:], id=c[0]) for c in TARGET_SHAPES])
def test_every_report_shows_the_layers_own_shape(tmp_path, capsys, target, model, options,
                                                 text):
    onnx.save(model, tmp_path / "m.onnx")
    pkg = tmp_path / "m.tar"
    assert tvmc("compile", tmp_path / "m.onnx", "--target", target, "-o", pkg, *options,
                "--dump-offloads") == 0
    reports = {"dump-offloads": capsys.readouterr().out}
    for verb, argv in (("profile", ["run", pkg, "--profile"]),
                       ("disassemble", ["disassemble", pkg, "--limit", "20"])):
        assert tvmc(*argv) == 0
        reports[verb] = capsys.readouterr().out
    missing = [verb for verb, out in reports.items() if text not in out]
    assert not missing, (missing, reports)
    assert "[" not in reports["profile"].split("util:")[0]  # no Python lists as shapes


# --- 2. tables fit 120 columns ---------------------------------------------------------------
LONG = "static: x=1 y=k16 z=c16 pad c 3->16; overhead MAC 1,916,928 data 17,296"
ROWS = [("layer2.0.downsample", "conv2d", "1x16x32x32 -> 1x32x16x16 k1x1 s2", 131072, LONG,
         "matched vta.qconv2d"),
        ("avgpool", "global_avg_pool2d", "1x64x8x8 -> 1x64x1x1 k8x8 s1", 0, "-",
         "no vta pattern for global_avg_pool2d")]
HEAD = ["layer", "op", "shape", "MACs", "embedding", "reason"]
#: (id, width, lines that must appear, words that must not)
WIDTHS = [
    ("whole-without-a-limit", None,
     [f"{LONG}  matched vta.qconv2d"], ["--wide", "under each row"]),
    ("far-too-wide-moves-the-reasons-under-each-row", 90,
     ["    reason: no vta pattern for global_avg_pool2d",
      "(embedding, reason under each row to fit 90 characters; --wide prints the table whole)"],
     ["..."]),
    ("a-little-too-wide-cuts-the-layer-names", 189,
     ["layer2.0.down...", "(1 column(s) cut to fit 189 characters"], ["under each row"]),
]


@pytest.mark.parametrize("width, present, absent", [pytest.param(*c[1:], id=c[0])
                                                    for c in WIDTHS])
def test_a_table_fits_its_width(width, present, absent):
    text = format_table(HEAD, ROWS, width=width)
    lines = text.splitlines()
    assert all(len(ln) <= (width or 1000) for ln in lines), text
    for want in present:
        assert any(want in ln for ln in lines), (want, text)
    for word in absent:
        assert word not in text, (word, text)
    assert "1x16x32x32 -> 1x32x16x16 k1x1 s2" in text  # shapes stay whole


#: (id, model, target, compile options): every table tvmc prints for it fits 120 columns
TABLE_CASES = [
    ("vta-bundled", BUNDLED / "tiny_cnn_int8.onnx", "vta, llvm", []),
    ("vta-8x8x8-bundled", BUNDLED / "tiny_cnn_int8.onnx", "vta, llvm",
     ["--target-vta-config", "vta_8x8x8"]),
    ("dpu-bundled", BUNDLED / "tiny_cnn_pow2.onnx", "dpu, llvm", []),
    ("marsellus-bundled", BUNDLED / "tiny_cnn_int8.onnx", "marsellus, llvm", []),
]


@pytest.mark.parametrize("model, target, options", [pytest.param(*c[1:], id=c[0])
                                                    for c in TABLE_CASES])
def test_every_table_fits_120_columns_and_wide_prints_it_whole(tmp_path, capsys, model,
                                                                target, options):
    pkg = tmp_path / "m.tar"
    runs = [["compile", model, "--target", target, "-o", pkg, *options, "--dump-offloads"],
            ["run", pkg, "--profile", "--print-time", "--number", "2", "--repeat", "2"]]
    for argv in runs:
        assert tvmc(*argv) == 0
        out = capsys.readouterr().out
        table = [ln for ln in out.splitlines() if not ln.startswith(("summary:", "compiled "))
                 and "first values" not in ln]  # summaries and the outputs: not tables
        assert max(map(len, table)) <= 120, [ln for ln in table if len(ln) > 120]
        assert tvmc(*argv, "--wide") == 0
        assert "--wide prints" not in capsys.readouterr().out


# --- 3. the timeline marks the layers --------------------------------------------------------
@pytest.mark.parametrize("target, model", [
    ("vta, llvm", BUNDLED / "tiny_cnn_int8.onnx"),
    ("dpu, llvm", BUNDLED / "tiny_cnn_pow2.onnx"),
    ("marsellus, llvm", BUNDLED / "tiny_cnn_int8.onnx")])
def test_the_trace_and_the_timeline_mark_every_profiled_layer(tmp_path, capsys, target, model):
    import csv
    import json

    from tvm_accel.profiler import LAYER_CATEGORY
    from tvm_accel.timeline import layer_marks

    pkg = tmp_path / "m.tar"
    assert tvmc("compile", model, "--target", target, "-o", pkg) == 0
    assert tvmc("run", pkg, "--trace", tmp_path / "t.json", "--profile-csv",
                tmp_path / "p.csv") == 0
    with open(tmp_path / "p.csv") as f:
        profiled = [(r["layer"], float(r["time_us"])) for r in csv.DictReader(f)]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("cat") == LAYER_CATEGORY]
    marks = layer_marks(spans)
    assert [n for _, _, n in marks] == [n for n, _ in profiled]
    starts = [s for s, _, _ in marks]
    assert starts[0] == 0 and all(b > a for a, b in zip(starts, starts[1:], strict=False))
    assert tvmc("timeline", pkg, "-o", tmp_path / "t.png") == 0
    assert (tmp_path / "t.png").stat().st_size > 0


# --- 4./5. tvmc tune: its cycles next to the profile's, -O and --pass-config -----------------
@pytest.fixture(scope="module")
def conv_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tune") / "c.onnx"
    onnx.save(models.quantized("single_conv", hw=32), path)
    return path


def _table_cell(out: str, first: str, head: str) -> str:
    """The cell under ``head`` of the first row of the table whose header starts with
    ``first`` (right-aligned numbers end where their header ends)."""
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(first + " "))
    end = lines[at].index(head) + len(head)
    return lines[at + 2][:end].split()[-1]


def test_tune_default_cycles_equal_the_profile_for_a_layer_alone(conv_model, tmp_path,
                                                                   capsys):
    """The difference the tune table explains comes from the model around a layer: a conv
    alone, with the knobs tune calls default (the static strategy), has one number."""
    static = ["--target", "vta, llvm", "--target-vta-strategy", "static"]
    assert tvmc("compile", conv_model, *static, "-o", tmp_path / "c.tar") == 0
    assert tvmc("run", tmp_path / "c.tar", "--profile") == 0
    profiled = _table_cell(capsys.readouterr().out, "layer", "cycles")
    assert tvmc("tune", conv_model, *static, "-o", tmp_path / "r.json", "--trials", "2",
                "-O", "3", "--pass-config", "tirx.disable_vectorize=true") == 0
    out = capsys.readouterr().out
    assert _table_cell(out, "layer", "default cycles") == profiled
    assert "1x16x32x32 -> 1x16x32x32 k3x3 s1 p1" in out  # the one shape format
    assert "`tvmc run --profile` shows it in the model" in out
    assert max(len(ln) for ln in out.splitlines() if not ln.startswith("tuning ")) <= 120


@pytest.mark.parametrize("flags, error", [
    (["--pass-config", "no.such_key=1"], "--pass-config no.such_key"),
    (["-O", "7"], "-O/--opt-level"),
])
def test_tune_checks_its_pass_context_flags(conv_model, tmp_path, capsys, flags, error):
    rc = tvmc("tune", conv_model, "--target", "vta, llvm", "-o", tmp_path / "r.json", *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and error in err[0], err
    assert not (tmp_path / "r.json").exists()
