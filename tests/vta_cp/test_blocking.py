"""The runtime's NCHWnc blocking folded into the layout-rewrite host functions."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_vta_cp.codegen import load_blob
from tvm_vta_cp.layout import packed_shape
from tvm_vta_cp.rewrite import LayoutRewrite

from .test_rewrite import _lowered, bindings, canonical, run, shape


@pytest.mark.parametrize("act, spec, kw", [
    # int8: the unpacked rows keep padding 1 read from a halo of zx; 3 channels fill 16 lanes
    ("int8", LayoutRewrite(pack=(1, 4)),
     dict(cin=3, cout=8, kernel=(3, 3), pads=(1, 1, 1, 1), hw=(5, 9))),
    ("uint8", LayoutRewrite(("h", "w"), (2, 2)),
     dict(cin=2, cout=5, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), hw=(9, 9))),
    ("uint8", LayoutRewrite(("w",)), dict(cin=1, cout=8, kernel=(2, 5), hw=(6, 12))),
])
def test_blocking_is_fused_into_the_rewrite_host_functions(act, spec, kw):
    """The rewrite host function writes the VTA call's DRAM form (the runtime only copies it)
    and a packed conv's unpack reads it: bit-exact."""
    canon, inputs, ref = canonical(act, **kw)
    lowered, report = _lowered(canon, spec, "vta_1x16x16")
    (fn,) = report.functions
    program, cfg, _ = load_blob(fn.blob)
    (tin,), (tout,) = program.inputs, program.outputs
    p_in, p_out = program.tensors[tin], program.tensors[tout]
    assert p_in.blocked and p_out.blocked == (spec.pack != (1, 1))
    calls = [v for v in bindings(lowered).values()
             if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.call_dps_packed"]
    (call,) = calls
    assert shape(call.args[1].fields[1]) == packed_shape(p_in, cfg)
    np.testing.assert_array_equal(run(tvm.compile(lowered, target="llvm"), inputs), ref)
