import pytest

from tvm_accel.cli import main, parse_target
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

    from tvm_accel import zoo

    model = tmp_path / "m.onnx"
    onnx.save(zoo.quantized("conv_residual", c=16, hw=8), model)
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
