"""Fold QDQ quantization into the ops it wraps: what a pre-quantized model means to a float target.

Models quantized in QDQ format (onnxruntime's ``quantize_static``, TensorFlow/PyTorch exporters)
wrap every op in QuantizeLinear/DequantizeLinear pairs.  This pass rewrites them so every target
runs them, the GPU included, and the file stays small:

* ``DequantizeLinear`` of a constant integer weight with zero point 0 becomes the float weight,
  remembered as int8/int16 with its own scales (``ctx.options["weight_hints"]``) so the `.nb`
  stores the original integers exactly (see ``compress_weights``);
* a per-tensor ``QuantizeLinear`` -> ``DequantizeLinear`` pair on an activation becomes one
  ``optcli.FakeQuant`` (quantize then dequantize, the same rounding and saturation), which the
  float kernels of every target can run.

What does not match these patterns (blocked quantization, asymmetric weights, QOperator ops) is
left alone and runs through the quantized kernels of the host.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Node
from optcli.passes.base import PassContext

NAME = "fold_qdq"
DESCRIPTION = "fold QuantizeLinear/DequantizeLinear pairs into FakeQuant and dequantized weights into int8 storage"

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def _scalar(graph: Graph, name: str) -> float | None:
    c = graph.const(name)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _fold_weight(graph: Graph, node: Node, hints: dict) -> bool:
    """DequantizeLinear(const int W, scale, zp = 0) -> float W, stored as integers later."""
    if node.outputs[0] in graph.output_names():
        return False
    w, scale = graph.const(node.input(0)), graph.const(node.input(1))
    zp = graph.const(node.input(2)) if node.input(2) else None
    if w is None or scale is None or (node.input(2) and zp is None) or node.attrs.get("block_size"):
        return False
    if w.dtype.name not in ("int8", "int16") or (zp is not None and np.any(zp != 0)) or w.ndim == 0:
        return False
    axis = int(node.attrs.get("axis", 1)) % w.ndim
    scales = np.broadcast_to(scale.astype(np.float64).reshape(-1), (w.shape[axis],)) if scale.size in (
        1, w.shape[axis]) else None
    if scales is None or not np.all(scales > 0):
        return False
    shape = [1] * w.ndim
    shape[axis] = -1
    value = (w.astype(np.float32) * scales.astype(np.float32).reshape(shape)).astype(scale.dtype)
    name = graph.add_initializer(node.outputs[0] + "_dq", value)
    hints[name] = (w.dtype.name, axis, [float(s) for s in scales])
    graph.nodes.remove(node)
    graph.replace_uses(node.outputs[0], name)
    return True


def _fold_pair(graph: Graph, q: Node, consumers: dict) -> int:
    """QuantizeLinear -> DequantizeLinear (same per-tensor params) -> one FakeQuant."""
    readers = consumers.get(q.outputs[0], [])
    if not readers or any(r.op_type != "DequantizeLinear" or r.domain not in ("", "ai.onnx") for r in readers):
        return 0
    if q.outputs[0] in graph.output_names():
        return 0
    scale, zp = _scalar(graph, q.input(1)), _scalar(graph, q.input(2)) if q.input(2) else 0.0
    zp_array = graph.const(q.input(2)) if q.input(2) else None
    dtype = zp_array.dtype.name if zp_array is not None else "uint8"
    if scale is None or zp is None or dtype not in _QRANGE or q.attrs.get("block_size"):
        return 0
    for r in readers:
        if _scalar(graph, r.input(1)) != scale or (_scalar(graph, r.input(2)) if r.input(2) else 0.0) != zp:
            return 0
    qmin, qmax = _QRANGE[dtype]
    first = readers[0]
    fq = Node("FakeQuant", [q.input(0)], [first.outputs[0]],
              {"scale": scale, "zero_point": zp, "qmin": float(qmin), "qmax": float(qmax)},
              graph.unique_name(f"{q.name}_fakequant"), OPTCLI_DOMAIN)
    index = graph.nodes.index(q)
    graph.nodes[index] = fq
    for r in readers:
        graph.nodes.remove(r)
        if r is not first:
            graph.replace_uses(r.outputs[0], first.outputs[0])
    return 1


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    hints = ctx.options.setdefault("weight_hints", {})
    weights = pairs = 0
    for node in list(graph.nodes):
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            weights += _fold_weight(graph, node, hints)
    consumers = graph.consumers()
    for node in list(graph.nodes):
        # A pair already folded took its DequantizeLinear readers out of the graph; Quantize nodes stay.
        if node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx") and any(n is node for n in graph.nodes):
            pairs += _fold_pair(graph, node, consumers)
    if weights or pairs:
        graph.remove_unused_initializers()
    return {"weights": weights, "fake_quant": pairs}
