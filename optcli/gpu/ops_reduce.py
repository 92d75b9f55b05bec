"""GPU kernel for ReduceSum / ReduceMean / ReduceMax / ReduceMin over any axes of a rank <= 4
tensor (spatial, channel or batch), keepdims 0 or 1, axes from the attribute or a constant
input (whichever the node's opset uses)."""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import c4, dims4
from optcli.gpu.ops_elementwise import data_check, logical_axis_to4
from optcli.gpu.registry import Launch, gpu_kernel
from optcli.ir import Graph, Node

_OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3}


def _axes(node, const, rank: int) -> list[int] | str:
    name = node.inputs[1] if len(node.inputs) > 1 else ""
    if name:
        value = const(name)
        if value is None:
            return f"{node.op_type} axes must be a constant"
        axes = [int(a) for a in np.asarray(value).reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes") or []]
    if not axes:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            return f"{node.op_type} with noop_with_empty_axes and no axes (an identity)"
        return list(range(rank))
    return sorted({a + rank if a < 0 else a for a in axes})


def _check(node: Node, graph: Graph) -> str | None:
    shape = graph.shape_of(node.inputs[0])
    axes = _axes(node, graph.const, len(shape)) if shape is not None else None
    return axes if isinstance(axes, str) else data_check(node, graph)


@gpu_kernel(list(_OPS), check=_check)
def reduce(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    axes = _axes(node, ctx.const, len(shape))
    reduced = [0, 0, 0, 0]
    for a in axes:
        reduced[logical_axis_to4(len(shape), a)] = 1
    n, c, h, w = dims4(shape)
    kept = [1 if r else d for r, d in zip(reduced, (n, c, h, w))]
    count = kept[0] * c4(kept[1]) * kept[2] * kept[3]
    _, oc, oh, ow = dims4(ctx.shape(y))
    size = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    return [Launch("reduce.cl", "reduce4", [ctx.tensor(x), ctx.tensor(y), count, n, c, h, w, *reduced, oc, oh, ow,
                                            _OPS[node.op_type], 1.0 / max(size, 1)], (count,))]
