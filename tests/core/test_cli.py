import pytest

from helpers import models
from tvm_accel.cli import build_parser, main, parse_target
from tvm_accel.errors import AccelError


def test_target_string_puts_the_host_last():
    assert parse_target("vta, llvm") == ("vta", "llvm")
    assert parse_target("llvm") == (None, "llvm")


@pytest.mark.parametrize("text, msg", [("llvm, vta", "host"), ("npu, llvm", "unknown"),
                                       ("", "empty")])
def test_bad_target_string_is_a_clear_error(text, msg):
    with pytest.raises(AccelError, match=msg):
        parse_target(text)


def test_compile_of_a_missing_file_prints_one_line(tmp_path, capsys):
    rc = main(["compile", str(tmp_path / "nope.onnx"), "--target", "vta, llvm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nope.onnx" in err[0]


def test_compile_of_a_non_onnx_file_names_the_file(tmp_path, capsys):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x00\x01 definitely not protobuf")
    rc = main(["compile", str(bad), "--target", "vta, llvm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "garbage.onnx" in err[0]


def test_version_names_this_package_and_tvm(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("tvmc (tvm-accel)") and "Apache TVM" in out


def test_dump_offloads_writes_the_table_to_a_file(tmp_path, capsys):
    import onnx


    model = tmp_path / "m.onnx"
    onnx.save(models.quantized("conv_residual", c=16, hw=8), model)
    dump = tmp_path / "offloads.txt"
    assert main(["compile", str(model), "--target", "vta, llvm", "-o", str(tmp_path / "m.tar"),
                 "--dump-offloads", str(dump)]) == 0
    out = capsys.readouterr().out
    assert f"offloads -> {dump}" in out and "config vta_1x16x16; knobs" in out
    import json
    import tarfile

    with tarfile.open(tmp_path / "m.tar") as tar:
        meta = json.load(tar.extractfile("metadata.json"))
    assert meta["tool"].startswith("tvmc (tvm-accel)")
    assert meta["config_fields"]["LOG_BLOCK_IN"] == 4 and isinstance(meta["knobs"], dict)
    text = dump.read_text()
    assert text.startswith("layer ") and "conv" in text and "vta" in text
    rc = main(["compile", str(model), "--target", "vta, llvm", "-o", str(tmp_path / "m2.tar"),
               "--dump-offloads", str(tmp_path / "no" / "x.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--dump-offloads" in err[0]


def test_a_registered_target_brings_its_own_command_line_options(capsys, monkeypatch):
    """A fourth target, registered here: its config and one option appear in
    ``tvmc compile --help``, and its option value reaches it, with no core change."""
    from tvm_accel import target as registry
    from tvm_accel.cli.common import target_knobs
    from tvm_accel.target import AccelTarget, TargetOption, register_target

    class Toy(AccelTarget):
        name = "toy"
        package = "toy_accel"
        load_config = requant_recipe = add_recipe = pattern_table = None
        compile_function = plan = execute = disassemble = None

        def options(self):
            return [*super().options(),
                    TargetOption("lanes", "toy SIMD lanes", type=int, metavar="N")]

        def knobs_from_options(self, values):
            return {"lanes": values["lanes"]}

    monkeypatch.setattr(registry, "_TARGETS", dict(registry._TARGETS))
    register_target(Toy())
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    out = capsys.readouterr().out
    assert "--target-toy-config FILE" in out and "--target-toy-lanes N" in out
    assert "toy SIMD lanes" in out
    args = build_parser().parse_args(["compile", "m.onnx", "--target", "toy, llvm",
                                      "--target-toy-lanes", "8"])
    assert parse_target(args.target) == ("toy", "llvm")
    assert target_knobs("toy", args) == {"lanes": 8}
