import pytest


@pytest.fixture
def compare(compare_on):
    return compare_on("dpu")
