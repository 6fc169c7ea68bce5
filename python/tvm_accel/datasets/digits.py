"""scikit-learn's handwritten digits (8x8 images, bundled with scikit-learn, nothing downloaded)
and a small CNN trained on them in numpy: the real-data check of the whole chain (float model ->
``tvmc quantize`` -> compile -> simulator, see :mod:`tvm_accel.datasets.accuracy`).

The network (:func:`to_onnx`): ``conv1`` 1->8, ``conv2`` 8->16, ``conv3`` 16->32 (3x3, padding
1, ReLU), global average pool, flatten, ``fc`` 32->10. Training (:func:`train`) is plain numpy
(im2col convolutions, softmax cross-entropy, Adam with a cosine learning rate, fixed seed); its
weights are cached in ``digits_cnn.npz`` beside this module (:func:`trained_weights`), which
``python -m tvm_accel.datasets.digits`` regenerates.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: test images held out from training (split of ``train_test_split(random_state=0)``)
TEST_SIZE = 360
#: channels of the three convolutions' inputs and outputs
CHANNELS = (1, 8, 16, 32)
CLASSES = 10
#: the ONNX node names of the layers with weights, in order
LAYERS = ("conv1", "conv2", "conv3", "fc")
#: the cached trained weights
WEIGHTS_FILE = Path(__file__).with_name("digits_cnn.npz")
#: the graph input's name
INPUT_NAME = "input"
#: training hyper-parameters of the cached weights
EPOCHS, BATCH, LEARNING_RATE, SEED = 20, 32, 1e-2, 0

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class Digits:
    """The split data set: images ``(N, 1, 8, 8)`` float32 in [0, 1], labels ``(N,)`` int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits() -> Digits:
    """The 1797 digits split deterministically: 1437 training and :data:`TEST_SIZE` test images."""
    try:
        from sklearn.datasets import load_digits as sk_load  # type: ignore[import-untyped]
        from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]
    except ImportError as e:
        raise ImportError("the digits data set comes with scikit-learn: pip install "
                          "'scikit-learn>=1.3' (part of the 'test' extra)") from e

    d = sk_load()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_SIZE, random_state=0)
    return Digits(np.ascontiguousarray(x_tr), y_tr, np.ascontiguousarray(x_te), y_te)


def init_weights(seed: int = SEED) -> Weights:
    """He-initialized weights (OIHW convolutions, ``(10, 32)`` dense), zero biases."""
    rng = np.random.default_rng(seed)
    w: Weights = {}
    for i, (cin, cout) in enumerate(zip(CHANNELS, CHANNELS[1:], strict=False)):
        w[f"conv{i + 1}.weight"] = (rng.standard_normal((cout, cin, 3, 3))
                                    * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        w[f"conv{i + 1}.bias"] = np.zeros(cout, np.float32)
    w["fc.weight"] = (rng.standard_normal((CLASSES, CHANNELS[-1]))
                      * np.sqrt(1.0 / CHANNELS[-1])).astype(np.float32)
    w["fc.bias"] = np.zeros(CLASSES, np.float32)
    return w


# --- numpy CNN (NHWC inside, im2col) -------------------------------------------------------------
def _patches(x: np.ndarray) -> np.ndarray:
    """3x3 patches of NHWC ``x`` padded by 1: ``(N, H, W, C * 9)``, index ``c * 9 + kh * 3 + kw``
    (the order of an OIHW weight reshaped to ``(K, C * 9)``)."""
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    p = np.stack([xp[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=-1)
    return p.reshape(n, h, w, c * 9)


def _conv_backward(dz: np.ndarray, patches: np.ndarray, weight: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of a 3x3 padding-1 conv: ``(d input, d weight, d bias)``."""
    n, h, w, k = dz.shape
    c = weight.shape[1]
    dw = (dz.reshape(-1, k).T @ patches.reshape(-1, c * 9)).reshape(weight.shape)
    dp = (dz @ weight.reshape(k, -1)).reshape(n, h, w, c, 9)
    dxp = np.zeros((n, h + 2, w + 2, c), np.float32)
    for t in range(9):
        i, j = divmod(t, 3)
        dxp[:, i:i + h, j:j + w, :] += dp[..., t]
    return dxp[:, 1:-1, 1:-1, :], dw, dz.sum(axis=(0, 1, 2))


def _forward(w: Weights, x_nhwc: np.ndarray, tape: list | None = None) -> np.ndarray:
    a = x_nhwc
    for i in range(1, len(CHANNELS)):
        weight = w[f"conv{i}.weight"]
        p = _patches(a)
        z = p @ weight.reshape(weight.shape[0], -1).T + w[f"conv{i}.bias"]
        if tape is not None:
            tape.append((p, z))
        a = np.maximum(z, 0)
    g = a.mean(axis=(1, 2))
    if tape is not None:
        tape.append(g)
    return g @ w["fc.weight"].T + w["fc.bias"]


def forward(weights: Weights, x: np.ndarray) -> np.ndarray:
    """Logits ``(N, 10)`` of NCHW images ``x`` ``(N, 1, 8, 8)``."""
    return _forward(weights, np.ascontiguousarray(x.transpose(0, 2, 3, 1)))


def _gradients(w: Weights, x_nhwc: np.ndarray, y: np.ndarray) -> tuple[float, Weights]:
    """Mean softmax cross-entropy of a batch and its gradient for every weight."""
    tape: list = []
    logits = _forward(w, x_nhwc, tape)
    g = tape.pop()
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    dl = prob
    dl[np.arange(n), y] -= 1.0
    dl /= n
    grads: Weights = {"fc.weight": dl.T @ g, "fc.bias": dl.sum(axis=0)}
    z_last = tape[-1][1]
    da = np.broadcast_to((dl @ w["fc.weight"])[:, None, None, :]
                         / (z_last.shape[1] * z_last.shape[2]), z_last.shape)
    for i in range(len(CHANNELS) - 1, 0, -1):
        p, z = tape[i - 1]
        dz = (da * (z > 0)).astype(np.float32)
        da, grads[f"conv{i}.weight"], grads[f"conv{i}.bias"] = _conv_backward(
            dz, p, w[f"conv{i}.weight"])
    return loss, grads


def _one_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread (threadpoolctl, a scikit-learn dependency): the matrices are
    small, and a busy machine slows threaded BLAS down by an order of magnitude."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1)


def train(data: Digits | None = None, epochs: int = EPOCHS, batch: int = BATCH,
          lr: float = LEARNING_RATE, seed: int = SEED, verbose: bool = False) -> Weights:
    """Train the CNN on ``data``'s training images: Adam (0.9, 0.999), learning rate ``lr``
    decayed by a cosine over ``epochs``, mini-batches of ``batch`` shuffled by ``seed``."""
    data = data or load_digits()
    with _one_blas_thread():
        return _train(data, epochs, batch, lr, seed, verbose)


def _train(data: Digits, epochs: int, batch: int, lr: float, seed: int,
           verbose: bool) -> Weights:
    rng = np.random.default_rng(seed)
    w = init_weights(seed)
    m1 = {k: np.zeros_like(v) for k, v in w.items()}
    m2 = {k: np.zeros_like(v) for k, v in w.items()}
    x = np.ascontiguousarray(data.x_train.transpose(0, 2, 3, 1))
    step = 0
    for epoch in range(epochs):
        rate = lr * 0.5 * (1.0 + np.cos(np.pi * epoch / epochs))
        order = rng.permutation(len(x))
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            loss, grads = _gradients(w, x[idx], data.y_train[idx])
            step += 1
            for k, gk in grads.items():
                m1[k] = 0.9 * m1[k] + 0.1 * gk
                m2[k] = 0.999 * m2[k] + 0.001 * gk * gk
                upd = (m1[k] / (1 - 0.9 ** step)) / (np.sqrt(m2[k] / (1 - 0.999 ** step)) + 1e-8)
                w[k] = (w[k] - rate * upd).astype(np.float32)
        if verbose:
            acc = accuracy(forward(w, data.x_test), data.y_test)
            print(f"epoch {epoch + 1}/{epochs}: loss {loss:.4f}, test top-1 {acc:.2f}%")
    return w


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in percent."""
    return float(100.0 * np.mean(np.argmax(logits, axis=1) == labels))


def save_weights(weights: Weights, path: str | Path = WEIGHTS_FILE) -> None:
    """Write ``weights`` as an ``.npz`` (one array per name)."""
    np.savez(path, **cast(dict[str, Any], weights))


def trained_weights(path: str | Path = WEIGHTS_FILE) -> Weights:
    """The cached trained weights (:data:`WEIGHTS_FILE`), or a fresh :func:`train` without it."""
    if Path(path).exists():
        with np.load(path) as f:
            return {k: f[k].astype(np.float32) for k in f.files}
    return train()


def with_near_dead_filter(weights: Weights, layer: str = "conv1", channel: int = 0,
                          value: float = 1e-12) -> Weights:
    """A copy of ``weights`` whose ``layer`` filter ``channel`` is ``value`` everywhere: a
    near-dead filter (its bias stays), whose per-channel weight scale is tiny."""
    w = {k: v.copy() for k, v in weights.items()}
    w[f"{layer}.weight"][channel] = value
    return w


# --- ONNX ----------------------------------------------------------------------------------------
def to_onnx(weights: Weights, batch: int = 1, name: str = "digits_cnn") -> onnx.ModelProto:
    """The float ONNX model (opset 17, input ``input`` ``(batch, 1, 8, 8)`` NCHW, output
    ``(batch, 10)`` logits); node names are :data:`LAYERS` plus ``relu1..3``, ``avgpool``,
    ``flatten``."""
    nodes, inits = [], []
    y = INPUT_NAME
    for i in range(1, len(CHANNELS)):
        for part in ("weight", "bias"):
            inits.append(numpy_helper.from_array(weights[f"conv{i}.{part}"], f"conv{i}.{part}"))
        nodes.append(helper.make_node("Conv", [y, f"conv{i}.weight", f"conv{i}.bias"],
                                      [f"conv{i}_out"], name=f"conv{i}", kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1], strides=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}_out"], [f"relu{i}_out"],
                                      name=f"relu{i}"))
        y = f"relu{i}_out"
    nodes.append(helper.make_node("GlobalAveragePool", [y], ["avgpool_out"], name="avgpool"))
    nodes.append(helper.make_node("Flatten", ["avgpool_out"], ["flatten_out"], name="flatten",
                                  axis=1))
    inits.append(numpy_helper.from_array(weights["fc.weight"], "fc.weight"))
    inits.append(numpy_helper.from_array(weights["fc.bias"], "fc.bias"))
    nodes.append(helper.make_node("Gemm", ["flatten_out", "fc.weight", "fc.bias"], ["logits"],
                                  name="fc", transB=1))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT,
                                                    [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="tvm_accel.datasets.digits")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main(argv: list[str] | None = None) -> int:
    """Regenerate :data:`WEIGHTS_FILE` (``python -m tvm_accel.datasets.digits``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(WEIGHTS_FILE), help="weights .npz to write")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    args = ap.parse_args(argv)
    data = load_digits()
    t = time.perf_counter()
    w = train(data, epochs=args.epochs, verbose=True)
    print(f"trained in {time.perf_counter() - t:.1f} s: test top-1 "
          f"{accuracy(forward(w, data.x_test), data.y_test):.2f}%")
    save_weights(w, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
