import pytest


@pytest.fixture
def compare(compare_on):
    return compare_on("vta")


@pytest.fixture(params=["vta_1x16x16", "vta_8x8x8"])
def config(request):
    return request.param
