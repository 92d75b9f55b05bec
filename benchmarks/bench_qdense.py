"""Per-layer A/B of the integer dense convs: qgemm variant 3 (the int16 vpmaddwd GEMM, kernels/host/qgemm.c)
against variant 4 (vpdpbusd, kernels/host/qpointwise.c: optcli_qconv2d_dense) on the zoo ResNet-18's convs
and the 3x3 stems, one step prepared per variant (steps are packed for the variant in use when prepared),
interleaved call by call; minimums and medians (thread_time on 1 thread, perf_counter otherwise).

    .venv/bin/python benchmarks/bench_qdense.py [threads] [runs]
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from optcli.native import library, qgemm  # noqa: E402
from optcli.ops.qconv import multiplier  # noqa: E402

# name, (C, H, W, M, k, stride, pad)
LAYERS = [  # the zoo's ResNet-18 (width 0.25) at 224, and the stems of MobileNetV2 (width 0.5) and EfficientNet-Lite0
    ("R18 stem 7x7 s2 3->16 224", (3, 224, 224, 16, 7, 2, 3), 1),
    ("R18 l1 3x3 16->16 56", (16, 56, 56, 16, 3, 1, 1), 4),
    ("R18 l2.0 3x3 s2 16->32 56", (16, 56, 56, 32, 3, 2, 1), 1),
    ("R18 l2 3x3 32->32 28", (32, 28, 28, 32, 3, 1, 1), 3),
    ("R18 l3.0 3x3 s2 32->64 28", (32, 28, 28, 64, 3, 2, 1), 1),
    ("R18 l3 3x3 64->64 14", (64, 14, 14, 64, 3, 1, 1), 3),
    ("R18 l4.0 3x3 s2 64->128 14", (64, 14, 14, 128, 3, 2, 1), 1),
    ("R18 l4 3x3 128->128 7", (128, 7, 7, 128, 3, 1, 1), 3),
    ("R18 down 1x1 s2 16->32", (16, 56, 56, 32, 1, 2, 0), 1),
    ("R18 down 1x1 s2 32->64", (32, 28, 28, 64, 1, 2, 0), 1),
    ("R18 down 1x1 s2 64->128", (64, 14, 14, 128, 1, 2, 0), 1),
    ("MNv2 stem 3x3 s2 3->16 224", (3, 224, 224, 16, 3, 2, 1), 1),
    ("Effnet stem 3x3 s2 3->32 224", (3, 224, 224, 32, 3, 2, 1), 1),
]

def prepare(spec, v, seed):
    """(x, the step's call, its kernel) for one layer with the weights packed on variant v."""
    rng = np.random.default_rng(seed)
    c, h, w_, m, k, s, p = spec
    oh, ow = (h + 2 * p - k) // s + 1, (w_ + 2 * p - k) // s + 1
    x = rng.integers(0, 256, (1, c, h, w_), dtype=np.uint8)
    w = rng.integers(-128, 128, (m, c, k, k), dtype=np.int8)
    b = rng.integers(-1000, 1000, m).astype(np.int32)
    mult = multiplier(dict(x_scale=0.02, w_scale=[0.001] * m, y_scale=0.5), m)
    geom = (1, c, h, w_, m, k, k, s, s, 1, 1, p, p, oh, ow, 1)
    qp = (3, 5, 0, 255, 0, 0)
    assert qgemm.variant(v) == v
    call = qgemm.prepared_qconv(x.shape, x.dtype, w, b, mult, geom, qp, np.dtype(np.uint8))
    return x, call, qgemm.prepared_weights(w, b, geom, qp)[0]


def timed(calls, runs, clock):
    """Each variant's call times, the variants interleaved call by call."""
    t = {v: [] for v in calls}
    for _ in range(runs):
        for v, (x, c) in calls.items():
            qgemm.variant(v)
            t0 = clock()
            c(x)
            t[v].append(clock() - t0)
    return t


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    library.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    mins, meds, sum3x3 = {3: 0.0, 4: 0.0}, {3: 0.0, 4: 0.0}, {3: 0.0, 4: 0.0}
    print(f"threads {threads}, runs {runs}, clock {clock.__name__}; ms")
    print(f"{'layer':36s} {'n':>2s} {'v3 min':>8s} {'v4 min':>8s} {'v3 med':>8s} {'v4 med':>8s} {'ratio':>6s}  kinds")
    for name, spec, count in LAYERS:
        (x, c3, k3), (_, c4, k4) = prepare(spec, 3, len(name)), prepare(spec, 4, len(name))
        qgemm.variant(3)
        y3 = c3(x)
        qgemm.variant(4)
        assert np.array_equal(y3, c4(x)), name
        t = timed({3: (x, c3), 4: (x, c4)}, runs, clock)
        mn = {v: min(t[v]) * 1e3 for v in t}
        md = {v: statistics.median(t[v]) * 1e3 for v in t}
        for v in t:
            mins[v] += mn[v] * count
            meds[v] += md[v] * count
            if "3x3" in name and "R18" in name:
                sum3x3[v] += mn[v] * count
        print(f"{name:36s} {count:2d} {mn[3]:8.3f} {mn[4]:8.3f} {md[3]:8.3f} {md[4]:8.3f} {mn[3] / mn[4]:6.2f}  "
              f"{k3}/{k4}")
    print(f"{'R18 3x3 convs summed (x count)':36s}    {sum3x3[3]:8.3f} {sum3x3[4]:8.3f}")
    print(f"{'all summed (x count)':36s}    {mins[3]:8.3f} {mins[4]:8.3f} {meds[3]:8.3f} {meds[4]:8.3f}")
    qgemm.variant(0)


if __name__ == "__main__":
    main()
