"""Ops that only move or select values run on the quantized tensor: DequantizeLinear -> MaxPool / Pad /
Reshape / Transpose / Concat / Split / nearest Resize / ... -> QuantizeLinear, all with the same scale and zero
point (onnxruntime's quantize_static writes a Q/DQ pair around each of them), become the op itself on
the 8-bit tensor.

Exact, not approximate: such an op's outputs are some of its inputs (or a constant pad), and with one
scale s > 0 and zero point z on both sides, quantize(dequantize(q)) = round((q - z) * s / s) + z = q (the
float error is far below half a step), while max commutes with the increasing dequantization.  So the
integer plan no longer dequantizes a ResNet stem's 64-channel map, pads and pools it in float and
quantizes it again (three float tensors and four steps around its MaxPool): it pads and pools bytes.

A constant Pad keeps its value only where it lies on the quantization grid (its quantized value
dequantizes back to it exactly, as a 0 pad does whenever 0 is representable: onnxruntime's quantizer
makes it so).  Only for plans with no GPU target, like fuse_qdq_conv; the rest is left to fold_qdq.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node, Value
from optcli.ops.evaluate import evaluate_node
from optcli.ops.quant import quantize
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import RANGE, dequantized, drop_unread_dequantize, is_std, scalar_params
from optcli.passes.base import PassContext

NAME = "fuse_qdq_movement"
DESCRIPTION = ("run ops that only move or select values (MaxPool, Pad, Reshape, Transpose, Concat, Split, "
               "nearest Resize, ...) between a DequantizeLinear and a QuantizeLinear of equal parameters on the "
               "8-bit tensor (host-only plans)")

# the op, and which of its inputs carry the data (the others are shapes, axes, pads: left as they are)
_DATA_INPUTS = {
    "MaxPool": (0,), "Pad": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
    "Transpose": (0,), "Slice": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,), "Resize": (0,),
    "Split": (0,),  # (its outputs: each read by its own QuantizeLinear of the same parameters)
    "Concat": None,  # every input
}


def _quantized_outputs(graph: Graph, consumers: dict, node: Node) -> tuple[list[Node | None], tuple] | None:
    """The QuantizeLinear that is the only reader of each of ``node``'s outputs (None for an unused
    optional output), when they all quantize with one set of parameters, and those parameters."""
    found: list[Node | None] = []
    params = None
    for out in node.outputs:
        if not out:
            found.append(None)
            continue
        q = graph_queries.sole_consumer(graph, consumers, out)
        if not is_std(q, "QuantizeLinear") or q.attrs.get("block_size") or (
                q.attrs.get("output_dtype") and not q.input(2)):
            return None
        p = scalar_params(graph, q.input(1), q.input(2))
        if p is None or (params is not None and p != params):
            return None
        found.append(q)
        params = p
    return (found, params) if params is not None else None


def _selects_only(graph: Graph, node: Node) -> bool:
    """Whether the op's outputs are copies of its inputs (or, for Pad, a constant checked apart)."""
    a = node.attrs
    if node.op_type == "MaxPool":
        return not any(node.outputs[1:])  # no Indices output
    if node.op_type == "Resize":
        mode = a.get("mode", "nearest")
        return mode in ("nearest", b"nearest") and a.get("coordinate_transformation_mode", "half_pixel") not in (
            "tf_crop_and_resize", b"tf_crop_and_resize")  # (which pads with extrapolation_value)
    return True


def _constant(graph: Graph, producers: dict, name: str) -> np.ndarray | None:
    """A constant, or the float a DequantizeLinear of constants makes (onnxruntime's quantizer quantizes a
    Pad's value too; fold_constants_before_qdq keeps DequantizeLinear nodes)."""
    const = graph.const(name)
    if const is not None:
        return const
    dq = producers.get(name)
    if not is_std(dq, "DequantizeLinear") or not all(graph.const(i) is not None for i in dq.inputs if i):
        return None
    return evaluate_node(dq, [graph.const(i) if i else None for i in dq.inputs], graph.opsets)[0]


def _pad_value(graph: Graph, producers: dict, pad: Node, params: tuple[float, int, str], names: Names
               ) -> list[str] | None:
    """The Pad's inputs for the 8-bit tensor: its constant value quantized, where that is exact."""
    if len(pad.inputs) < 2 or not pad.input(1):
        return None  # opset < 11: pads and value as attributes, left to the float view
    mode = pad.attrs.get("mode", "constant")
    if mode not in ("constant", b"constant"):
        return list(pad.inputs)  # edge / reflect copy values
    value = np.float32(0.0)
    if len(pad.inputs) > 2 and pad.input(2):
        const = _constant(graph, producers, pad.input(2))
        if const is None or const.size != 1:
            return None
        value = np.float32(const.reshape(-1)[0])
    scale, zp, dtype = params
    qv = quantize(value, np.float32(scale), zp, np.dtype(dtype))
    if np.float32((float(qv) - zp) * np.float32(scale)) != value:
        return None  # off the grid: the float view's Q(DQ) would not give it back
    inputs = list(pad.inputs) + [""] * (3 - len(pad.inputs))
    inputs[2] = names.initializer(f"{pad.name}_quantized_value", np.array(qv, dtype=np.dtype(dtype)))
    return inputs


def _requantize(graph: Graph, dq: Node, q: Node, names: Names) -> tuple[str, Node] | None:
    """A QLookup taking ``dq``'s bytes to ``q``'s grid: Q(DQ(byte)) for each of the 256 bytes, computed by the
    float view's own kernels, so exact; (its output, the node)."""
    source = dq.input(0)
    dtype = np.dtype(graph.dtype_of(source))
    args = [np.arange(256, dtype=np.uint8).view(dtype), *(graph.const(i) if i else None for i in dq.inputs[1:])]
    floats = evaluate_node(dq, args, graph.opsets)[0]
    table = evaluate_node(q, [floats, *(graph.const(i) if i else None for i in q.inputs[1:])], graph.opsets)[0]
    table = np.ascontiguousarray(table.reshape(-1))
    if table.shape != (256,) or table.dtype.name not in RANGE:
        return None
    name = names.initializer(f"{source}_requantized_table", table)
    out = names.fresh(f"{source}_requantized")
    graph.values[out] = Value(out, table.dtype.name, graph.shape_of(source))
    return out, Node("QLookup", [source, name], [out], {}, names.fresh(f"{source}_requantize"), OPTCLI_DOMAIN)


def _integer_node(graph: Graph, node: Node, producers: dict, consumers: dict, names: Names
                  ) -> tuple[Node, list[Node], list[Node]] | None:
    """(the op on the 8-bit tensors, the QuantizeLinear nodes it replaces, the QLookup steps that requantize
    a Concat's inputs of other parameters), or None where the chain does not fit."""
    out = _quantized_outputs(graph, consumers, node)
    if out is None or not _selects_only(graph, node):
        return None
    qs, params = out
    lookups: list[Node] = []
    data = _DATA_INPUTS[node.op_type]
    positions = range(len(node.inputs)) if data is None else data
    inputs = list(node.inputs)
    for i in positions:
        if i >= len(inputs) or not inputs[i]:
            return None
        dq = dequantized(graph, producers, inputs[i])
        if dq is not None and dq[1] != params and node.op_type == "Concat":
            # onnxruntime's quantizer gives each Concat input its own scale: a byte table moves it to the
            # output's (exact: Concat copies, so Q(Concat(DQ(x_i))) is Concat(Q(DQ(x_i))))
            found = _requantize(graph, producers[inputs[i]], qs[0], names)
            if found is None:
                return None
            inputs[i] = found[0]
            lookups.append(found[1])
            continue
        if dq is None or dq[1] != params:
            return None  # another scale or zero point: a requantization, not a copy
        inputs[i] = dq[0]
    if node.op_type == "Pad":
        padded = _pad_value(graph, producers, node, params, names)
        if padded is None:
            return None
        inputs = [inputs[0], *padded[1:]]
    outputs = [q.outputs[0] if q is not None else "" for q in qs]
    new = Node(node.op_type, inputs, outputs, dict(node.attrs), names.fresh(f"{node.name}_quantized"), node.domain)
    return new, [q for q in qs if q is not None], lookups


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"fused": 0, "requantized": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    replace: dict[int, Node] = {}
    before: dict[int, list[Node]] = {}
    gone: set[int] = set()
    for node in graph.nodes:
        if node.op_type not in _DATA_INPUTS or not is_std(node, node.op_type):
            continue
        found = _integer_node(graph, node, producers, consumers, names)
        if found is not None:
            replace[id(node)] = found[0]
            before[id(node)] = found[2]
            gone.update(id(q) for q in found[1])
            graph_queries.drop_values(graph, *[o for o in node.outputs if o])
    if replace:
        graph.nodes = [m for n in graph.nodes if id(n) not in gone
                       for m in (*before.get(id(n), ()), replace.get(id(n), n))]
        drop_unread_dequantize(graph)
    return {"fused": len(replace), "requantized": sum(len(v) for v in before.values())}
