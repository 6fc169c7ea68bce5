"""The DeepBench scripts' ``--jobs`` (issue 25, item 2): rows spread over forked processes come
back in row order, equal to a one-process run."""

import os

from tvm_accel.deepbench import map_rows


def test_rows_on_processes_come_back_in_order_with_the_closure_inherited():
    offset = 1000  # a closure: forked workers inherit it, nothing but the index is pickled
    rows = [{"id": i} for i in range(7)]

    def measure(row):
        return row["id"] + offset, os.getpid()

    one = list(map_rows(measure, rows, 1))
    two = list(map_rows(measure, rows, 2))
    assert [v for v, _ in two] == [v for v, _ in one] == list(range(1000, 1007))
    assert {pid for _, pid in one} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid in two}
