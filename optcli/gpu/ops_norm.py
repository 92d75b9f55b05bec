"""GPU kernels for LayerNormalization and InstanceNormalization (``kernels/gpu/norm.cl``): both
normalise rows of consecutive float4s whose lanes are four independent rows (``norm_rows``).

The packed layout decides what fits.  A LayerNormalization row must lie along W, or along H and
W: the last axis of a sequence ``[N, T, D]`` (packed ``N, C=T, H=1, W=D``), the last one or two
axes of a rank-4 tensor.  Normalising across the channel axis (``[N, D]`` with axis -1, or
axis <= 1) would reduce across lanes and slices, which this kernel does not do: those nodes stay
on the host, with the reason.  InstanceNormalization normalises each (image, channel) over
H, W: rank 3 (1-D, sequences) and rank 4 (rank 2, no spatial axis, too).
"""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import c4, dims4, packed_elements
from optcli.gpu.ops_elementwise import data_check, logical_axis_to4
from optcli.gpu.registry import Launch, gpu_kernel, input_of
from optcli.ir import Graph, Node

SOURCE = "norm.cl"


def _param_check(node: Node, graph: Graph, shape: tuple[int, ...]) -> str | None:
    """Scale and bias (inputs 1, 2) constant and broadcastable to ``shape``."""
    for i in (1, 2):
        name = input_of(node, i)
        if not name:
            continue
        p = graph.const(name)
        if p is None:
            return f"'{name}' is not a constant"
        try:
            np.broadcast_to(p, shape)
        except ValueError:
            return f"'{name}' of shape {tuple(p.shape)} does not broadcast to {shape}"
    return None


def _layer_axis(node: Node, rank: int) -> int:
    axis = int(node.attrs.get("axis", -1))
    return axis + rank if axis < 0 else axis


def _check_layer(node: Node, graph: Graph) -> str | None:
    if any(node.outputs[1:]):
        return "LayerNormalization with the Mean / InvStdDev outputs"
    reason = data_check(node, graph, [node.inputs[0]])
    if reason:
        return reason
    shape = tuple(graph.shape_of(node.inputs[0]))
    rank, axis = len(shape), _layer_axis(node, len(shape))
    if not 0 <= axis < rank:
        return f"LayerNormalization axis {node.attrs.get('axis')} out of range for rank {rank}"
    packed = {logical_axis_to4(rank, a) for a in range(axis, rank)}
    if packed not in ({3}, {2, 3}):
        return (f"LayerNormalization over axes {axis}..{rank - 1} of {list(shape)} crosses the packed channel "
                "axis (the GPU kernel normalises along W, or H and W)")
    return _param_check(node, graph, shape[axis:])


def _check_instance(node: Node, graph: Graph) -> str | None:
    reason = data_check(node, graph, [node.inputs[0]])
    if reason:
        return reason
    if not input_of(node, 1) or not input_of(node, 2):
        return "InstanceNormalization needs scale and B"
    return _param_check(node, graph, (graph.shape_of(node.inputs[0])[1],))


def _launch(ctx, node, rows_per_slice: int, length: int, scale, shift, ks: int, ss: int) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    count = packed_elements(shape) // 4 // length
    args = [ctx.tensor(x), ctx.weight(f"{node.name}/scale", scale), ctx.weight(f"{node.name}/shift", shift),
            ctx.tensor(y), count, length, rows_per_slice, dims4(shape)[1], ks, ss,
            float(node.attrs.get("epsilon", 1e-5))]
    return [Launch(SOURCE, "norm_rows", args, (count,))]


def _param(ctx, node, i: int, shape: tuple[int, ...], default: float) -> np.ndarray:
    p = ctx.const(input_of(node, i))
    return np.full(shape, default, np.float32) if p is None else np.broadcast_to(np.asarray(p, np.float32), shape)


@gpu_kernel("LayerNormalization", check=_check_layer)
def layer_normalization(ctx, node) -> list[Launch]:
    shape = tuple(ctx.shape(node.inputs[0]))
    axis = _layer_axis(node, len(shape))
    _, _, h, w = dims4(shape)
    along_w = {logical_axis_to4(len(shape), a) for a in range(axis, len(shape))} == {3}
    length = w if along_w else h * w
    # one value per position of a row, the same in the four lanes (rows): [L][4]
    lanes = [np.repeat(_param(ctx, node, i, shape[axis:], d).reshape(-1), 4) for i, d in ((1, 1.0), (2, 0.0))]
    return _launch(ctx, node, h if along_w else 1, length, *lanes, 1, 0)


@gpu_kernel("InstanceNormalization", check=_check_instance)
def instance_normalization(ctx, node) -> list[Launch]:
    shape = tuple(ctx.shape(node.inputs[0]))
    _, c, h, w = dims4(shape)

    def per_channel(i: int) -> np.ndarray:  # [C4][4]: one value per channel, zero past C
        full = np.zeros(c4(c) * 4, np.float32)
        full[:c] = np.asarray(ctx.const(input_of(node, i)), np.float32).reshape(-1)
        return full

    return _launch(ctx, node, 1, h * w, per_channel(1), per_channel(2), 0, 1)
