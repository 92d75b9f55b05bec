"""Per-layer timings of the GEMM convs on the host target: optcli's native GEMM (bias and
activation fused, im2col columns gathered while packing) against the same kernel on numpy's BLAS
plus the native one-pass epilogue, and against onnxruntime running the one Conv (+ Relu) node.

The layer shapes are the 1x1 convs of MobileNetV2 / EfficientNet-Lite0, the narrow 1x1 convs on
[1, C, 1, 1] of squeeze-excitation blocks and of MobileNetV3's conv head, the 3x3 / 7x7 convs of
ResNet-18 at 224x224, and the classifier heads (optcli.FullyConnected, against onnxruntime's Gemm;
its BLAS column is numpy's x @ W + b).  Each runs in blocks of calls, forth and back (BLAS and onnxruntime leave
their threads spinning after a call, which slows whatever runs next: each block starts with
untimed calls), and the minimum of ``--runs`` calls is kept.  Not a test: timings belong to a
quiet machine.

    python benchmarks/bench_gemm.py --threads 2 --runs 40
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np
import onnxruntime as ort
import threadpoolctl
from onnx import TensorProto, helper, numpy_helper

from optcli import native
from optcli.ops import conv, gemm

# (label, x shape, w shape, attrs); attrs None: a FullyConnected head, w [K, N]
LAYERS = [(f"1x1 {c}->{m} @{s}", (1, c, s, s), (m, c, 1, 1), {}) for c, m, s in [
    (32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28), (32, 192, 28),
    (192, 32, 28), (192, 64, 14), (64, 384, 14), (384, 64, 14), (384, 96, 14), (96, 576, 14), (576, 96, 14),
    (576, 160, 7), (160, 960, 7), (960, 160, 7), (960, 320, 7), (320, 1280, 7)]] + [
    ("7x7/2 3->64 @224", (1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ("3x3 64->64 @56", (1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3/2 64->128 @56", (1, 64, 56, 56), (128, 64, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("3x3 128->128 @28", (1, 128, 28, 28), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3 256->256 @14", (1, 256, 14, 14), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3 512->512 @7", (1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1, 1, 1, 1]}),
] + [(f"1x1 {c}->{m} @1", (1, c, 1, 1), (m, c, 1, 1), {}) for c, m in [
    (576, 1024), (960, 1280), (72, 24), (24, 72), (240, 64), (64, 240), (960, 240), (240, 960)]] + [
    (f"FC {k}->{n}", (1, k), (k, n), None) for k, n in [(1024, 1000), (1280, 1000), (2048, 1000), (512, 10)]]


def report(label: str, us: np.ndarray, totals: np.ndarray) -> None:
    totals += us
    print(f"{label:22s} {us[0]:9.1f} {us[1]:9.1f} {us[2]:9.1f}  {us[0] / us[1]:10.2f}x {us[0] / us[2]:10.2f}x")


def ort_nodes(nodes: list, x: np.ndarray, w: np.ndarray, b: np.ndarray, threads: int):
    """onnxruntime session of nodes reading x and the constants w and b, writing y."""
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})


def ort_layer(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict, threads: int):
    """onnxruntime session of Conv + Relu with constant weights, as an exporter writes it."""
    return ort_nodes([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                      helper.make_node("Relu", ["c"], ["y"])], x, w, b, threads)


def ort_fc(x: np.ndarray, w: np.ndarray, b: np.ndarray, threads: int):
    """onnxruntime session of one Gemm with a constant weight and bias."""
    return ort_nodes([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], x, w, b, threads)


def fc_calls(x: np.ndarray, w: np.ndarray, b: np.ndarray, threads: int) -> list:
    """FullyConnected natively, in numpy (BLAS), and onnxruntime's Gemm."""
    def blas():
        with mock.patch.object(native, "available", lambda: False):
            return gemm.fully_connected([x, w, b], {})

    return [lambda: gemm.fully_connected([x, w, b], {}), blas, ort_fc(x, w, b, threads)]



def best_of(calls: list, runs: int) -> np.ndarray:
    """The minimum time of each call in microseconds over ``runs`` calls, in blocks forth and back,
    each warmed up: a block's first calls meet the spinning threads of the one before."""
    best = [float("inf")] * len(calls)
    order = list(range(len(calls)))
    for i in order + order[::-1]:
        for rep in range(runs // 2 + 3):
            t = time.perf_counter()
            calls[i]()
            if rep >= 3:
                best[i] = min(best[i], time.perf_counter() - t)
    return np.array(best) * 1e6


def setup(doc: str) -> argparse.Namespace:
    """The benchmarks' command line (--threads, --runs), with the native pool sized to it."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    if not native.available():
        raise SystemExit(native.status())
    native.set_num_threads(args.threads)
    return args


def layer_data(rng: np.random.Generator, xs: tuple, ws: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Input, weights (scaled as initialised) and bias of one layer."""
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    return x, w, rng.standard_normal(ws[0]).astype(np.float32)


def main() -> None:
    args = setup(__doc__)
    rng = np.random.default_rng(0)
    totals = np.zeros(3)
    print(f"{'layer':22s} {'native':>9s} {'BLAS+ep':>9s} {'ort':>9s}  native/BLAS  native/ort"
          f"   (us, min of {args.runs})")
    with threadpoolctl.threadpool_limits(args.threads, user_api="blas"):
        for label, xs, ws, attrs in LAYERS:
            x = rng.standard_normal(xs).astype(np.float32)
            if attrs is None:  # a classifier head
                w = (rng.standard_normal(ws) / np.sqrt(ws[0])).astype(np.float32)
                calls = fc_calls(x, w, rng.standard_normal(ws[1]).astype(np.float32), args.threads)
                report(label, best_of(calls, args.runs), totals)
                continue
            w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
            b = rng.standard_normal(ws[0]).astype(np.float32)
            kernel = conv.conv_1x1 if ws[2:] == (1, 1) and not attrs else conv.conv_im2col
            full = {"kernel_shape": list(ws[2:]), "activation": "relu", **attrs}

            def blas(kernel=kernel, x=x, w=w, b=b, full=full):
                with mock.patch.object(conv, "_native_gemm", lambda *a, **k: False):
                    return kernel([x, w, b], dict(full))

            calls = [lambda kernel=kernel, x=x, w=w, b=b, full=full: kernel([x, w, b], dict(full)), blas,
                     ort_layer(x, w, b, attrs, args.threads)]
            report(label, best_of(calls, args.runs), totals)
    print(f"{'total':22s} {totals[0]:9.0f} {totals[1]:9.0f} {totals[2]:9.0f}  {totals[0] / totals[1]:10.2f}x "
          f"{totals[0] / totals[2]:10.2f}x")


if __name__ == "__main__":
    main()
