"""Time the integer dense layers (``optcli.QMatMul``, pass ``fuse_qdq_matmul``) against the float view they
replace (``fold_qdq``: FakeQuant, float MatMul / Gemm of the dequantized weights, FakeQuant), in one process.

For each model: onnxruntime's quantize_static QDQ model (bench_int8's recipe: per channel, u8 activations,
s8 weights) compiled for ``arm`` twice, with and without ``fuse_qdq_matmul``.  The steps the two plans do not
share (the old plan's head, the new plan's QMatMul) are each run on their own inputs, old and new interleaved
call by call, minimum and median kept; then the whole plans, interleaved run by run.  Models: bench_int8's
conv nets at full size (their classifier heads: x [1, 1280 or 512] by [K, 1000]), and a transformer-like
stack of quantized MatMuls (x [1, N, K] with N rows).

    .venv/bin/python benchmarks/bench_qmatmul.py --threads 2 --runs 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optcli  # noqa: E402
from benchmarks.bench_int8 import MODELS, quantize  # noqa: E402
from optcli.zoo import build  # noqa: E402


def dense_stack(rows: int, width: int, layers: int) -> onnx.ModelProto:
    """x [1, rows, width] -> (MatMul [width, 2 width] -> Relu -> MatMul [2 width, width] -> Relu) x layers."""
    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for i in range(layers):
        for j, (k, m) in enumerate(((width, 2 * width), (2 * width, width))):
            w = f"w{i}_{j}"
            inits.append(numpy_helper.from_array((rng.standard_normal((k, m)) / np.sqrt(k)).astype(np.float32), w))
            nodes += [helper.make_node("MatMul", [cur, w], [f"m{i}_{j}"]),
                      helper.make_node("Relu", [f"m{i}_{j}"], [f"r{i}_{j}"])]
            cur = f"r{i}_{j}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _key(step) -> tuple:
    return step.op_type, tuple(step.outputs)


def _env(predictor, feeds: dict) -> tuple[list, dict]:
    """(the plan's (step, function) pairs, every value of one run)."""
    ex = predictor._executor
    env = dict(ex.plan.weights)
    env.update(feeds)
    with predictor._limiter:
        for step, fn in zip(ex.plan.steps, ex.fns):
            env.update({n: a for n, a in zip(step.outputs, fn([env[n] if n else None for n in step.inputs])) if n})
    return list(zip(ex.plan.steps, ex.fns)), env


def differing_steps(old, new, feeds: dict, runs: int) -> tuple[list, list]:
    """Per step of each plan that the other lacks: (kind, min ms, median ms), timed old and new interleaved."""
    (a_steps, a_env), (b_steps, b_env) = _env(old, feeds), _env(new, feeds)
    a_keys, b_keys = {_key(s) for s, _ in a_steps}, {_key(s) for s, _ in b_steps}
    a_only = [(s, f) for s, f in a_steps if _key(s) not in b_keys]
    b_only = [(s, f) for s, f in b_steps if _key(s) not in a_keys]
    times = {id(s): [] for s, _ in a_only + b_only}
    with old._limiter, new._limiter:
        for _ in range(runs):
            for group, env in ((a_only, a_env), (b_only, b_env)):
                for s, f in group:
                    args = [env[n] if n else None for n in s.inputs]
                    t = time.perf_counter()
                    f(args)
                    times[id(s)].append((time.perf_counter() - t) * 1e3)

    def rows(group):
        return [(s.op_type, min(times[id(s)]), statistics.median(times[id(s)])) for s, _ in group]

    return rows(a_only), rows(b_only)


def whole(old, new, feeds: dict, runs: int) -> tuple[tuple[float, float], tuple[float, float]]:
    t_old, t_new = [], []
    for _ in range(runs):
        for p, acc in ((old, t_old), (new, t_new)):
            t = time.perf_counter()
            p.run(feeds)
            acc.append((time.perf_counter() - t) * 1e3)
    return (min(t_old), statistics.median(t_old)), (min(t_new), statistics.median(t_new))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--models", default=",".join([*MODELS, "stack-N128", "stack-N1"]))
    args = ap.parse_args()
    for label in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if label.startswith("stack-N"):
                model = dense_stack(int(label[7:]), 256, 2)
            else:
                model = build(MODELS[label], full=True)  # 1000 classes: a real head
            inp = model.graph.input[0]
            shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
            _, qdq = quantize(model, Path(tmp), shape, inp.name)
            new_r = optcli.optimize(model_file=str(qdq), valid_targets="arm")
            old_r = optcli.optimize(model_file=str(qdq), valid_targets="arm", disabled_passes=["fuse_qdq_matmul"])
        new, old = optcli.load(new_r.data, threads=args.threads), optcli.load(old_r.data, threads=args.threads)
        feeds = {inp.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        out = model.graph.output[0].name
        diff = np.abs(new.run(feeds)[out] - old.run(feeds)[out]).max()
        a_rows, b_rows = differing_steps(old, new, feeds, args.runs)
        print(f"{label} ({args.threads} threads, {args.runs} interleaved calls; max |new - old| {diff:.4g})")
        for name, rows in (("old", a_rows), ("new", b_rows)):
            for op, lo, med in rows:
                print(f"  {name} {op:<18} min {lo:8.4f} ms  median {med:8.4f} ms")
            print(f"  {name} summed            min {sum(r[1] for r in rows):8.4f} ms  median "
                  f"{sum(r[2] for r in rows):8.4f} ms")
        (o_min, o_med), (n_min, n_med) = whole(old, new, feeds, max(args.runs // 2, 100))
        print(f"  whole plan: old min {o_min:.3f} median {o_med:.3f} ms; new min {n_min:.3f} median {n_med:.3f} ms")


if __name__ == "__main__":
    main()
