"""The static part of a dynamic shape: ``Gather``/``Slice`` over ``Shape(x)`` that pick only fixed dims.

A model exported with a dynamic batch still computes its TensorFlow-style padding from the
image's height and width, and a ViT its attention scale from the head size: ``Shape(x)`` is not
constant (dim 0 is a symbol), but ``Gather(Shape(x), 2)`` is.  ``fold_constants`` asks this
helper for such values so the arithmetic behind them folds away as it does with a static input
(what onnxruntime's constant folding of shape subgraphs does).
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Dim, Graph, Node

STANDARD = ("", "ai.onnx")


def _shape_dims(graph: Graph, shape_node: Node) -> list[Dim] | None:
    """The dims ``Shape`` outputs (its start/end attributes applied), ints where known."""
    shape = graph.shape_of(shape_node.input(0))
    if shape is None:
        return None
    rank = len(shape)
    start = int(shape_node.attrs.get("start", 0))
    end = int(shape_node.attrs.get("end", rank))
    return list(shape)[slice(start, end)]


def _ints(graph: Graph, name: str) -> list[int] | None:
    value = graph.const(name)
    if value is None or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


def _picked(dims: list[Dim], node: Node, graph: Graph) -> np.ndarray | None:
    if node.op_type == "Gather":
        if int(node.attrs.get("axis", 0)) != 0:
            return None
        index = graph.const(node.input(1))
        if index is None or index.dtype.kind not in "iu":
            return None
        flat = [int(i) + (len(dims) if int(i) < 0 else 0) for i in index.reshape(-1)]
        if any(not 0 <= i < len(dims) for i in flat):
            return None  # out of range: evaluating the node reports it
        picked = [dims[i] for i in flat]
        shape = index.shape
    else:  # Slice, opset 10+ (inputs) over the 1-D shape vector
        starts, ends = _ints(graph, node.input(1)), _ints(graph, node.input(2))
        axes = _ints(graph, node.input(3)) if node.input(3) else [0]
        steps = _ints(graph, node.input(4)) if node.input(4) else [1]
        if starts is None or ends is None or axes is None or steps is None:
            return None
        if len(starts) != 1 or axes[0] not in (0, -1) or steps[0] <= 0:
            return None
        picked = dims[slice(starts[0], ends[0], steps[0])]  # python clamps as ONNX does for step > 0
        shape = (len(picked),)
    if not all(isinstance(d, int) for d in picked):
        return None
    return np.array(picked, dtype=np.int64).reshape(shape)


def static_part(graph: Graph, node: Node, producers: dict[str, Node]) -> np.ndarray | None:
    """The value of ``Gather``/``Slice`` over a ``Shape`` output when every dim it picks is fixed."""
    if node.op_type not in ("Gather", "Slice") or node.domain not in STANDARD or not node.inputs:
        return None
    if node.op_type == "Slice" and len(node.inputs) < 3:
        return None  # opset < 10 Slice (attributes): exporters of today do not write it over Shape
    source = producers.get(node.input(0))
    if source is None or source.op_type != "Shape" or source.domain not in STANDARD:
        return None
    dims = _shape_dims(graph, source)
    return None if dims is None else _picked(dims, node, graph)
