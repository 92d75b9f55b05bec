"""Per-layer A/B of the int8 plans' depthwise convs between two qgemm variants (3: AVX2 float lanes, 4: AVX-512
VNNI quads, kernels/host/qdepthwise_lanes.c), beside the fp32 plan's depthwise steps, in one process.

The models are ``bench_int8.py``'s (by default the zoo's MobileNetV2 and EfficientNet-Lite0, 224x224,
quantized with ``quantize_static``).  Each plan is run once in order to give every depthwise step its own inputs; then
each step is called ``--calls`` times, variant A, variant B and the fp32 plan's step in turn, so a busy
neighbour slows all three alike; minimums and medians per layer (us) and summed by stride.  The two variants'
outputs are checked equal first (each variant computes the same integers).

    .venv/bin/python benchmarks/bench_int8_depthwise.py --threads 1,2 --calls 200
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_int8  # noqa: E402

import optcli  # noqa: E402
from optcli.native import library, qgemm  # noqa: E402
from optcli.zoo import build  # noqa: E402


def depthwise_steps(predictor, feeds: dict) -> list[tuple]:
    """(step, fn, args) of each grouped conv of the plan, args as the plan run in order gives them."""
    ex = predictor._executor
    env = dict(ex.plan.weights)
    env.update(feeds)
    out = []
    with predictor._limiter:
        for step, fn in zip(ex.plan.steps, ex.fns):
            args = [env[n] if n else None for n in step.inputs]
            env.update({n: a for n, a in zip(step.outputs, fn(args)) if n})
            if step.op_type in ("QConv", "Conv") and int(step.attrs.get("group", 1)) > 1:
                out.append((step, fn, args))
    return out


def timed(fn, args) -> float:
    start = time.perf_counter()
    fn(args)
    return time.perf_counter() - start


def compare(label: str, threads: int, int8: list, fp32: list, variants: tuple[int, int], calls: int) -> None:
    """Each layer's calls under both variants and the fp32 plan's step, interleaved; a markdown table."""
    a, b = variants
    print(f"\n## {label}, {threads} thread(s), {calls} calls each; us")
    print(f"| layer | C | in HxW | k | s | fp32 min | v{a} min | v{b} min | v{b}/v{a} | v{a} med | v{b} med |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    sums: dict = collections.defaultdict(float)
    for i, ((step, fn, args), (_, fn32, args32)) in enumerate(zip(int8, fp32)):
        times: dict = {a: [], b: [], 0: []}
        for _ in range(calls):
            for v in (a, b):
                qgemm.variant(v)
                times[v].append(timed(fn, args))
            times[0].append(timed(fn32, args32))
        low = {v: min(t) * 1e6 for v, t in times.items()}
        mid = {v: statistics.median(times[v]) * 1e6 for v in (a, b)}
        stride = step.attrs.get("strides", [1])[0]
        for v in times:
            sums[stride, v] += low[v]
        x, k = args[0], step.attrs.get("kernel_shape")
        print(f"| {i} | {x.shape[1]} | {x.shape[2]}x{x.shape[3]} | {k[0]}x{k[1]} | {stride} | {low[0]:.1f} | "
              f"{low[a]:.1f} | {low[b]:.1f} | {low[b] / low[a]:.2f} | {mid[a]:.1f} | {mid[b]:.1f} |")
    for stride in sorted({s for s, _ in sums}):
        fp, va, vb = sums[stride, 0], sums[stride, a], sums[stride, b]
        print(f"| sum, stride {stride} | | | | | {fp:.1f} | {va:.1f} | {vb:.1f} | {vb / va:.2f} | | |")
    total = {v: sum(t for (_, w), t in sums.items() if w == v) for v in (0, a, b)}
    print(f"| sum | | | | | {total[0]:.1f} | {total[a]:.1f} | {total[b]:.1f} | {total[b] / total[a]:.2f} | | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--variants", default="3,4", help="the two qgemm variants to compare")
    ap.add_argument("--models", default="MobileNetV2,EfficientNet-Lite0", help=f"of {', '.join(bench_int8.MODELS)}")
    args = ap.parse_args()
    variants = tuple(int(v) for v in args.variants.split(","))
    for v in variants:
        if qgemm.variant(v) != v:
            sys.exit(f"this CPU has no qgemm variant {v}")
    for label in args.models.split(","):
        model = build(bench_int8.MODELS[label], resolution=224)
        inp = model.graph.input[0]
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        with tempfile.TemporaryDirectory() as tmp:
            fp32, qdq = bench_int8.quantize(model, Path(tmp), shape, inp.name)
            plans = [optcli.optimize(model_file=str(p), valid_targets="arm") for p in (fp32, qdq)]
        feeds = {inp.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        steps32, steps8 = (depthwise_steps(optcli.load(p.data, threads=1), feeds) for p in plans)
        if not steps8 or len(steps8) != len(steps32):
            print(f"\n## {label}: {len(steps8)} int8 and {len(steps32)} fp32 depthwise steps: nothing to compare")
            continue
        for step, fn, xs in steps8:
            outs = []
            for v in variants:
                qgemm.variant(v)
                outs.append(fn(xs)[0])
            assert np.array_equal(outs[0], outs[1]), f"{step.name}: variants {variants} differ"
        for threads in (int(t) for t in args.threads.split(",")):
            old = library.set_num_threads(threads)
            compare(label, threads, steps8, steps32, variants, args.calls)
            library.set_num_threads(old)
    qgemm.variant(0)


if __name__ == "__main__":
    main()
