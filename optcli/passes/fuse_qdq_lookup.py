"""Float islands of a quantized model as byte table lookups (host-only plans): optcli.QLookup steps.

Between the integer convs of a QDQ MobileNetV3 (issue 26) the activations ran as float subgraphs:
hard-swish (DequantizeLinear(a) -> HardSigmoid -> Q/DQ -> Mul(DQ(a), that) -> QuantizeLinear), torch's
hard-swish (DQ(a) -> Add 3 -> Mul(DQ(a), that) -> Div 6 -> Q), the hard-sigmoid gate of squeeze-excite.  Their
only dynamic input is ONE u8 / s8 tensor and their output is quantized: each output byte is a function of
the input byte alone.  So the island's own ops (the registry's numpy kernels, the Q/DQ pairs inside it
included: the plan's FakeQuant steps) run once at compile time on the 256 possible bytes, and the island
becomes one ``optcli.QLookup`` of that table: the same bytes, one load per element instead of four to six
float passes with their float tensors.

The island of a source tensor ``a`` is grown from its DequantizeLinear readers: a node joins when it is an
element-wise op of ``_ELEMENTWISE`` (or a per-tensor QuantizeLinear / DequantizeLinear) and each of its inputs
is in the island or a one-element constant (an initializer, or a DequantizeLinear of one: ORT's quantized
"3" of torch's hard-swish).  A one-element constant broadcasts to every element, so element-wise still means
per byte; a larger constant (per-channel) or a second dynamic input (the squeeze-excite Mul) stops the growth
and stays float.  Each QuantizeLinear of the island whose bytes are read outside it (directly, or through a
DequantizeLinear whose floats are) becomes a QLookup of ``a``, when some op other than Q/DQ lies between
(a bare requantization is left as it was).  What the island computes for other readers stays; the rest is
dead and goes.

Only for plans with no GPU target (the GPU runs the float view, ``fold_qdq``); after ``fuse_qdq_conv`` and
``fuse_qdq_add`` (their integer steps write the sources), before ``fuse_qdq_se`` (whose QMul would otherwise
take the hard-swish Mul of two quantized tensors).
"""

from __future__ import annotations

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.ops.evaluate import evaluate_node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import drop_values
from optcli.passes._helpers.qdq import RANGE, drop_unread_dequantize, is_std, scalar_params
from optcli.passes.base import PassContext

NAME = "fuse_qdq_lookup"
DESCRIPTION = ("turn float islands of one quantized tensor (DequantizeLinear -> element-wise ops -> QuantizeLinear) "
               "into optcli.QLookup byte tables (host-only plans)")

# Element-wise float ops whose output at an element depends on their inputs at that element only.
_ELEMENTWISE = frozenset({"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Neg", "Abs",
                          "Exp", "Elu", "Selu", "Softplus", "Identity", "Erf", "Sqrt", "Reciprocal", "Floor", "Ceil",
                          "Round", "Add", "Sub", "Mul", "Div", "Min", "Max", "Pow", "Gelu"})
# optcli's own element-wise ops, which fusions made of exporters' patterns (x * Sigmoid(x): SiLU)
_OPTCLI_ELEMENTWISE = frozenset({"Swish"})
_QDQ = ("QuantizeLinear", "DequantizeLinear")


class _Island:
    """The nodes grown from one source tensor, in graph order, and the values they write."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.nodes: list[Node] = []
        self.values: set[str] = {source}
        self.computed: set[str] = set()  # values with an op other than Q/DQ between the source and them
        self.constants: list[Node] = []  # DequantizeLinear nodes of one-element constants the island reads


def _constant_dq(graph: Graph, producers: dict, name: str) -> Node | None:
    dq = producers.get(name)
    if not is_std(dq, "DequantizeLinear") or dq.attrs.get("block_size"):
        return None
    if all(not i or (graph.const(i) is not None and graph.const(i).size == 1) for i in dq.inputs):
        return dq
    return None


def _admits(graph: Graph, node: Node, island: _Island, producers: dict, rank: int | None) -> list[Node] | None:
    """The constant DequantizeLinear nodes ``node`` reads when it may join the island, else None."""
    ours = node.domain == OPTCLI_DOMAIN and node.op_type in _OPTCLI_ELEMENTWISE
    if (node.domain not in ("", "ai.onnx") and not ours) or node.proto is not None \
            or len([o for o in node.outputs if o]) != 1:
        return None
    if node.op_type in _QDQ and not ours:
        if node.attrs.get("block_size") or node.input(0) not in island.values:
            return None
        params = scalar_params(graph, node.input(1), node.input(2))
        side = node.outputs[0] if node.op_type == "QuantizeLinear" else node.input(0)
        if params is None or graph.dtype_of(side) != params[2]:
            return None
        if node.attrs.get("output_dtype") and not node.input(2):
            return None  # (an output dtype given by attribute alone: as qdq.requantized)
        return []
    if node.op_type not in _ELEMENTWISE and not ours:
        return None
    consts = []
    for name in node.inputs:
        if not name or name in island.values:
            continue
        c = graph.const(name)
        if c is not None:
            if c.size != 1 or (c.ndim > 0 and (rank is None or c.ndim > rank)):
                return None  # (a constant of higher rank would make the output bigger than the input)
            continue
        dq = _constant_dq(graph, producers, name)
        if dq is None or (rank is None and graph.const(dq.input(0)).ndim > 0):
            return None
        consts.append(dq)
    return consts if any(i in island.values for i in node.inputs if i) else None


def _grow(graph: Graph, source: str, producers: dict, consumers: dict) -> _Island:
    island = _Island(source)
    shape = graph.shape_of(source)
    rank = len(shape) if shape is not None else None
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    members: set[int] = set()
    work = [source]
    while work:
        for reader in consumers.get(work.pop(), []):
            if id(reader) in members:
                continue
            consts = _admits(graph, reader, island, producers, rank)
            if consts is None:
                continue
            members.add(id(reader))
            island.nodes.append(reader)
            island.constants.extend(c for c in consts if all(c is not k for k in island.constants))
            out = reader.outputs[0]
            island.values.add(out)
            if reader.op_type not in _QDQ or any(i in island.computed for i in reader.inputs if i):
                island.computed.add(out)
            work.append(out)
    island.nodes.sort(key=lambda n: order[id(n)])
    return island


def _exits(graph: Graph, island: _Island, consumers: dict) -> list[Node]:
    """The island's QuantizeLinear nodes whose bytes are read outside it, directly or dequantized."""
    inside = {id(n) for n in island.nodes}
    outputs = graph.output_names()

    def read_outside(name: str) -> bool:
        return name in outputs or any(id(r) not in inside for r in consumers.get(name, []))

    found = []
    for q in island.nodes:
        if q.op_type != "QuantizeLinear" or q.outputs[0] not in island.computed:
            continue
        out = q.outputs[0]
        if read_outside(out) or any(read_outside(r.outputs[0]) for r in consumers.get(out, [])
                                    if id(r) in inside and r.op_type == "DequantizeLinear"):
            found.append(q)
    return found


def tables(graph: Graph, island: _Island) -> dict[str, np.ndarray]:
    """Every value of the island computed from all 256 source bytes (entry i: the raw byte i), by the kernels
    the plan would run."""
    dtype = np.dtype(graph.dtype_of(island.source))
    values: dict[str, np.ndarray] = {island.source: np.arange(256, dtype=np.uint8).view(dtype)}
    with np.errstate(all="ignore"):  # (a Sqrt or Div of some bytes gives NaN / inf: the plan's kernels too)
        for node in [*island.constants, *island.nodes]:
            inputs = [None if not i else values[i] if i in values else graph.const(i) for i in node.inputs]
            values[node.outputs[0]] = evaluate_node(node, inputs, graph.opsets)[0]
    return values


def _prune(graph: Graph, island: _Island) -> None:
    """Remove the island's nodes no one reads any more (last to first)."""
    outputs = graph.output_names()
    dead: set[int] = set()
    consumers = graph_queries.consumers(graph)
    for node in reversed(island.nodes):
        readers = [r for r in consumers.get(node.outputs[0], []) if id(r) not in dead]
        if not readers and node.outputs[0] not in outputs:
            dead.add(id(node))
    if dead:
        graph.nodes = [n for n in graph.nodes if id(n) not in dead]
        drop_values(graph, *[n.outputs[0] for n in island.nodes if id(n) in dead])


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"tables": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    claimed: set[int] = set()
    replace: dict[int, Node] = {}
    islands = []
    for node in graph.nodes:
        src = node.input(0) if is_std(node, "DequantizeLinear") and id(node) not in claimed else None
        if not src or graph.const(src) is not None or graph.dtype_of(src) not in RANGE:
            continue
        island = _grow(graph, src, producers, consumers)
        claimed.update(id(n) for n in island.nodes)
        exits = _exits(graph, island, consumers)
        if not exits:
            continue
        values = tables(graph, island)
        for q in exits:
            table = np.ascontiguousarray(values[q.outputs[0]].reshape(-1))
            if table.shape != (256,) or table.dtype.name not in RANGE:
                continue  # (an op that broadcast beyond element-wise: left as it was)
            name = names.initializer(f"{q.outputs[0]}_table", table)
            replace[id(q)] = Node("QLookup", [src, name], [q.outputs[0]], {}, names.fresh(f"{q.name}_lookup"),
                                  OPTCLI_DOMAIN)
        islands.append(island)
    if replace:
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes]
        for island in islands:
            island.nodes = [replace.get(id(n), n) for n in island.nodes if id(n) not in replace]
            _prune(graph, island)
        drop_unread_dequantize(graph)
    return {"tables": len(replace)}
