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
