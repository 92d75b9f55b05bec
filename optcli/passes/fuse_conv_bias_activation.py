"""Fold a following per-channel bias Add and one activation into a conv/dense node's epilogue.

``Conv``/``ConvTranspose``/``Gemm``/``FullyConnected``/``ChannelAffine`` followed by ``Add`` of a
constant that only varies along the channel axis (axis 1, or the last axis for the dense ops)
gets the constant added to its own bias.  Followed by one activation (Relu, Clip with constant
bounds, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, optcli Swish) it gets the fused
epilogue attributes ``activation``/``activation_alpha``/``activation_beta`` (see
``optcli.ops.activation``), so the result is written once instead of read and rewritten.

Element-wise ``Add``/``Sub``/``Mul`` of floats take the activation too (a residual Add followed
by Relu, as in every ResNet block, becomes one pass over memory instead of two).

Only when the node's output has exactly one reader and is not a graph output, the node has no
epilogue yet, and every target in the context lists the activation in ``fused_activations``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.ops.activation import activation_as_epilogue
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import (
    activation_allowed,
    channel_vector,
    drop_values,
    has_epilogue,
    is_float,
    rank_of,
    sole_consumer,
    sync_proto,
)

NAME = "fuse_conv_bias_activation"
DESCRIPTION = ("fold per-channel bias Add and one activation into Conv/ConvTranspose/Gemm/FC/ChannelAffine; "
               "an activation into float Add/Sub/Mul")

PRODUCERS = {("", "Conv"), ("", "ConvTranspose"), ("", "Gemm"), (OPTCLI_DOMAIN, "FullyConnected"),
             (OPTCLI_DOMAIN, "ChannelAffine")}
ELEMENTWISE = {("", "Add"), ("", "Sub"), ("", "Mul")}


def _layout(graph: Graph, node: Node) -> tuple[int | None, int, int, int] | None:
    """(output rank, channel axis, channel count, index of the bias input), or None when unknown
    or the bias input is not a constant we can rewrite."""
    w = graph.const(node.input(1))
    if node.op_type == "Conv" and w is not None:
        return w.ndim, 1, w.shape[0], 2
    if node.op_type == "ConvTranspose" and w is not None:
        return w.ndim, 1, w.shape[1] * int(node.attrs.get("group", 1)), 2
    if node.op_type == "FullyConnected" and w is not None and w.ndim == 2:
        return rank_of(graph, node.input(0)), -1, w.shape[1], 2
    if node.op_type == "ChannelAffine" and w is not None:
        return rank_of(graph, node.input(0)), 1, w.size, 2
    if node.op_type == "Gemm":
        shape = graph.shape_of(node.outputs[0])
        if shape and isinstance(shape[-1], int):
            return 2, -1, shape[-1], 2
    return None


def _fold_bias(graph: Graph, names: Names, node: Node, add: Node) -> bool:
    layout = _layout(graph, node)
    others = [i for i in add.inputs if i != node.outputs[0]]
    if layout is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(others) != 1:
        return False
    rank, axis, channels, bias_index = layout
    c = graph.const(others[0])
    vec = channel_vector(c, rank, axis, channels) if is_float(c) else None
    old = graph.const(node.input(bias_index)) if node.input(bias_index) else None
    if vec is None or (node.input(bias_index) and old is None):
        return False
    if node.op_type == "Gemm":
        beta = float(node.attrs.get("beta", 1.0)) if old is not None else 1.0
        if beta == 0.0:
            return False
        # Gemm adds beta * C, with C broadcast to [M, N]: keep C's shape, add the vector / beta.
        new = vec.astype(np.float64) / beta if old is None else old.astype(np.float64) + vec / beta
        node.attrs["beta"] = beta
    else:
        new = vec.astype(np.float64) if old is None else old.astype(np.float64).reshape(-1) + vec
    dtype = old.dtype if old is not None else c.dtype
    name = names.initializer(f"{node.name or node.op_type}_bias", new.astype(dtype))
    while len(node.inputs) <= bias_index:
        node.inputs.append("")
    node.inputs[bias_index] = name
    sync_proto(node)
    return True


def _absorb(graph: Graph, node: Node, reader: Node, gone: set[int]) -> None:
    """``node`` now produces what ``reader`` produced; ``reader`` goes."""
    drop_values(graph, node.outputs[0])
    node.outputs = [reader.outputs[0]]
    gone.add(id(reader))


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"bias": 0, "activation": 0}
    # Readers are recorded by value name; absorbing an Add or activation never changes who reads
    # another producer's output, so one snapshot serves the whole pass.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    gone: set[int] = set()
    for node in list(graph.nodes):
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        if key in ELEMENTWISE and graph.dtype_of(node.outputs[0]) in ("float32", "float16", "float64"):
            pass  # activation only: they have no bias to fold
        elif key not in PRODUCERS:
            continue
        if has_epilogue(node) or len(node.outputs) != 1:
            continue
        reader = sole_consumer(graph, consumers, node.outputs[0])
        if reader is not None and _fold_bias(graph, names, node, reader):
            _absorb(graph, node, reader, gone)
            counts["bias"] += 1
            reader = sole_consumer(graph, consumers, node.outputs[0])
        if reader is None or reader.input(0) != node.outputs[0]:
            continue
        epilogue = activation_as_epilogue(reader, graph.const)
        if epilogue is None or not activation_allowed(ctx, epilogue[0]):
            continue
        if node.proto is not None:
            continue  # runs through the ONNX reference, which knows no fused epilogue
        node.attrs.update(zip(("activation", "activation_alpha", "activation_beta"), epilogue))
        _absorb(graph, node, reader, gone)
        counts["activation"] += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return counts
