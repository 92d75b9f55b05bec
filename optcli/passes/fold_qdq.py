"""Fold QDQ quantization into the ops it wraps: what a pre-quantized model means to a float target.

Models quantized in QDQ format (onnxruntime's ``quantize_static``, TensorFlow/PyTorch exporters)
wrap every op in QuantizeLinear/DequantizeLinear pairs.  This pass rewrites them so every target
runs them, the GPU included, and the file stays small:

* ``DequantizeLinear`` of a constant integer weight with zero point 0 becomes the float weight,
  remembered as int8/int16 with its own scales (``ctx.results.weight_hints``) so the `.nb`
  stores the original integers exactly (see ``compress_weights``);
* a per-tensor ``QuantizeLinear`` -> ``DequantizeLinear`` pair on an activation becomes one
  ``optcli.FakeQuant`` (quantize then dequantize, the same rounding and saturation), which the
  float kernels of every target can run;
* a DequantizeLinear after an op that only moves integer values (Pad, MaxPool, Reshape...) moves
  before it, so the QuantizeLinear before that op meets it and the pair folds (QOperator models
  pad and pool uint8 tensors between the two).

What does not match these patterns (blocked quantization, asymmetric weights, QOperator ops) is
left alone and runs through the quantized kernels of the host.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node, Value
from optcli.passes._helpers.graph_queries import drop_values
from optcli.passes.base import PassContext

NAME = "fold_qdq"
DESCRIPTION = "fold QuantizeLinear/DequantizeLinear pairs into FakeQuant and dequantized weights into int8 storage"

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def _scalar(graph: Graph, name: str) -> float | None:
    c = graph.const(name)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


class _Edits:
    """Node-list edits collected during one walk and applied in one rebuild (removing or
    renaming one node at a time rescans the graph each time: quadratic on big models)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.insert_before: dict[int, Node] = {}
        self.replace: dict[int, Node] = {}
        self.gone: set[int] = set()
        self.rename: dict[str, str] = {}

    def apply(self, graph: Graph) -> None:
        nodes = []
        for n in graph.nodes:
            new = self.insert_before.get(id(n))
            if new is not None and id(new) not in self.gone:
                nodes.append(new)
            if id(n) not in self.gone:
                nodes.append(self.replace.get(id(n), n))
        if self.rename:
            for n in nodes:
                n.inputs = [self.rename.get(i, i) for i in n.inputs]
        graph.nodes = nodes
        self.clear()


def _fold_weight(graph: Graph, node: Node, hints: dict, names: Names, edits: _Edits) -> bool:
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
    name = names.initializer(node.outputs[0] + "_dq", value)
    hints[name] = (w.dtype.name, axis, [float(s) for s in scales])
    edits.gone.add(id(node))
    edits.rename[node.outputs[0]] = name
    return True


def _fold_pair(graph: Graph, q: Node, consumers: dict, names: Names, edits: _Edits) -> int:
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
    if any(r.outputs[0] in graph.output_names() for r in readers[1:]):
        return 0
    fq = Node("FakeQuant", [q.input(0)], [first.outputs[0]],
              {"scale": scale, "zero_point": zp, "qmin": float(qmin), "qmax": float(qmax)},
              names.fresh(f"{q.name}_fakequant"), OPTCLI_DOMAIN)
    edits.replace[id(q)] = fq
    for r in readers:
        edits.gone.add(id(r))
        if r is not first:
            edits.rename[r.outputs[0]] = first.outputs[0]
    return 1


# Ops that only move or select integer values (or pad them with a constant): dequantizing before
# them gives the same floats as after (max commutes with a positive scale).
_MOVERS = {"Pad", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "MaxPool", "Identity"}


def _from_integer_step(producers: dict, name: str) -> bool:
    """Whether ``name`` is an integer step's output (optcli.QConv, QAdd: fuse_qdq_conv and its kind), through
    data movers: there the movers run on the bytes (fuse_qdq_movement) and hoisting the DequantizeLinear
    above them would only make them float again, with no QuantizeLinear to fold it into."""
    node = producers.get(name)
    while node is not None and node.op_type in _MOVERS and node.domain in ("", "ai.onnx") and node.inputs:
        node = producers.get(node.input(0))
    return node is not None and node.domain == OPTCLI_DOMAIN


def _hoist_dequantize(graph: Graph, dq: Node, producers: dict, consumers: dict, names: Names,
                      edits: _Edits) -> Node | None:
    """M(x_q) -> DequantizeLinear  becomes  DequantizeLinear(x_q) -> M, for a data-movement M on
    a per-tensor quantized tensor (QOperator models pad the uint8 tensor between QuantizeLinear and
    DequantizeLinear).  The QuantizeLinear then meets its DequantizeLinear and folds into a
    FakeQuant, and M runs on floats: on the GPU, or folded into the next Conv.  Returns the new
    DequantizeLinear, or None when the pattern does not apply."""
    mover = producers.get(dq.input(0))
    scale, zp = _scalar(graph, dq.input(1)), _scalar(graph, dq.input(2)) if dq.input(2) else 0.0
    if mover is None or mover.op_type not in _MOVERS or mover.domain not in ("", "ai.onnx") or mover.proto:
        return None
    if scale is None or zp is None or dq.attrs.get("block_size") or scale <= 0:
        return None
    if len([o for o in mover.outputs if o]) != 1 or mover.outputs[0] in graph.output_names():
        return None
    if graph.dtype_of(mover.input(0)) not in _QRANGE or _from_integer_step(producers, mover.input(0)):
        return None
    # every reader a DequantizeLinear with the same parameters (a MaxPool feeding a conv and a
    # residual Add): one hoisted DequantizeLinear serves them all
    readers = consumers.get(mover.outputs[0], [])
    same = [r for r in readers if r.op_type == "DequantizeLinear" and r.domain in ("", "ai.onnx")
            and r.input(1) == dq.input(1) and r.input(2) == dq.input(2) and r.attrs == dq.attrs]
    if len(same) != len(readers) or any(r.outputs[0] in graph.output_names() for r in readers if r is not dq):
        return None
    extra = []
    if mover.op_type == "Pad":
        mode = mover.attrs.get("mode", "constant")
        if (mode.decode() if isinstance(mode, bytes) else mode) == "constant":
            if mover.input(3) or len(mover.inputs) < 2:
                return None  # axes, or opset < 11 pads as an attribute: left alone
            c = graph.const(mover.input(2)) if mover.input(2) else np.zeros((), graph.dtype_of(mover.input(0)))
            if c is None or c.size != 1:
                return None
            dtype = graph.const(dq.input(1)).dtype
            value = np.asarray((float(c.reshape(-1)[0]) - zp) * scale, dtype)
            extra = [names.initializer(f"{mover.name}_value", value)]
    float_in = names.fresh(f"{mover.input(0)}_dequantized")
    graph.values[float_in] = Value(float_in, graph.dtype_of(dq.outputs[0]) or "float32", graph.shape_of(mover.input(0)))
    new_dq = Node("DequantizeLinear", [mover.input(0), *dq.inputs[1:]], [float_in], dict(dq.attrs),
                  names.fresh(f"{dq.name}_hoisted"))
    drop_values(graph, mover.outputs[0])
    mover.inputs = [float_in, *mover.inputs[1:]]
    if extra:
        mover.inputs = mover.inputs[:2] + extra
    # The mover keeps its place (dq's readers all come after it), the new DequantizeLinear goes
    # right before it, the old one goes: applied in one rebuild of the node list by ``run``.
    mover.outputs = [dq.outputs[0]]
    edits.insert_before[id(mover)] = new_dq
    for r in readers:
        edits.gone.add(id(r))
        if r is not dq:
            edits.rename[r.outputs[0]] = dq.outputs[0]
    producers[float_in], producers[dq.outputs[0]] = new_dq, mover
    consumers[float_in] = [mover]
    consumers[new_dq.input(0)] = [new_dq if r is mover else r for r in consumers.get(new_dq.input(0), [])]
    return new_dq


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    hints = ctx.results.weight_hints
    weights = pairs = hoisted = 0
    names, edits = Names(graph), _Edits()
    for node in graph.nodes:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            weights += _fold_weight(graph, node, hints, names, edits)
    edits.apply(graph)
    consumers, producers = graph.consumers(), graph.producers()
    for node in list(graph.nodes):
        dq = None if id(node) in edits.gone else node
        while dq is not None and dq.op_type == "DequantizeLinear" and dq.domain in ("", "ai.onnx"):
            dq = _hoist_dequantize(graph, dq, producers, consumers, names, edits)
            hoisted += dq is not None
    edits.apply(graph)
    consumers = graph.consumers()
    for node in graph.nodes:
        if node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx"):
            pairs += _fold_pair(graph, node, consumers, names, edits)
    edits.apply(graph)
    if weights or pairs:
        graph.remove_unused_initializers()
    return {"weights": weights, "fake_quant": pairs, "hoisted": hoisted}
