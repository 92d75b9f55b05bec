"""Fold a ``Transpose`` that only reorders the features a dense layer flattens into the layer's weight.

Exporters of channels-last code write ``Conv -> Transpose(0, 2, 3, 1) -> Flatten -> Dense``
(Keras through tf2onnx, Caffe ports such as MTCNN's ``permute(0, 3, 2, 1)`` before its fully
connected layers): the Transpose copies the whole feature map only so that the flattened features
come in another order.  The dense layer can take them in the order they already have: its weight's
rows are permuted once, at compile time, and the Transpose goes.  An MTCNN R-net spent two steps
(~8 us of ~260) on it.

Exact, and only where it is: the Transpose keeps the batch axis first (``perm[0] == 0``), its
output is read only by a ``Flatten(axis=1)`` (or a ``Reshape`` to ``[batch, features]`` with a
constant shape) whose output is read only by ``optcli.FullyConnected`` steps with a constant 2-D
weight of one row per feature; shapes static.  A weight another node also reads is copied, not
changed in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Node
from optcli.passes._helpers.graph_queries import (
    consumers,
    drop_values,
    remove_nodes,
    sole_consumer,
    static_shape,
    sync_proto,
)

NAME = "fold_transpose_into_dense"
DESCRIPTION = "drop a Transpose before Flatten -> FullyConnected by permuting the dense weight's rows"


def _flattens_to_rows(graph: Graph, node: Node, shape: tuple[int, ...]) -> bool:
    """Whether ``node`` (reading a value of ``shape``) makes it [shape[0], features]."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Flatten":
        return int(node.attrs.get("axis", 1)) == 1
    if node.op_type == "Reshape" and not int(node.attrs.get("allowzero", 0)):
        target = graph.const(node.input(1))
        if target is None or target.ndim != 1 or target.size != 2:
            return False
        rows, cols = (int(v) for v in target)
        features = int(np.prod(shape[1:]))
        return rows in (0, shape[0]) and cols in (-1, features)
    return False


def _row_order(shape: tuple[int, ...], perm: list[int]) -> np.ndarray:
    """index[k]: where feature k of the transposed, flattened tensor sits in the untransposed one."""
    return np.arange(int(np.prod(shape[1:]))).reshape(shape[1:]).transpose([p - 1 for p in perm[1:]]).reshape(-1)


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    folded = 0
    for transpose in list(graph.nodes):
        if transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
            continue
        shape = static_shape(graph, transpose.input(0))
        perm = [int(p) for p in transpose.attrs.get("perm", [])]
        if shape is None or len(shape) < 2 or sorted(perm) != list(range(len(shape))) or perm[0] != 0:
            continue
        readers = consumers(graph)
        flatten = sole_consumer(graph, readers, transpose.outputs[0])
        if flatten is None or flatten.input(0) != transpose.outputs[0] or not _flattens_to_rows(graph, flatten, shape):
            continue
        features = int(np.prod(shape[1:]))
        dense = readers.get(flatten.outputs[0], [])
        if not dense or flatten.outputs[0] in graph.output_names() or not all(
                d.op_type == "FullyConnected" and d.domain == OPTCLI_DOMAIN and d.input(0) == flatten.outputs[0]
                and d.input(1) != flatten.outputs[0] and (w := graph.const(d.input(1))) is not None
                and w.ndim == 2 and w.shape[0] == features for d in dense):
            continue
        order = _row_order(shape, perm)
        for d in dense:
            w = graph.const(d.input(1))
            permuted = np.empty_like(w)
            permuted[order] = w  # feature k of the transposed order reads row k; it is x's feature order[k]
            name = graph.unique_name(f"{d.input(1)}_rows_reordered")
            graph.initializers[name] = permuted
            d.inputs[1] = name
            sync_proto(d)
        flatten.inputs[0] = transpose.inputs[0]
        sync_proto(flatten)
        remove_nodes(graph, transpose)
        drop_values(graph, transpose.outputs[0])
        folded += 1
    return {"folded": folded} if folded else {}
