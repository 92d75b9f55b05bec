"""GPU kernels for Softmax and LogSoftmax along one axis (rank <= 4).  The axis maps onto the
packed layout: along channels (the classifier case, [N, K] with axis -1) one work item walks
the channel slices of a pixel; along N, H or W each work item owns four independent rows."""

from __future__ import annotations

from optcli.gpu.layout import c4, dims4, packed_elements
from optcli.gpu.ops_elementwise import data_check, logical_axis_to4
from optcli.gpu.registry import Launch, gpu_kernel
from optcli.ir import Graph, Node


def _check(node: Node, graph: Graph) -> str | None:
    reason = data_check(node, graph)
    if reason:
        return reason
    rank = len(graph.shape_of(node.inputs[0]))
    if rank == 0:
        return f"{node.op_type} of a scalar"
    if graph.opsets.get("", 13) < 13:
        axis = int(node.attrs.get("axis", 1))
        if (axis + rank if axis < 0 else axis) != rank - 1:
            return f"{node.op_type}-{graph.opsets['']} over the coerced 2-D input (axis {axis} of rank {rank})"
    return None


@gpu_kernel(["Softmax", "LogSoftmax"], check=_check)
def softmax(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axis = int(node.attrs.get("axis", -1))
    axis4 = logical_axis_to4(rank, axis + rank if axis < 0 else axis)
    n, c, h, w = dims4(shape)
    log_out = int(node.op_type == "LogSoftmax")
    if axis4 == 1:
        count = n * h * w
        return [Launch("softmax.cl", "softmax_channel", [ctx.tensor(x), ctx.tensor(y), count, c, h, w, log_out],
                       (count,))]
    length, inner = {0: (n, c4(c) * h * w), 2: (h, w), 3: (w, 1)}[axis4]
    count = packed_elements(shape) // 4 // length
    return [Launch("softmax.cl", "softmax_axis", [ctx.tensor(x), ctx.tensor(y), count, length, inner, c, h * w,
                                                  log_out], (count,))]
