"""Fold the constant affine steps after a Conv, ConvTranspose or FullyConnected into its weights and bias.

Exporters leave elementwise arithmetic by constants after a layer: ConvNeXt's layer scale
(``gamma * block(x)``), BatchNormalization split into ``Mul`` and ``Add``, PaddlePaddle's learnable
affine block (``x * a + b`` with one-element ``a`` and ``b``, after every conv of PP-LCNetV3 and
PP-HGNetV2), ``(x + b) * a``, ``x / a - b``.  Each is one more pass over the activations, but a chain
of ``Mul``/``Div``/``Add``/``Sub`` by constants that are scalars or vary only along the output
channels is ``scale * y + shift`` per channel, and multiplying an output channel by ``s`` and
adding ``t`` is the same as scaling that channel's filter by ``s`` and its bias to ``s * b + t``
(onnxruntime: ConvMulFusion, ConvAddFusion).  ``Sub(c, y)`` is a scale of -1 and a shift of ``c``;
``Div(y, c)`` a scale of ``1 / c`` (refused where ``c`` holds a zero).

A positive scale also passes through a following Relu, LeakyRelu or PRelu, since
``f(a * y) = a * f(y)`` for ``a > 0`` there: ``Relu(conv) * a`` becomes ``Relu(conv')``.  Nothing
else does: a shift changes where the activation bends, a negative scale mirrors it, and Clip,
HardSwish or Sigmoid are not scale-invariant.

Only where the layer has no fused epilogue yet, each value in the chain is read by the next
node alone (and is no graph output), every constant is finite float and does not grow the output
by broadcasting, and the folded weights stay finite.  Folded weights and biases are new
initializers (``fuse_conv_bn``'s folding), so a weight shared with another layer is left alone;
a chain of shifts alone keeps the weight as it is.  Runs after ``fuse_matmul_add`` (dense layers
are FullyConnected by then) and before ``fuse_conv_bias_activation``, which then takes the
activation the chain ended with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.affine import affine_step
from optcli.passes._helpers.graph_queries import drop_values, has_epilogue, is_float, rank_of, sole_consumer, sync_proto
from optcli.passes.fuse_conv_bn import scale_conv

NAME = "fuse_conv_scale"
DESCRIPTION = ("fold Mul/Div/Add/Sub by scalar or per-channel constants after Conv/ConvTranspose/FullyConnected "
               "(a positive scale also through Relu/LeakyRelu/PRelu) into its weights and bias")

POSITIVELY_HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu")  # f(a * y) = a * f(y) for every a > 0


def _layout(graph: Graph, node: Node) -> tuple[np.ndarray, int | None, int, int] | None:
    """(weight, output rank, channel axis, channel count) of a layer whose weight we can scale."""
    w = graph.const(node.input(1))
    if not is_float(w) or has_epilogue(node) or len(node.outputs) != 1:
        return None
    if node.domain in ("", "ai.onnx") and node.op_type == "Conv" and w.ndim >= 3:
        return w, w.ndim, 1, w.shape[0]
    if node.domain in ("", "ai.onnx") and node.op_type == "ConvTranspose" and w.ndim >= 3:
        return w, w.ndim, 1, w.shape[1] * int(node.attrs.get("group", 1))
    if node.domain == OPTCLI_DOMAIN and node.op_type == "FullyConnected" and w.ndim == 2:
        return w, rank_of(graph, node.input(0)), -1, w.shape[1]
    return None


def _homogeneous(node: Node, data: str) -> bool:
    """Whether ``node`` is an activation a positive scale can move in front of, reading ``data``.

    PRelu's slope may be anything, even computed: ``prelu(a * y, s) = a * prelu(y, s)`` holds
    element by element.  Where the slope broadcasts the output larger, the scale (a scalar, or a
    vector along the layer's channels) still lines up with the same elements before and after."""
    return node.op_type in POSITIVELY_HOMOGENEOUS and node.domain in ("", "ai.onnx") and not has_epilogue(node) \
        and node.input(0) == data and len(node.outputs) == 1


def _chain(graph: Graph, consumers: dict[str, list[Node]], layer: Node, layout: tuple) -> tuple | None:
    """The foldable nodes after ``layer``: (before, activation, after, scale, shift), or None.

    ``before`` are the affine steps right after the layer, ``after`` the positive scales behind
    the activation (empty, with activation None, when there is none to cross)."""
    channels = layout[3]
    scale, shift = np.ones(channels), np.zeros(channels)
    before: list[Node] = []
    after: list[Node] = []
    activation = None
    value = layer.outputs[0]
    while (reader := sole_consumer(graph, consumers, value)) is not None:
        if activation is None and _homogeneous(reader, value):
            activation, value = reader, reader.outputs[0]
            continue
        step = affine_step(graph, reader, value, *layout[1:])
        if step is None or (activation is not None and (np.any(step[0] <= 0) or np.any(step[1] != 0))):
            break
        scale, shift = scale * step[0], shift * step[0] + step[1]
        (after if activation is not None else before).append(reader)
        value = reader.outputs[0]
    if not after:
        activation = None
    return (before, activation, after, scale, shift) if before or after else None


def _fits(w: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, shift: np.ndarray) -> bool:
    """Whether the folded weight and bias stay finite in the weight's type (``1 / 1e-40`` would not)."""
    top = float(np.finfo(w.dtype).max)
    b = 0.0 if bias is None or not bias.size else float(np.abs(bias).max())
    big = float(np.abs(scale).max())
    return float(np.abs(w).max(initial=0.0)) * big < top and b * big + float(np.abs(shift).max()) < top


def _scale_dense(graph: Graph, names: Names, fc: Node, scale: np.ndarray, shift: np.ndarray) -> bool:
    """FullyConnected's ``scale * (X @ W + B) + shift``: scale W's columns and B (new initializers)."""
    w = graph.const(fc.input(1))
    b = graph.const(fc.input(2)) if fc.input(2) else None
    if fc.input(2) and (b is None or b.size != w.shape[1]):
        return False
    base = fc.name or "fc"
    weight = fc.inputs[1]
    if np.any(scale != 1):
        weight = names.initializer(f"{base}_scaled_weight", (w.astype(np.float64) * scale).astype(w.dtype))
    bias = shift if b is None else b.astype(np.float64).reshape(-1) * scale + shift
    fc.inputs = [fc.inputs[0], weight, names.initializer(f"{base}_scaled_bias", bias.astype(w.dtype))]
    return True


def _fold(graph: Graph, names: Names, layer: Node, layout: tuple, chain: tuple) -> bool:
    before, activation, after, scale, shift = chain
    w = layout[0]
    bias = graph.const(layer.input(2)) if layer.input(2) else None
    if not _fits(w, bias, scale, shift):
        return False
    if layer.op_type == "FullyConnected":
        if not _scale_dense(graph, names, layer, scale, shift):
            return False
    elif not scale_conv(graph, names, layer, scale, shift):
        return False
    if activation is None:
        out = before[-1].outputs[0]
    else:
        # The activation now reads the layer and writes what the last scale wrote.
        out = activation.input(0)
        drop_values(graph, activation.outputs[0], *(n.outputs[0] for n in after[:-1]))
        activation.outputs = [after[-1].outputs[0]]
        sync_proto(activation)
    drop_values(graph, *(n for n in [layer.outputs[0], *(n.outputs[0] for n in before)] if n != out))
    layer.outputs = [out]
    sync_proto(layer)
    return True


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    # A fold only renames values inside its own chain, so one snapshot of the readers serves all.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    folded: set[int] = set()
    through = 0
    for layer in list(graph.nodes):
        layout = _layout(graph, layer)
        chain = _chain(graph, consumers, layer, layout) if layout is not None else None
        if chain is not None and _fold(graph, names, layer, layout, chain):
            folded.update(id(n) for n in chain[0] + chain[2])
            through += chain[1] is not None
    graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    return {"fused": len(folded), "through_activation": through}
