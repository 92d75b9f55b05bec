"""Per-layer timings of the blocked (NCHWc) window kernels (optcli/native/blocked_window.py) against
the NCHW native kernels for the same layer: depthwise convs of MobileNetV2/V3 and EfficientNet-Lite
("same" pads, relu or hard_swish fused), max pooling, and global average pooling (against
native.row_mean).  Calls alternate between the two kernels (each block starts with an untimed call)
and the minimum of ``--runs`` calls is kept.  Not a test: timings belong to a quiet machine.

    python benchmarks/bench_blocked_window.py --threads 2 1 --runs 40
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from optcli import native
from optcli.native import blocked_window as bw

# (channels, size, kernel, stride, activation)
DEPTHWISE = [(16, 112, 3, 2, "relu"), (72, 56, 3, 2, "relu"), (88, 28, 3, 1, "relu"), (96, 28, 5, 2, "hard_swish"),
             (240, 14, 5, 1, "hard_swish"), (576, 7, 5, 1, "hard_swish"), (32, 112, 3, 1, "relu"),
             (144, 56, 3, 1, "relu"), (1152, 7, 5, 1, "relu"), (480, 14, 3, 1, "relu")]
# (channels, size, kernel, stride, pad)
MAX_POOL = [(64, 112, 3, 2, 1), (24, 128, 2, 2, 0), (48, 64, 2, 2, 0)]
GLOBAL_AVG = [(576, 7), (1280, 7)]


def best_of(fns, runs: int) -> list[float]:
    """Each function's minimum time in us over ``runs`` rounds, the functions interleaved."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return [b * 1e6 for b in best]


def same(size: int, k: int, s: int) -> tuple[int, int]:
    """(pad_begin, out) of "same" padding (SAME_UPPER)."""
    out = -(-size // s)
    total = max(0, (out - 1) * s + k - size)
    return total // 2, out


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    n, c, h, w = x.shape
    cb = -(-c // block)
    y = np.zeros((n, cb * block, h, w), np.float32)
    y[:, :c] = x
    return np.ascontiguousarray(y.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def cases(block: int, rng):
    """(label, NCHW call, blocked call) per layer."""
    for c, size, k, s, act in DEPTHWISE:
        x = rng.standard_normal((1, c, size, size)).astype(np.float32)
        w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        p, o = same(size, k, s)
        nchw = native.prepared_depthwise_conv2d(x.shape, w, b, (s, s), (1, 1), (p, p), (o, o), act, 0.0, 0.0)
        xb = to_blocked(x, block)
        blocked = bw.prepared_depthwise_conv2d_blocked(xb.shape, bw.pack_depthwise_weights(w, block), b, (k, k),
                                                       (s, s), (1, 1), (p, p), (o, o), act, 0.0, 0.0)
        yield f"dw {c}@{size} {k}x{k} s{s} {act}", lambda x=x, f=nchw: f(x), lambda x=xb, f=blocked: f(x)
    for c, size, k, s, p in MAX_POOL:
        x = rng.standard_normal((1, c, size, size)).astype(np.float32)
        o = (size + 2 * p - k) // s + 1
        xb = to_blocked(x, block)
        args = ((k, k), (s, s), (1, 1), (p, p), (o, o))
        yield (f"max {c}@{size} {k}x{k} s{s}", lambda x=x, a=args: native.pool2d(x, "max", *a),
               lambda x=xb, a=args: bw.pool2d_blocked(x, "max", *a))
    for c, size in GLOBAL_AVG:
        x = rng.standard_normal((1, c, size, size)).astype(np.float32)
        xb = to_blocked(x, block)
        yield (f"gap {c}@{size}", lambda x=x, n=size * size: native.row_mean(x, n),
               lambda x=xb: bw.global_average_pool_blocked(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    assert native.available(), native.status()
    block = native.library._lib.optcli_gemm_variant(-1)
    rng = np.random.default_rng(0)
    print(f"block {block}; minimum of {args.runs} interleaved runs, us")
    print(f"{'layer':32s} {'threads':>7s} {'NCHW':>8s} {'blocked':>8s} {'speed-up':>9s}")
    for threads in args.threads:
        old = native.set_num_threads(threads)
        for label, nchw, blocked in cases(block, rng):
            a, b = best_of([nchw, blocked], args.runs)
            print(f"{label:32s} {threads:7d} {a:8.1f} {b:8.1f} {a / b:8.2f}x")
        native.set_num_threads(old)


if __name__ == "__main__":
    main()
