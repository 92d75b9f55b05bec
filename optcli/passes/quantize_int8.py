"""Full int8 post-training quantization (``opt --quant_type=INT8 --calib_data=DIR``).

Conv, ConvTranspose, Gemm, MatMul and FullyConnected get int8 weights (symmetric, per output
channel: stored as int8 in the `.nb`) and int8 activations (asymmetric, per tensor: a FakeQuant
step in front of the op, scale and zero point in its attributes).  Activation ranges come from
running the float model on the calibration samples with one of three calibrators:

* ``minmax``: the observed range;
* ``percentile``: the 0.01st..99.99th percentiles (ignores rare outliers);
* ``entropy``: the clipping threshold that minimises the KL divergence between the observed
  histogram and its 8-bit quantization (TensorRT's method).

Every target then runs a faithful float view of the int8 model (see docs/quantization.md for why
the host does not switch to integer arithmetic).  With ``--precision=auto`` ops are quantized one
by one in order of measured sensitivity, and an op whose quantization would push the outputs'
error over the budget stays in float; the report lists them.
"""

from __future__ import annotations

import numpy as np

from optcli.errors import UsageError
from optcli.ir import OPTCLI_DOMAIN, Graph, Node, Value
from optcli.ops.evaluate import evaluate_node
from optcli.ops.quant import fake_quant
from optcli.ops.weight_quant import dequantize, quantize
from optcli.passes.base import PassContext
from optcli.progress import progress
from optcli.tolerance import RELATIVE, max_error

NAME = "quantize_int8"
DESCRIPTION = "int8 post-training quantization: calibrated FakeQuant activations, int8 per-channel weights"

CALIBRATORS = ("minmax", "percentile", "entropy")
_TARGET_OPS = {("", "Conv"): 0, ("", "ConvTranspose"): 1, ("", "Gemm"): None, ("", "MatMul"): -1,
               (OPTCLI_DOMAIN, "FullyConnected"): -1}
BINS = 2048


def _weight_axis(node: Node, w: np.ndarray) -> int:
    axis = _TARGET_OPS[(node.domain, node.op_type)]
    if axis is None:  # Gemm: output channels are B's columns, or rows with transB
        axis = 0 if int(node.attrs.get("transB", 0)) else -1
    return axis % w.ndim


def quantizable(graph: Graph) -> list[Node]:
    ops = []
    for node in graph.nodes:
        if (node.domain, node.op_type) not in _TARGET_OPS or len(node.inputs) < 2:
            continue
        w = graph.const(node.inputs[1])
        if w is not None and w.dtype == np.float32 and w.ndim >= 2 and graph.const(node.inputs[0]) is None \
                and graph.dtype_of(node.inputs[0]) == "float32":
            ops.append(node)
    return ops


def _run(graph: Graph, feeds: dict, quantized: dict[int, tuple[dict, np.ndarray]] | None = None,
         watch: set[str] | None = None) -> tuple[dict, dict]:
    """Run the graph; nodes in ``quantized`` (by id) see fake-quantized activations and weights.
    Returns (outputs, watched values)."""
    env = {**graph.initializers, **feeds}
    seen = {}
    for node in graph.nodes:
        args = [env[i] if i else None for i in node.inputs]
        if quantized and id(node) in quantized:
            attrs, w = quantized[id(node)]
            args[0] = fake_quant([args[0]], attrs)[0]
            args[1] = w
        for name, value in zip(node.outputs, evaluate_node(node, args, graph.opsets)):
            if name:
                env[name] = value
                if watch and name in watch:
                    seen[name] = value
        for name in node.inputs:
            if watch and name in watch and name in env:
                seen[name] = env[name]
    return {v.name: env[v.name] for v in graph.outputs}, seen


class _Stats:
    def __init__(self):
        self.lo, self.hi, self.hist, self.edges = np.inf, -np.inf, None, None

    def observe_range(self, x: np.ndarray) -> None:
        self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))

    def observe_hist(self, x: np.ndarray) -> None:
        if self.edges is None:
            lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
            self.edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, BINS + 1)
            self.hist = np.zeros(BINS, np.float64)
        self.hist += np.histogram(x, bins=self.edges)[0]


def _params(lo: float, hi: float) -> dict:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = float(np.clip(np.rint(-128 - lo / scale), -128, 127))
    return {"scale": float(scale), "zero_point": zp, "qmin": -128.0, "qmax": 127.0}


def _percentile_range(s: _Stats, q: float = 1e-4) -> tuple[float, float]:
    cdf = np.cumsum(s.hist) / max(s.hist.sum(), 1)
    lo = s.edges[np.searchsorted(cdf, q)]
    hi = s.edges[min(np.searchsorted(cdf, 1 - q) + 1, BINS)]
    return float(lo), float(hi)


def _kl_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = 128) -> float:
    """TensorRT's entropy calibration on a histogram of |x|: the threshold minimising KL(P || Q)."""
    best, best_t = np.inf, edges[-1]
    total = hist.sum()
    if total == 0:
        return float(edges[-1])
    hist = hist.astype(np.float64)
    for i in range(levels, len(hist) + 1, 16):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()  # clipped mass goes to the last bin
        # Q: hist[:i] merged into `levels` bins, each spread evenly over its non-empty source bins.
        starts = np.linspace(0, i, levels + 1).astype(int)[:-1]
        lengths = np.diff(np.append(starts, i))
        nonzero = hist[:i] > 0
        sums = np.add.reduceat(hist[:i], starts)
        counts = np.maximum(np.add.reduceat(nonzero.astype(np.float64), starts), 1)
        q = np.repeat(sums / counts, lengths) * nonzero
        p, q = p / p.sum(), q / max(q.sum(), 1e-12)
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if kl < best:
            best, best_t = kl, edges[i]
    return float(best_t)


def _entropy_range(s: _Stats) -> tuple[float, float]:
    # Histogram of |x| from the signed histogram, then the KL threshold.
    centers = (s.edges[:-1] + s.edges[1:]) / 2
    amax = max(abs(s.lo), abs(s.hi), 1e-12)
    abs_edges = np.linspace(0, amax, BINS + 1)
    abs_hist = np.histogram(np.abs(centers), bins=abs_edges, weights=s.hist)[0]
    t = _kl_threshold(abs_hist, abs_edges)
    return (0.0 if s.lo >= 0 else -t), t


def calibrate(graph: Graph, samples: list[dict], names: set[str], method: str) -> dict[str, dict]:
    stats = {n: _Stats() for n in names}
    for feeds in progress(samples, desc="calibrating (ranges)", total=len(samples), unit="samples"):
        for name, x in _run(graph, feeds, watch=names)[1].items():
            stats[name].observe_range(x)
    if method != "minmax":
        for feeds in progress(samples, desc=f"calibrating ({method})", total=len(samples), unit="samples"):
            for name, x in _run(graph, feeds, watch=names)[1].items():
                stats[name].observe_hist(x)
    params = {}
    for name, s in stats.items():
        if not np.isfinite(s.lo):
            continue
        lo, hi = (s.lo, s.hi) if method == "minmax" else (
            _percentile_range(s) if method == "percentile" else _entropy_range(s))
        params[name] = _params(lo, hi)
    return params


def _quantized_weight(w: np.ndarray, axis: int) -> np.ndarray:
    q, scales = quantize(w, "int8", axis)
    return dequantize(q, "int8", axis, scales)


def _output_error(reference: list[dict], got: list[dict]) -> float:
    worst = 0.0
    for ref, out in zip(reference, got):
        for name, r in ref.items():
            err, scale = max_error(out[name], r)
            worst = max(worst, err / scale)
    return worst


def choose_ops(graph: Graph, ops: list[Node], plan: dict, samples: list[dict], budget: float,
               ) -> tuple[list[Node], list[dict]]:
    """``--precision=auto``: quantize ops in order of sensitivity while the error fits the budget."""
    probe = samples[: min(4, len(samples))]
    reference = [_run(graph, f)[0] for f in probe]
    sensitivity = []
    for node in progress(ops, desc="measuring per-op int8 error", total=len(ops), unit="ops"):
        err = _output_error(reference, [_run(graph, f, {id(node): plan[id(node)]})[0] for f in probe])
        sensitivity.append((err, node))
    chosen: dict[int, tuple] = {}
    kept: list[dict] = []
    for err, node in sorted(sensitivity, key=lambda t: t[0]):
        trial = {**chosen, id(node): plan[id(node)]}
        total = _output_error(reference, [_run(graph, f, trial)[0] for f in probe])
        if total <= budget:
            chosen = trial
        else:
            kept.append({"node": node.name, "op": node.op_type, "alone": err, "with_others": total})
    return [n for n in ops if id(n) in chosen], kept


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if ctx.int8 is None:
        return {}
    method = ctx.int8.calibrator
    if method not in CALIBRATORS:
        raise UsageError(f"--calibrator must be one of {', '.join(CALIBRATORS)}, got '{method}'")
    samples = ctx.int8.samples
    if not samples:
        raise UsageError("--quant_type=INT8 needs calibration inputs: give --calib_data=DIR")
    ops = quantizable(graph)
    names = {n.inputs[0] for n in ops}
    act = calibrate(graph, samples, names, method)
    ops = [n for n in ops if n.inputs[0] in act]
    plan = {id(n): (act[n.inputs[0]], _quantized_weight(graph.const(n.inputs[1]), _weight_axis(n, graph.const(
        n.inputs[1])))) for n in ops}
    kept: list[dict] = []
    if ctx.int8.precision_auto:
        budget = ctx.int8.auto_budget or RELATIVE["int8"]
        ops, kept = choose_ops(graph, ops, plan, samples, budget)
    ctx.results.int8_kept_float = kept
    for name in kept:
        ctx.warn(f"node '{name['node']}' ({name['op']}) stays in float: int8 there would bring the output error "
                 f"to {name['with_others']:.2e}")
    # Rewrite: one FakeQuant per quantized activation, int8 storage for the weights.
    inserted: dict[str, str] = {}
    formats = ctx.results.weight_hints
    for node in ops:
        x = node.inputs[0]
        if x not in inserted:
            fq_out = graph.unique_name(f"{x}_int8")
            v = graph.values.get(x)
            graph.values[fq_out] = Value(fq_out, "float32", v.shape if v else None)
            fq = Node("FakeQuant", [x], [fq_out], dict(act[x]), graph.unique_name(f"{node.name}_quant_input"),
                      OPTCLI_DOMAIN)
            index = next(i for i, n in enumerate(graph.nodes) if n is node)
            graph.nodes.insert(index, fq)
            inserted[x] = fq_out
        node.inputs[0] = inserted[x]
        w = graph.const(node.inputs[1])
        axis = _weight_axis(node, w)
        q, scales = quantize(w, "int8", axis)
        name = graph.add_initializer(f"{node.inputs[1]}_int8", dequantize(q, "int8", axis, scales))
        node.inputs[1] = name
        formats[name] = ("int8", axis, scales)
    graph.metadata["quant"] = "int8"
    graph.toposort()
    graph.remove_unused_initializers()
    return {"quantized_ops": len(ops), "activations": len(inserted), "kept_float": len(kept)}
