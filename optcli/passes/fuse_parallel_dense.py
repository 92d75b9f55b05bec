"""Fuse the dense layers that read one input into one: ``FullyConnected``s of the same X (a
transformer's query, key and value projections) become one FullyConnected over their weights side
by side ([K, N1 + N2 + ...], the biases likewise) and a ``Split`` of its last axis into the old
outputs.

Why: each of BERT-tiny's [32, 128] @ [128, 128] projections is ~0.5 M multiply-adds, under the
size where the native GEMM hands work to a second thread, so at 2 threads they ran on one core,
three calls in a row; the fused [128, 384] product is split over the pool, and reads X once.  At
one thread the fused product costs what the three did (the Split's views add nothing: the
exporters' Reshape after each projection copies anyway).

Only where every target runs on the host (a GPU plan keeps its layers as the exporter wrote them),
for float32 layers with constant weights of one K and constant (or no) biases, with the same fused
activation and no fused FakeQuant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node, Value
from optcli.ops.activation import QUANT_ATTR
from optcli.passes._helpers.graph_queries import EPILOGUE_ATTRS, opset

NAME = "fuse_parallel_dense"
DESCRIPTION = "FullyConnected layers reading one input (query/key/value) -> one FullyConnected and a Split (host plans)"
MAX_FUSED_COLUMNS = 1 << 16  # N of the fused layer at most (the weights side by side stay a modest copy)


def _key(graph: Graph, node: Node) -> tuple | None:
    """What layers must share to be fused (input, K, epilogue), or None for a layer that cannot be."""
    if node.domain != OPTCLI_DOMAIN or node.op_type != "FullyConnected" or node.proto is not None \
            or len(node.outputs) != 1 or QUANT_ATTR in node.attrs or set(node.attrs) - set(EPILOGUE_ATTRS):
        return None
    w = graph.const(node.input(1))
    if w is None or w.ndim != 2 or w.dtype != np.float32 or not node.outputs[0]:
        return None
    if node.input(2):
        b = graph.const(node.input(2))
        if b is None or b.dtype != np.float32 or b.shape not in ((w.shape[1],), (1, w.shape[1])):
            return None
    epilogue = tuple(sorted((k, v) for k, v in node.attrs.items() if k in EPILOGUE_ATTRS))
    return node.inputs[0], w.shape[0], epilogue


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"groups": 0, "layers": 0}
    targets = getattr(ctx, "targets", None) or []
    if not targets or any(getattr(t, "device", "cpu") != "cpu" for t in targets):
        return counts
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        key = _key(graph, node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    names = Names(graph)
    replaced: dict[int, list[Node]] = {}  # id of a group's first layer -> the fused layer and its Split
    gone: set[int] = set()
    for (x, _, _), layers in groups.items():
        if len(layers) < 2:
            continue
        ws = [graph.const(n.input(1)) for n in layers]
        widths = [w.shape[1] for w in ws]
        if sum(widths) > MAX_FUSED_COLUMNS:
            continue
        weight = names.initializer(f"{layers[0].name or 'fc'}_fused_weight", np.concatenate(ws, axis=1))
        inputs = [x, weight]
        if any(n.input(2) for n in layers):
            biases = [graph.const(n.input(2)).reshape(-1) if n.input(2) else np.zeros(k, np.float32)
                      for n, k in zip(layers, widths)]
            inputs.append(names.initializer(f"{layers[0].name or 'fc'}_fused_bias", np.concatenate(biases)))
        fused_out = names.fresh(f"{layers[0].outputs[0]}_fused")
        first = layers[0]
        shape = graph.shape_of(first.outputs[0])
        graph.values[fused_out] = Value(fused_out, graph.dtype_of(first.outputs[0]) or "float32",
                                        None if shape is None else (*shape[:-1], sum(widths)))
        fused = Node("FullyConnected", inputs, [fused_out], {k: v for k, v in first.attrs.items()
                                                             if k in EPILOGUE_ATTRS},
                     names.fresh(f"{first.name or 'fc'}_fused"), OPTCLI_DOMAIN)
        outputs = [n.outputs[0] for n in layers]
        split_name = names.fresh(f"{first.name or 'fc'}_split")
        if opset(graph) >= 13:
            sizes = names.initializer(f"{first.name or 'fc'}_split_sizes", np.array(widths, np.int64))
            split = Node("Split", [fused_out, sizes], outputs, {"axis": -1}, split_name)
        else:
            split = Node("Split", [fused_out], outputs, {"axis": -1, "split": widths}, split_name)
        replaced[id(first)] = [fused, split]
        gone.update(id(n) for n in layers[1:])
        counts["groups"] += 1
        counts["layers"] += len(layers)
    if replaced:
        nodes: list[Node] = []
        for node in graph.nodes:
            if id(node) in replaced:
                nodes.extend(replaced[id(node)])
            elif id(node) not in gone:
                nodes.append(node)
        graph.nodes = nodes
    return counts
