"""Top-1 accuracy on real data: the digits CNN (scikit-learn's 8x8 digits, trained in numpy,
``tvm_accel.datasets.digits``) on the 360 test images, float, onnxruntime on each QDQ model,
and each target on the simulator, with the number of images whose top-1 differs from
onnxruntime's. Variants: ``plain``, ``near-dead`` (one conv1 filter at 1e-12), ``mixed``
(MARSELLUS, 4-bit weights and output of conv2). Not run by the tests::

    python benchmarks/digits_accuracy.py [--variants plain,near-dead,mixed] [--layers]

``--layers`` also prints each target's per-layer agreement with onnxruntime
(``tvm_accel.compare.compare_layers`` on the same 360 images; for ``mixed`` on its
clipped-range twin, as onnxruntime hands no 4-bit tensor to numpy).
"""

from __future__ import annotations

import argparse
import time

from tvm_accel.datasets import accuracy as acc
from tvm_accel.datasets import digits
from tvm_accel.report import format_table


def _targets(variant: str) -> tuple[tuple[str, str | None], ...]:
    return (("marsellus", None),) if variant == "mixed" else acc.TARGETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(acc.VARIANTS),
                    help=f"comma-separated subset of {', '.join(acc.VARIANTS)}")
    ap.add_argument("--layers", action="store_true", help="per-layer LSB differences too")
    args = ap.parse_args()
    data = digits.load_digits()
    rows = []
    for variant in args.variants.split(","):
        w = acc.variant_weights(variant)
        rows.append((variant, "float (numpy)", "",
                     f"{digits.accuracy(digits.forward(w, data.x_test), data.y_test):.2f}",
                     "", "", "", ""))
        qdq = {}
        for kind, config in _targets(variant):
            t = time.perf_counter()
            if kind not in qdq:
                qdq[kind] = acc.quantized_model(kind, variant, data)
                scheme, act = acc.SCHEMES[kind]
                ort = digits.accuracy(acc.ort_logits(qdq[kind], data.x_test), data.y_test)
                rows.append((variant, f"onnxruntime QDQ ({scheme}, {act})", "", f"{ort:.2f}",
                             "", "", "", ""))
            r = acc.evaluate(kind, config, variant, data, model=qdq[kind])
            cpu = ", ".join(r.cpu_layers) or "-"
            rows.append((variant, r.label, kind, f"{r.accuracy:.2f}",
                         f"{r.accuracy - r.ort_accuracy:+.2f}", str(r.differ), cpu,
                         f"{time.perf_counter() - t:.1f}"))
            print(f"{variant} {r.label}: {r.accuracy:.2f}%", flush=True)
            if args.layers:
                q = acc.quantized_model(kind, variant, data, native_int4=False) \
                    if variant == "mixed" else qdq[kind]
                print(acc.compare_on_test_images(q, kind, config, data).format(), flush=True)
    print()
    print(format_table(["variant", "model / target", "kind", "top-1 %", "vs ort", "differ",
                        "layers on CPU", "s"], rows, align="lllrrrlr"))
    print(f"{len(data.x_test)} test images; 'differ': images whose top-1 differs from "
          "onnxruntime's on the same QDQ model; 's': quantize + compile + run")


if __name__ == "__main__":
    main()
