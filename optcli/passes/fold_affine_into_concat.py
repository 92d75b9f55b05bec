"""Fold a ChannelAffine (a stand-alone BatchNormalization, with its activation) that follows a
channel Concat of convs into those convs.

MixNet's mixed depthwise convolutions split the channels, run one conv per kernel size and
concatenate the results; the BatchNormalization and Swish after the Concat reach no single conv,
so ``fuse_conv_bn`` leaves them as a ChannelAffine: one more pass over the activations, 34 of
them in timm's mixnet_s (about 14% of its time on the host).  A per-channel affine map and an
element-wise activation commute with a concatenation along channels: each conv takes its slice
of the scale and shift into its weights and bias, and the activation as its epilogue; the Concat
then produces the ChannelAffine's output.

Only when every Concat input comes from a Conv read by the Concat alone and with no epilogue yet,
and the Concat output is read by the ChannelAffine alone; runs after
``fuse_conv_bias_activation``, which gave the ChannelAffine its activation (so every target
takes that activation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.ops.activation import QUANT_ATTR
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import drop_values, has_epilogue, is_float, rank_of, sole_consumer, sync_proto
from optcli.passes.fuse_conv_bn import scale_conv

NAME = "fold_affine_into_concat"
DESCRIPTION = "ChannelAffine (+ activation) after a channel Concat of convs -> folded into each conv"

EPILOGUE = ("activation", "activation_alpha", "activation_beta")


def _scalable(graph: Graph, conv: Node) -> bool:
    """Whether ``scale_conv`` takes this conv: constant float weights, a constant bias of their size."""
    w = graph.const(conv.input(1))
    b = graph.const(conv.input(2)) if conv.input(2) else None
    return is_float(w) and w.ndim >= 3 and (not conv.input(2) or (b is not None and b.size == w.shape[0]))


def _convs(graph: Graph, consumers: dict[str, list[Node]], concat: Node) -> list[Node] | None:
    """The convs producing every input of ``concat``, each read by it alone; else None."""
    producers = {o: n for n in graph.nodes for o in n.outputs}
    convs = []
    for name in concat.inputs:
        conv = producers.get(name)
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or has_epilogue(conv) \
                or conv.proto is not None or not _scalable(graph, conv) \
                or sole_consumer(graph, consumers, name) is not concat:
            return None
        convs.append(conv)
    return convs if len(set(map(id, convs))) == len(convs) else None


def _fold(graph: Graph, names: Names, consumers: dict[str, list[Node]], affine: Node) -> bool:
    scale = graph.const(affine.input(1))
    shift = graph.const(affine.input(2)) if affine.input(2) else None
    if not is_float(scale) or scale.ndim != 1:
        return False
    if affine.input(2) and (not is_float(shift) or shift.size != scale.size):
        return False
    concat = next((n for n in graph.nodes if affine.input(0) in n.outputs), None)
    if concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") \
            or sole_consumer(graph, consumers, affine.input(0)) is not affine:
        return False
    rank = rank_of(graph, concat.outputs[0])
    if rank is None or int(concat.attrs.get("axis", 0)) not in (1, 1 - rank):
        return False
    convs = _convs(graph, consumers, concat)
    weights = [graph.const(c.input(1)) for c in convs or []]
    if not convs or sum(w.shape[0] for w in weights) != scale.size:
        return False
    s = scale.astype(np.float64)
    b = np.zeros_like(s) if shift is None else shift.astype(np.float64)
    start = 0
    for conv, w in zip(convs, weights):
        end = start + w.shape[0]
        folded = scale_conv(graph, names, conv, s[start:end], b[start:end])
        assert folded, "_scalable admitted a conv scale_conv refuses"
        start = end
    for conv in convs:
        conv.attrs.update({k: affine.attrs[k] for k in EPILOGUE if k in affine.attrs})
        sync_proto(conv)
    drop_values(graph, concat.outputs[0])
    concat.outputs = [affine.outputs[0]]
    return True


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    # One fold changes only its own Concat's and convs' readers, so one snapshot serves all.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    gone: set[int] = set()
    for node in list(graph.nodes):
        if node.op_type == "ChannelAffine" and node.domain == OPTCLI_DOMAIN and len(node.outputs) == 1 \
                and QUANT_ATTR not in node.attrs and _fold(graph, names, consumers, node):
            gone.add(id(node))
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return {"folded": len(gone)}
