"""Full int8 post-training quantization (``opt --quant_type=INT8 --calib_data=DIR``).

Conv, ConvTranspose, Gemm, MatMul and FullyConnected get int8 weights (symmetric, per output
channel) and u8 activations (asymmetric, per tensor), calibrated by running the float model on the
calibration samples with one of three calibrators:

* ``minmax``: the observed range;
* ``percentile``: the 0.01st..99.99th percentiles (ignores rare outliers);
* ``entropy``: the clipping threshold that minimises the KL divergence between the observed
  histogram and its 8-bit quantization (TensorRT's method).

The result is written the way onnxruntime's ``quantize_static`` writes a QDQ model (a
QuantizeLinear -> DequantizeLinear pair on each quantized activation, a DequantizeLinear on each
int8 conv weight; which activations: ``_helpers/ptq_tensors.py``) and lowered at once by the passes
that lower such models: on host-only plans the convs, residual Adds, pools, byte-moving ops and
element-wise islands become integer steps that hand each other bytes (``fuse_qdq_*``); what is left,
and every plan with a GPU target, gets the float view (FakeQuant steps, dequantized weights stored as
int8: ``fold_qdq``), so the GPU runs the same quantization in float.  It runs after ``fuse_conv_bn``
(batch norms are in the conv weights it quantizes) and before the epilogue fusions (which would hide
the Conv -> Relu -> QuantizeLinear chains from the lowering).

With ``--precision=auto`` ops are quantized one by one in order of measured sensitivity, each trial
simulating the whole plan it makes, and an op whose quantization would push the outputs' error over
the budget stays in float; the report lists them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optcli.errors import UsageError
from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node, Value
from optcli.ops.evaluate import evaluate_node
from optcli.ops.weight_quant import dequantize, quantize
from optcli.passes import qdq_lowering
from optcli.passes._helpers import graph_queries, ptq_tensors
from optcli.passes.base import PassContext
from optcli.progress import progress
from optcli.tolerance import RELATIVE, max_error

NAME = "quantize_int8"
DESCRIPTION = ("int8 post-training quantization: calibrated QDQ chains (u8 activations, int8 per-channel weights), "
               "lowered to integer steps on the host and to FakeQuant float views elsewhere")

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


class _Simulation(NamedTuple):
    """A quantized plan as the float reference evaluator sees it."""

    weights: dict[int, np.ndarray]  # node id -> its weight rounded to int8 and dequantized
    tensors: dict[str, tuple[float, int]]  # tensor -> u8 (scale, zero point): its readers see it quantized


def _fake_u8(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear to u8 (round half to even, saturating)."""
    s = np.float32(scale)
    q = np.clip(np.rint(x / s) + zero_point, 0, 255)
    return ((q - zero_point) * s).astype(np.float32)


def _run(graph: Graph, feeds: dict, sim: _Simulation | None = None,
         watch: set[str] | None = None) -> tuple[dict, dict]:
    """Run the graph, quantized as ``sim`` says (float when None).  Returns (outputs, watched values)."""
    env = {**graph.initializers, **feeds}
    if sim:
        env.update({k: _fake_u8(v, *sim.tensors[k]) for k, v in feeds.items() if k in sim.tensors})
    seen = {}
    for node in graph.nodes:
        args = [env[i] if i else None for i in node.inputs]
        if sim and id(node) in sim.weights:
            args[1] = sim.weights[id(node)]
        for name, value in zip(node.outputs, evaluate_node(node, args, graph.opsets)):
            if name:
                env[name] = _fake_u8(value, *sim.tensors[name]) if sim and name in sim.tensors else value
                if watch and name in watch:
                    seen[name] = value
        for name in node.inputs:
            if watch and name in watch and name in env:
                seen[name] = env[name]
    return {v.name: env[v.name] for v in graph.outputs}, seen


def _finite(x: np.ndarray) -> np.ndarray:
    """The finite values of a tensor the calibration watches: an overflow to inf (or a NaN from inf - inf)
    inside the float model says nothing about the range its other values need."""
    x = np.asarray(x)
    return x if np.isfinite(x).all() else x[np.isfinite(x)]


class _Stats:
    def __init__(self):
        self.lo, self.hi, self.hist, self.edges = np.inf, -np.inf, None, None

    def observe_range(self, x: np.ndarray) -> None:
        x = _finite(x)
        if x.size:
            self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))

    def observe_hist(self, x: np.ndarray) -> None:
        if self.edges is None:
            lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
            self.edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, BINS + 1)
            self.hist = np.zeros(BINS, np.float64)
        self.hist += np.histogram(_finite(x), bins=self.edges)[0]


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


def calibrate(graph: Graph, samples: list[dict], names: set[str], method: str) -> dict[str, tuple[float, float]]:
    """The clipping range (lo, hi) of each tensor in ``names`` that the samples reach."""
    stats = {n: _Stats() for n in names}
    for feeds in progress(samples, desc="calibrating (ranges)", total=len(samples), unit="samples"):
        for name, x in _run(graph, feeds, watch=names)[1].items():
            stats[name].observe_range(x)
    if method != "minmax":
        for feeds in progress(samples, desc=f"calibrating ({method})", total=len(samples), unit="samples"):
            for name, x in _run(graph, feeds, watch=names)[1].items():
                stats[name].observe_hist(x)
    ranges = {}
    for name, s in stats.items():
        if not np.isfinite(s.lo):
            continue
        ranges[name] = (s.lo, s.hi) if method == "minmax" else (
            _percentile_range(s) if method == "percentile" else _entropy_range(s))
    return ranges


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


def _simulation(graph: Graph, chosen: list[Node], ops: list[Node], weights: dict[int, np.ndarray],
                ranges: dict[str, tuple[float, float]], for_gpu: bool) -> tuple[_Simulation, list[str]]:
    """The plan that quantizes ``chosen`` (the rest of ``ops`` kept in float), and its quantized tensors
    in graph order; ``weights`` (node id -> int8-rounded weight) where the simulation should use them."""
    picked = {id(n) for n in chosen}
    tensors, groups = ptq_tensors.choose(graph, chosen, [n for n in ops if id(n) not in picked], for_gpu)
    params = _group_params(ranges, groups)
    tensors = [t for t in tensors if t in params]
    return _Simulation({i: weights[i] for i in picked if i in weights}, {t: params[t] for t in tensors}), tensors


def choose_ops(graph: Graph, ops: list[Node], weights: dict[int, np.ndarray], ranges: dict, samples: list[dict],
               budget: float, for_gpu: bool) -> tuple[list[Node], list[dict]]:
    """``--precision=auto``: quantize ops in order of sensitivity while the error fits the budget.  Each
    trial is the whole plan those ops make (their inputs, outputs and the tensors between integer steps
    quantized), so the budget holds for what is written, not for a model of it."""
    probe = samples[: min(4, len(samples))]
    reference = [_run(graph, f)[0] for f in probe]

    def error(chosen: list[Node]) -> float:
        sim = _simulation(graph, chosen, ops, weights, ranges, for_gpu)[0]
        return _output_error(reference, [_run(graph, f, sim)[0] for f in probe])

    sensitivity = [(error([node]), i, node) for i, node in enumerate(
        progress(ops, desc="measuring per-op int8 error", total=len(ops), unit="ops"))]
    chosen: list[Node] = []
    kept: list[dict] = []
    for err, _, node in sorted(sensitivity, key=lambda t: t[:2]):
        total = error([*chosen, node])
        if total <= budget:
            chosen.append(node)
        else:
            kept.append({"node": node.name, "op": node.op_type, "alone": err, "with_others": total})
    picked = {id(n) for n in chosen}
    return [n for n in ops if id(n) in picked], kept


def _uint8_params(lo: float, hi: float) -> tuple[float, int]:
    """onnxruntime's activation quantization: u8, (hi - lo) / 255, the zero point where 0 lands (lo and hi
    finite: calibration keeps only finite values, so the scale is a finite float32)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = float(np.float32((hi - lo) / 255.0)) if hi > lo else 1.0
    return scale, int(np.clip(np.rint(-lo / scale), 0, 255))


def _group_params(ranges: dict[str, tuple[float, float]], groups: dict[str, str]) -> dict[str, tuple[float, int]]:
    """(scale, zero point) per tensor; the tensors of one group (an op that only moves bytes, its input
    and its output) share the union of their ranges."""
    union: dict[str, tuple[float, float]] = {}
    for t, leader in groups.items():
        if t in ranges:
            lo, hi = ranges[t]
            old = union.get(leader, (lo, hi))
            union[leader] = (min(lo, old[0]), max(hi, old[1]))
    return {t: _uint8_params(*union[leader]) for t, leader in groups.items() if leader in union}


def _write_qdq(graph: Graph, tensors: list[str], params: dict[str, tuple[float, int]]) -> None:
    """A QuantizeLinear -> DequantizeLinear pair right after each tensor's producer; every reader
    reads the DequantizeLinear's output (onnxruntime's QDQ form, which the lowering passes match)."""
    names = Names(graph)
    readers = graph_queries.consumers(graph)
    after: dict[str, list[Node]] = {}
    for t in tensors:
        scale, zp = params[t]
        s = names.initializer(f"{t}_scale", np.array(scale, np.float32))
        z = names.initializer(f"{t}_zero_point", np.array(zp, np.uint8))
        q_out, dq_out = names.fresh(f"{t}_uint8"), names.fresh(f"{t}_dequantized")
        shape = graph.shape_of(t)
        graph.values[q_out] = Value(q_out, "uint8", shape)
        graph.values[dq_out] = Value(dq_out, "float32", shape)
        for reader in readers.get(t, []):
            reader.inputs = [dq_out if i == t else i for i in reader.inputs]
            if reader.proto is not None:
                graph_queries.sync_proto(reader)
        after[t] = [Node("QuantizeLinear", [t, s, z], [q_out], {}, names.fresh(f"{t}_quantize")),
                    Node("DequantizeLinear", [q_out, s, z], [dq_out], {}, names.fresh(f"{t}_dequantize"))]
    nodes = [n for v in graph.inputs for n in after.get(v.name, [])]
    for node in graph.nodes:
        nodes.append(node)
        nodes.extend(n for o in node.outputs for n in after.get(o, []))
    graph.nodes = nodes


def _quantize_weight(graph: Graph, node: Node, formats: dict, names: Names) -> Node | None:
    """Symmetric int8 per output channel.  A 2-D Conv's and a dense layer's (MatMul, Gemm) 2-D weight
    becomes the int8 tensor and a DequantizeLinear along the output channels (the form ``fuse_qdq_conv`` and
    ``fuse_qdq_matmul`` take as their integer weight; ``fold_qdq`` makes it the float weight with int8
    storage where the op stays float), returned for the caller to place; the other ops get the dequantized
    float weight, stored as int8 (``compress_weights``), and None."""
    w = graph.const(node.inputs[1])
    axis = _weight_axis(node, w)
    q, scales = quantize(w, "int8", axis)
    if (node.op_type == "Conv" and w.ndim == 4) or (node.op_type in ("MatMul", "Gemm") and w.ndim == 2):
        base = node.inputs[1]
        q_name = names.initializer(f"{base}_int8", q)
        s_name = names.initializer(f"{base}_scales", np.asarray(scales, np.float32))
        z_name = names.initializer(f"{base}_zero_points", np.zeros(len(scales), np.int8))
        out = names.fresh(f"{base}_dequantized")
        graph.values[out] = Value(out, "float32", tuple(w.shape))
        node.inputs[1] = out
        return Node("DequantizeLinear", [q_name, s_name, z_name], [out], {"axis": axis},
                    names.fresh(f"{base}_dequantize"))
    name = names.initializer(f"{node.inputs[1]}_int8", dequantize(q, "int8", axis, scales))
    node.inputs[1] = name
    formats[name] = ("int8", axis, scales)
    return None


def _lower(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """The passes that lower onnxruntime's QDQ models (``qdq_lowering``): integer steps on host-only plans
    (each checks the targets itself), then the float view of what is left (``fold_qdq``)."""
    counts: dict[str, int] = {}
    for module in qdq_lowering.PASSES:
        if module.NAME in ctx.disabled_passes:
            continue
        for key, value in module.run(graph, ctx).items():
            counts[f"{module.NAME}.{key}"] = value
    return counts


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if ctx.int8 is None:
        return {}
    method = ctx.int8.calibrator
    if method not in CALIBRATORS:
        raise UsageError(f"--calibrator must be one of {', '.join(CALIBRATORS)}, got '{method}'")
    samples = ctx.int8.samples
    if not samples:
        raise UsageError("--quant_type=INT8 needs calibration inputs: give --calib_data=DIR")
    ops = every_op = quantizable(graph)
    for_gpu = any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets)
    # every tensor a quantized plan could use (keeping ops in float only removes some): one calibration
    candidates, _ = ptq_tensors.choose(graph, ops, [], for_gpu)
    ranges = calibrate(graph, samples, set(candidates) | {n.inputs[0] for n in ops}, method)
    ops = [n for n in ops if n.inputs[0] in ranges]
    kept: list[dict] = []
    if ctx.int8.precision_auto:  # (the trials simulate the int8 weights too; the final plan needs no simulation)
        weights = {id(n): _quantized_weight(graph.const(n.inputs[1]), _weight_axis(n, graph.const(n.inputs[1])))
                   for n in ops}
        budget = ctx.int8.auto_budget or RELATIVE["int8"]
        ops, kept = choose_ops(graph, ops, weights, ranges, samples, budget, for_gpu)
    ctx.results.int8_kept_float = kept
    for name in kept:
        ctx.warn(f"node '{name['node']}' ({name['op']}) stays in float: int8 there would bring the output error "
                 f"to {name['with_others']:.2e}")
    sim, tensors = _simulation(graph, ops, every_op, {}, ranges, for_gpu)
    formats = ctx.results.weight_hints
    _write_qdq(graph, tensors, sim.tensors)
    names = Names(graph)  # (one scan of the graph for every weight's fresh names)
    dequantize_weights = [_quantize_weight(graph, node, formats, names) for node in ops]
    graph.nodes[:0] = [n for n in dequantize_weights if n is not None]
    graph.metadata["quant"] = "int8"
    graph.toposort()
    graph.remove_unused_initializers()
    lowered = _lower(graph, ctx)
    return {"quantized_ops": len(ops), "activations": len(tensors), "kept_float": len(kept), **lowered}
