"""Turn a stand-alone inference BatchNormalization into ``optcli.ChannelAffine``.

A BN that ``fuse_conv_bn`` could not fold (after a pooling, an add, a graph input) is still just
``x * scale + shift`` per channel with ``scale = gamma / sqrt(var + eps)`` and
``shift = beta - mean * scale``.  Precomputing the two vectors saves the kernel the square root
and the two extra parameter reads, and ChannelAffine can carry a fused activation epilogue.
"""

from __future__ import annotations

from typing import Any

from optcli.ir import OPTCLI_DOMAIN, Graph, Names
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import become, rank_of
from optcli.passes.fuse_conv_bn import bn_scale_shift

NAME = "batchnorm_to_affine"
DESCRIPTION = "stand-alone BatchNormalization (constant params) -> optcli.ChannelAffine(x, scale, shift)"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    converted = 0
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    for bn in list(graph.nodes):
        if bn.op_type != "BatchNormalization":
            continue
        rank = rank_of(graph, bn.input(0))
        if rank is not None and rank < 2:
            continue
        params = bn_scale_shift(graph, bn, consumers)
        if params is None:
            continue
        # Scale and shift take the data's type (BN allows float32 params on float16 data).
        dtype = graph.dtype_of(bn.input(0)) or graph.const(bn.input(1)).dtype
        base = bn.name or "bn"
        scale = names.initializer(f"{base}_scale", params[0].astype(dtype))
        shift = names.initializer(f"{base}_shift", params[1].astype(dtype))
        for extra in bn.outputs[1:]:
            graph.values.pop(extra, None)
        bn.outputs = bn.outputs[:1]
        become(bn, "ChannelAffine", [bn.inputs[0], scale, shift], OPTCLI_DOMAIN)
        converted += 1
    return {"converted": converted}
