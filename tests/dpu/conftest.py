import pytest


@pytest.fixture
def compare(compare_on):
    return compare_on("dpu")


@pytest.fixture(scope="session")
def cfg():
    """The bundled ``dpu_default`` config."""
    from tvm_dpu.hw_config import load_config

    return load_config()
