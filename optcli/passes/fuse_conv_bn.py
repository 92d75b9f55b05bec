"""Fold an inference-mode BatchNormalization into the Conv or ConvTranspose before it.

BN after a conv is a per-output-channel affine map, ``s * (conv(x) + b - mean) + beta`` with
``s = gamma / sqrt(var + eps)``, so scaling each output channel's filter by ``s`` and replacing
the bias by ``s * (b - mean) + beta`` computes the same thing with one node and no extra pass
over the activations.  Works for grouped and depthwise convs: Conv weights are
``[C_out, C_in/group, k...]``; ConvTranspose weights are ``[C_in, C_out/group, k...]``, so there
the output channel of a weight is (group, column).  The folded weights are new initializers, so
a weight shared with another conv is left intact for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import (
    drop_values,
    has_epilogue,
    is_float,
    is_unused,
    sole_consumer,
    sync_proto,
)

NAME = "fuse_conv_bn"
DESCRIPTION = "fold BatchNormalization (constant params) into the preceding Conv/ConvTranspose weights"


def bn_scale_shift(
    graph: Graph, bn: Node, consumers: dict[str, list[Node]]
) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) of an inference-mode BN with constant parameters, in float64, else None."""
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or len(bn.inputs) < 5:
        return None
    if bn.attrs.get("training_mode", 0) or not bn.attrs.get("spatial", 1):
        return None
    if any(not is_unused(graph, consumers, o) for o in bn.outputs[1:]):
        return None
    params = [graph.const(bn.input(i)) for i in range(1, 5)]
    if any(p is None or not is_float(p) or p.ndim != 1 for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    if len({gamma.size, beta.size, mean.size, var.size}) != 1:
        return None
    scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return scale, beta - mean * scale


def fold_scale_shift(graph: Graph, names: Names, conv: Node, bn: Node, scale: np.ndarray, shift: np.ndarray) -> bool:
    if not scale_conv(graph, names, conv, scale, shift):
        return False
    drop_values(graph, conv.outputs[0])
    conv.outputs = [bn.outputs[0]]
    sync_proto(conv)
    return True


def scale_conv(graph: Graph, names: Names, conv: Node, scale: np.ndarray, shift: np.ndarray) -> bool:
    """Make ``conv`` compute ``scale * conv(x) + shift`` per output channel (new weight and bias
    initializers; a scale of exactly one keeps the weight, so a shift alone copies no filters);
    False, changing nothing, where its weights or bias are not constants that fit."""
    w = graph.const(conv.input(1))
    b = graph.const(conv.input(2)) if conv.input(2) else None
    if not is_float(w) or w.ndim < 3 or (conv.input(2) and b is None):
        return False
    group = int(conv.attrs.get("group", 1))
    channels = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * group
    if scale.size != channels or (conv.op_type == "ConvTranspose" and w.shape[0] % group):
        return False
    if conv.op_type == "Conv":
        w_scaled = w.astype(np.float64) * scale.reshape((channels,) + (1,) * (w.ndim - 1))
    else:
        # [C_in, C_out/group, k...] -> [group, C_in/group, C_out/group, k...]: scale the last group axis.
        per_group = w.shape[1]
        grouped = w.astype(np.float64).reshape((group, w.shape[0] // group) + w.shape[1:])
        s = scale.reshape((group, 1, per_group) + (1,) * (w.ndim - 2))
        w_scaled = (grouped * s).reshape(w.shape)
    bias = np.zeros(channels) if b is None else b.astype(np.float64).reshape(-1)
    if bias.size != channels:
        return False
    base = conv.name or conv.op_type
    new_w = conv.inputs[1] if np.all(scale == 1) else names.initializer(f"{base}_bn_weight", w_scaled.astype(w.dtype))
    new_b = names.initializer(f"{base}_bn_bias", (bias * scale + shift).astype(w.dtype))
    conv.inputs = [conv.inputs[0], new_w, new_b]
    sync_proto(conv)
    return True


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    # Folding one BN never changes who reads another conv's output, so one snapshot serves all.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    folded: set[int] = set()
    for conv in list(graph.nodes):
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx"):
            continue
        if has_epilogue(conv):
            continue
        bn = sole_consumer(graph, consumers, conv.outputs[0])
        if bn is None or bn.input(0) != conv.outputs[0]:
            continue
        params = bn_scale_shift(graph, bn, consumers)
        if params is not None and fold_scale_shift(graph, names, conv, bn, *params):
            folded.add(id(bn))
    graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    return {"fused": len(folded)}
