"""The error budget of VTA's cost-aware requantize recipe: ALU ops against agreement.

For each budget (``tvm_vta_cp.numerics.requant_recipe(budget_lsb=)``; 0 keeps the most accurate
recipe unless a cheaper one is as accurate) the CPU reference of VTA's numerics (bit-exact with
the simulator, so no simulation is needed) runs on

- ``resnet20``: the ``tvmc zoo`` ResNet-20 QDQ model on seeded random inputs (``--samples``);
- ``digits``: the digits CNN with VTA's quantization scheme on its 360 test images;

and is compared layer by layer with onnxruntime fed with our inputs of the layer (the
``local`` column of ``tvmc compare``). Printed per model and budget: conv/dense layers by ALU ops
per output entry (``tail_alu_ops``), the mean, the worst recipe error (LSB), the share of
layer output elements that differ from onnxruntime (all differ by at most 1 LSB when
``max`` says 1), and for digits top-1 and the images whose top-1 differs from onnxruntime's.

    python benchmarks/vta_requant_budget.py [--budgets 0,0.25,0.5,1,2] [--models resnet20,digits]

Figures are information for docs/vta.md, never assertions.
"""

from __future__ import annotations

import argparse
import collections
import sys

import numpy as np


def _run(onnx_model, feed: dict[str, np.ndarray], budget: float) -> dict:
    import tvm
    from tvm import relax

    import tvm_vta_cp
    from tvm_accel.canonicalize import canonicalize
    from tvm_accel.compare import (
        OURS_SUFFIX,
        cut_at_layer_outputs,
        expose_layer_outputs,
        ort_session,
    )
    from tvm_accel.frontend import load_onnx
    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.pipeline import compile_reference
    from tvm_vta_cp import numerics

    ops: list[int] = []
    solve = numerics.requant_recipe

    def recipe(*args, **kwargs):
        rq = solve(*args, budget_lsb=budget, **kwargs)
        ops.append(numerics.tail_alu_ops(rq))
        return rq

    numerics.requant_recipe = recipe
    try:
        exposed = expose_layer_outputs(onnx_model)
        mod, info = load_onnx(exposed)
        records = canonicalize(mod, tvm_vta_cp.TARGET)[1]
        ops.clear()  # count the recipes of one compile only
        ex = compile_reference(mod, tvm_vta_cp.TARGET)
    finally:
        numerics.requant_recipe = solve
    vm = relax.VirtualMachine(ex, tvm.cpu())
    names = [o.name for o in exposed.graph.output]
    outs = outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(feed[k]) for k in info.inputs]))
    ours = dict(zip(names, outs, strict=True))
    q_out = {n.output[0]: n.name for n in onnx_model.graph.node if n.op_type == "QuantizeLinear"}
    cut = cut_at_layer_outputs(exposed, {t: ours[t] for t in q_out})
    cut_in = {i.name for i in cut.graph.input}
    local_feed = {**feed, **{t + OURS_SUFFIX: ours[t] for t in q_out}}
    theirs = dict(zip(names, ort_session(cut).run(
        names, {k: v for k, v in local_feed.items() if k in cut_in}), strict=True))
    differ = total = worst = 0
    for t in q_out:
        d = np.abs(ours[t].astype(np.int64) - theirs[t].astype(np.int64))
        differ, total = differ + int(np.count_nonzero(d)), total + d.size
        worst = max(worst, int(d.max(initial=0)))
    return {"ops": ops, "records": records, "differ": differ, "total": total, "max": worst,
            "out": outs[0]}


def _model(name: str, samples: int):
    """``(qdq model, feed, labels or None, onnxruntime logits or None)``."""
    if name == "digits":
        from tvm_accel.datasets import accuracy, digits

        data = digits.load_digits()
        q = accuracy.with_batch(accuracy.quantized_model("vta"), len(data.x_test))
        return q, {digits.INPUT_NAME: data.x_test}, data.y_test, \
            accuracy.ort_logits(q, data.x_test)
    from tvm_accel import quantize
    from tvm_accel.frontend import load_onnx, random_inputs

    q = quantize.quantized(name)
    _, info = load_onnx(q)
    feeds = [random_inputs(info, seed) for seed in range(samples)]
    return q, {k: np.concatenate([f[k] for f in feeds]) if samples > 1 else feeds[0][k]
               for k in feeds[0]}, None, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="0,0.25,0.5,1,2")
    ap.add_argument("--models", default="resnet20,digits")
    ap.add_argument("--samples", type=int, default=1, help="random inputs (resnet20)")
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        q, feed, labels, ort_logits = _model(name, args.samples)
        print(f"# {name}: conv/dense layers by ALU ops per output entry; local agreement with "
              "onnxruntime (every layer output)")
        print(f"{'budget':>7} {'7 ops':>6} {'5 ops':>6} {'4 ops':>6} {'mean':>5} "
              f"{'worst err':>9} {'differ':>8} {'max':>4}" + ("  top-1  vs ort" if labels
                                                              is not None else ""))
        for b in (float(x) for x in args.budgets.split(",")):
            r = _run(q, feed, b)
            n = collections.Counter(r["ops"])
            err = max((x.max_lsb_error for x in r["records"]
                       if x.op in ("conv2d", "dense")), default=0.0)
            line = (f"{b:>7g} {n[7]:>6} {n[5]:>6} {n[4]:>6} {np.mean(r['ops']):>5.2f} "
                    f"{err:>9.3f} {r['differ'] / max(r['total'], 1):>8.3%} {r['max']:>4}")
            if labels is not None:
                pred = r["out"].argmax(1)
                line += (f"  {np.mean(pred == labels):6.2%} "
                         f"{int(np.sum(pred != ort_logits.argmax(1))):>4}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
