"""What the passes that make integer steps of QDQ chains share (fuse_qdq_conv, fuse_qdq_matmul, fuse_qdq_add): reading a
per-tensor quantization from constants, the clamp a Relu / Clip becomes in the quantized domain, and
the sweep of DequantizeLinear nodes no one reads any more."""

from __future__ import annotations

import math

import numpy as np

from optcli.ir import Graph, Names, Node
from optcli.ops.quant import quantize
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import drop_values

STD = ("", "ai.onnx")
RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def is_std(node: Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in STD and node.proto is None


def scalar_params(graph: Graph, scale_name: str, zp_name: str) -> tuple[float, int, str] | None:
    """A per-tensor scale and 8-bit zero point given as constants: (scale, zero point, dtype)."""
    scale = graph.const(scale_name)
    zp = graph.const(zp_name) if zp_name else np.zeros((), np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or zp.dtype.name not in RANGE:
        return None
    s = float(np.float32(scale.reshape(-1)[0]))
    if not (math.isfinite(s) and s > 0):
        return None
    return s, int(zp.reshape(-1)[0]), zp.dtype.name


def int8_weight(graph: Graph, w_name: str, scale_name: str, zp_name: str, rank: int, channel_axis: int,
                axis: int) -> tuple[np.ndarray, list[float]] | None:
    """A constant symmetric (zero point 0) int8 weight of ``rank`` and its positive finite scales: one, or one
    per output channel along ``channel_axis`` (where the DequantizeLinear's ``axis`` is that axis)."""
    w, scale = graph.const(w_name), graph.const(scale_name)
    zp = graph.const(zp_name) if zp_name else None
    if w is None or scale is None or w.dtype != np.int8 or w.ndim != rank or (zp_name and zp is None):
        return None
    if zp is not None and np.any(zp != 0):
        return None
    scales = scale.astype(np.float32).reshape(-1)
    if scales.size not in (1, w.shape[channel_axis]) or (scales.size > 1 and axis % rank != channel_axis):
        return None
    if not np.all(np.isfinite(scales) & (scales > 0)):
        return None
    return w, [float(s) for s in scales]


def dequantized(graph: Graph, producers: dict[str, Node], name: str) -> tuple[str, tuple[float, int, str]] | None:
    """The quantized tensor and its per-tensor parameters when ``name`` is a DequantizeLinear's output."""
    dq = producers.get(name)
    if not is_std(dq, "DequantizeLinear") or dq.attrs.get("block_size"):
        return None
    params = scalar_params(graph, dq.input(1), dq.input(2))
    if params is None or graph.dtype_of(dq.input(0)) != params[2]:
        return None
    return dq.input(0), params


def requantized(graph: Graph, consumers: dict[str, list[Node]], name: str
                ) -> tuple[Node | None, Node, tuple[float, int, str]] | None:
    """(Relu / Clip or None, the QuantizeLinear, its parameters) reading ``name`` as its only reader."""
    act = graph_queries.sole_consumer(graph, consumers, name)
    q = act
    if is_std(act, "Relu") or is_std(act, "Clip"):
        q = graph_queries.sole_consumer(graph, consumers, act.outputs[0])
    else:
        act = None
    if not is_std(q, "QuantizeLinear") or q.attrs.get("block_size") or (q.attrs.get("output_dtype") and not q.input(2)):
        return None  # (an output dtype given by attribute alone: left to the float view)
    params = scalar_params(graph, q.input(1), q.input(2))
    return None if params is None else (act, q, params)


def clamp(graph: Graph, act: Node | None, y_scale: float, y_zp: int, dtype: str) -> tuple[int, int] | None:
    """[qmin, qmax]: the output dtype's range, narrowed by a Relu or a Clip with constant bounds
    (quantizing the clamped float equals clamping the quantized value: rounding is monotone)."""
    lo, hi = RANGE[dtype]
    if act is None:
        return lo, hi
    if act.op_type == "Relu":
        bounds = (0.0, None)
    elif len(act.inputs) > 1 or not act.attrs:  # Clip: bounds as inputs (opset 11+) or attributes
        consts = [graph.const(act.input(k)) if act.input(k) else None for k in (1, 2)]
        if any(act.input(k) and consts[k - 1] is None for k in (1, 2)):
            return None
        bounds = tuple(None if c is None else float(c.reshape(-1)[0]) for c in consts)
    else:
        bounds = (act.attrs.get("min"), act.attrs.get("max"))

    def q(v: float) -> int:
        return int(quantize(np.float32(v), np.float32(y_scale), y_zp, np.dtype(dtype)))

    qlo = lo if bounds[0] is None else max(lo, q(bounds[0]))
    qhi = hi if bounds[1] is None else min(hi, q(bounds[1]))
    return (qlo, qhi) if qlo <= qhi else None


def int32_bias(graph: Graph, names: Names, node: Node | None, name: str, x_scale: float, w_scale: list[float],
               producers: dict[str, Node]) -> str | None:
    """The bias as an int32 initializer in units of x_scale * w_scale: '' for none, None if it cannot be
    (onnxruntime's quantizer stores it so already: taken as is when its scale is that product)."""
    if not name:
        return ""
    product = np.float32(x_scale) * np.asarray(w_scale, np.float32)
    dq = producers.get(name)
    if is_std(dq, "DequantizeLinear") and not dq.attrs.get("block_size"):
        b, s = graph.const(dq.input(0)), graph.const(dq.input(1))
        zp = graph.const(dq.input(2)) if dq.input(2) else None
        if b is None or s is None or b.dtype != np.int32 or b.ndim != 1 or (dq.input(2) and zp is None):
            return None
        if zp is not None and np.any(zp != 0):
            return None
        s = s.astype(np.float32).reshape(-1)
        if s.size in (1, b.size) and np.array_equal(np.broadcast_to(s, b.shape), np.broadcast_to(product, b.shape)):
            return dq.input(0)
        value = b.astype(np.float64) * np.broadcast_to(s, b.shape).astype(np.float64)
    elif graph.const(name) is not None:
        value = graph.const(name).astype(np.float64)
    else:
        return None
    if value.ndim != 1 or not np.all(np.isfinite(value)):
        return None
    q = np.rint(value / np.broadcast_to(product, value.shape).astype(np.float64))
    if np.any(np.abs(q) >= 2**31 - 1):
        return None
    return names.initializer(f"{node.name if node else name}_bias_int32", q.astype(np.int32))


def replace_chains(graph: Graph, matches: list[tuple[Node, Node, list[Node]]]) -> None:
    """Each (old node, its integer step, the nodes of the chain after it that the step absorbs: Relu /
    Clip, QuantizeLinear): the step takes the old node's place (its inputs are all computed before it,
    its readers read the last absorbed node's output, after it), the others go with the values only
    they wrote, then the DequantizeLinear nodes no one reads any more."""
    replace: dict[int, Node] = {}
    gone: set[int] = set()
    for old, new, absorbed in matches:
        replace[id(old)] = new
        gone.update(id(n) for n in absorbed)
        drop_values(graph, *[o for o in old.outputs if o and o != new.outputs[0]],
                    *[n.outputs[0] for n in absorbed[:-1]])
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in gone]
    drop_unread_dequantize(graph)


def drop_unread_dequantize(graph: Graph) -> None:
    """Remove the DequantizeLinear nodes whose output no one reads any more, and unused initializers."""
    read = graph_queries.consumers(graph)
    outputs = graph.output_names()
    dead = [n for n in graph.nodes if is_std(n, "DequantizeLinear") and n.outputs[0] not in read
            and n.outputs[0] not in outputs]
    if dead:
        ids = {id(n) for n in dead}
        graph.nodes = [n for n in graph.nodes if id(n) not in ids]
        drop_values(graph, *[n.outputs[0] for n in dead])
    graph.remove_unused_initializers()
