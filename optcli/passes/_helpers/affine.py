"""Elementwise arithmetic by a constant, read as a per-channel affine map ``scale * x + shift``.

Shared by the passes that fold such steps into a layer's weights: after the layer
(``fuse_conv_scale``) and before a conv (``fold_affine_into_next_conv``), so both accept and
refuse exactly the same steps.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Graph, Node
from optcli.passes._helpers.graph_queries import channel_vector, has_epilogue, is_float

ARITHMETIC = ("Mul", "Div", "Add", "Sub")


def affine_step(
    graph: Graph, node: Node, data: str, rank: int | None, axis: int, channels: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel, in float64, with ``node(data) = scale * data + shift``; else None.

    Only for a float constant that is finite and a scalar or a vector along ``axis`` of a tensor
    of ``rank`` (``channel_vector``); ``Sub(c, x)`` is a scale of -1, ``Div(x, c)`` a scale of
    ``1 / c`` where ``c`` holds no zero, and ``Div(c, x)`` no affine map at all."""
    if node.op_type not in ARITHMETIC or node.domain not in ("", "ai.onnx") or has_epilogue(node) \
            or len(node.inputs) != 2 or len(node.outputs) != 1 or node.inputs.count(data) != 1:
        return None
    data_first = node.input(0) == data
    c = graph.const(node.input(1) if data_first else node.input(0))
    if not is_float(c) or not np.all(np.isfinite(c)):
        return None
    v = channel_vector(c, rank, axis, channels)
    if v is None:
        return None
    v, one, zero = v.astype(np.float64), np.ones(channels), np.zeros(channels)
    if node.op_type == "Mul":
        return v, zero
    if node.op_type == "Add":
        return one, v
    if node.op_type == "Sub":
        return (one, -v) if data_first else (-one, v)
    return (1.0 / v, zero) if data_first and np.all(v != 0) else None
