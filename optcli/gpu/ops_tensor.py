"""GPU kernels for data movement: the index-only ops (Reshape, Flatten, Squeeze, Unsqueeze,
Identity, Transpose, DepthToSpace, SpaceToDepth, Slice, Expand) as one ``remap`` pass each,
Split (one ``remap`` per output), Concat (one ``concat_part`` launch per input) and Pad.

``remap`` sees every op as an affine map from the output's logical (row-major) index to the
input's: the output is viewed as a 6-D shape whose coordinates each step the source index by a
stride, plus an offset.  Transpose is a permutation of strides, DepthToSpace / SpaceToDepth a
6-D transpose, Slice scaled strides plus an offset, Expand zero strides.  When input and output
have the same packed layout (a reshape that keeps N, C, H, W) the pass is a plain copy.
"""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import dims4, pack, packed_elements
from optcli.gpu.ops_elementwise import data_check, logical_axis_to4
from optcli.gpu.registry import Launch, gpu_kernel
from optcli.ir import Graph, Node

_RESHAPES = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"]


def _row_major_strides(shape) -> list[int]:
    strides, acc = [], 1
    for d in reversed(list(shape)):
        strides.append(acc)
        acc *= int(d)
    return strides[::-1]


def _static(graph: Graph, name: str) -> bool:
    shape = graph.shape_of(name)
    return shape is not None and all(isinstance(d, int) for d in shape)


def _ints(v) -> list[int]:
    return [int(a) for a in np.asarray(v).reshape(-1)]


def source(ctx, node, index: int):
    """A data input: the runtime tensor, or a constant packed once on the host."""
    name = node.inputs[index]
    value = ctx.const(name)
    if value is not None:
        return ctx.weight(f"{node.name}/in{index}", pack(np.asarray(value, np.float32)))
    return ctx.tensor(name)


def _remap(ctx, node, dims6: list[int], strides6: list[int], offset: int = 0, y: str | None = None) -> list[Launch]:
    x, y = node.inputs[0], y or node.outputs[0]
    _, oc, oh, ow = dims4(ctx.shape(y))
    _, ic, ih, iw = dims4(ctx.shape(x))
    count = packed_elements(ctx.shape(y)) // 4
    return [Launch("tensor.cl", "remap", [source(ctx, node, 0), ctx.tensor(y), count, oc, oh, ow, *dims6[1:], *strides6,
                                          offset, ic, ih, iw], (count,))]


def _transposed(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """6-D output dims and source strides of ``transpose(x.reshape(shape), perm)``."""
    lead = 6 - len(shape)
    shape6 = [1] * lead + list(shape)
    perm6 = list(range(lead)) + [p + lead for p in perm]
    strides = _row_major_strides(shape6)
    return [shape6[p] for p in perm6], [strides[p] for p in perm6]


def _pad6(dims: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    lead = 6 - len(dims)
    return [1] * lead + dims, [0] * lead + strides


# --------------------------------------------------------------------------- index-only ops
def _reshape_check(node: Node, graph: Graph) -> str | None:
    return data_check(node, graph)


@gpu_kernel(_RESHAPES, check=_reshape_check)
def reshape(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    if dims4(ctx.shape(x)) == dims4(ctx.shape(y)):
        count = packed_elements(ctx.shape(y)) // 4
        return [Launch("tensor.cl", "copy4", [source(ctx, node, 0), ctx.tensor(y), count], (count,))]
    total = int(np.prod(ctx.shape(y), dtype=np.int64))
    return _remap(ctx, node, [1, 1, 1, 1, 1, total], [0, 0, 0, 0, 0, 1])


@gpu_kernel("Transpose", check=_reshape_check)
def transpose(ctx, node) -> list[Launch]:
    shape = list(ctx.shape(node.inputs[0]))
    perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
    return _remap(ctx, node, *_transposed(shape, [int(p) for p in perm]))


def _blocks_check(node: Node, graph: Graph) -> str | None:
    reason = data_check(node, graph)
    if reason is None and len(graph.shape_of(node.inputs[0])) != 4:
        return f"{node.op_type} on a rank-{len(graph.shape_of(node.inputs[0]))} input"
    return reason


@gpu_kernel(["DepthToSpace", "SpaceToDepth"], check=_blocks_check)
def blocks(ctx, node) -> list[Launch]:
    b, c, h, w = ctx.shape(node.inputs[0])
    bs = int(node.attrs["blocksize"])
    crd = node.attrs.get("mode", "DCR") == "CRD"
    if node.op_type == "DepthToSpace":
        cb = c // (bs * bs)
        shape, perm = ([b, cb, bs, bs, h, w], [0, 1, 4, 2, 5, 3]) if crd else ([b, bs, bs, cb, h, w],
                                                                              [0, 3, 4, 1, 5, 2])
    else:
        shape = [b, c, h // bs, bs, w // bs, bs]
        perm = [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4]
    return _remap(ctx, node, *_transposed(shape, perm))


def _slice_params(node, const, shape) -> tuple[list[int], list[int], list[int]] | None:
    """(starts, axes, steps) of a Slice, each start clamped as ONNX says; None if not constant."""
    rank = len(shape)
    if len(node.inputs) > 1 and node.inputs[1]:
        vals = [const(node.inputs[i]) if i < len(node.inputs) and node.inputs[i] else None for i in range(1, 5)]
        if vals[0] is None or vals[1] is None or any(node.inputs[i] and vals[i - 1] is None
                                                     for i in range(3, min(5, len(node.inputs)))):
            return None
        starts = _ints(vals[0])
        axes = _ints(vals[2]) if vals[2] is not None else list(range(len(starts)))
        steps = _ints(vals[3]) if vals[3] is not None else [1] * len(starts)
    else:
        starts = _ints(node.attrs["starts"])
        axes = _ints(node.attrs["axes"]) if "axes" in node.attrs else list(range(len(starts)))
        steps = [1] * len(starts)
    first = [0] * rank
    step_of = [1] * rank
    for s, a, st in zip(starts, axes, steps):
        a = a + rank if a < 0 else a
        dim = int(shape[a])
        s = s + dim if s < 0 else s
        first[a] = min(max(s, 0), dim) if st > 0 else min(max(s, 0), dim - 1)
        step_of[a] = st
    return first, list(range(rank)), step_of


def _slice_check(node: Node, graph: Graph) -> str | None:
    if _static(graph, node.inputs[0]) and _slice_params(node, graph.const, graph.shape_of(node.inputs[0])) is None:
        return "Slice starts/ends/axes/steps must be constants"
    return data_check(node, graph)


@gpu_kernel("Slice", check=_slice_check)
def slice_(ctx, node) -> list[Launch]:
    shape = ctx.shape(node.inputs[0])
    first, _, steps = _slice_params(node, ctx.const, shape)
    strides = _row_major_strides(shape)
    offset = sum(f * s for f, s in zip(first, strides))
    return _remap(ctx, node, *_pad6(list(ctx.shape(node.outputs[0])), [st * s for st, s in zip(steps, strides)]),
                  offset)


@gpu_kernel("Expand", check=_reshape_check)
def expand(ctx, node) -> list[Launch]:
    out = list(ctx.shape(node.outputs[0]))
    shape = [1] * (len(out) - len(ctx.shape(node.inputs[0]))) + list(ctx.shape(node.inputs[0]))
    strides = [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out, _row_major_strides(shape))]
    return _remap(ctx, node, *_pad6(out, strides))


# --------------------------------------------------------------------------- Split
def _split_check(node: Node, graph: Graph) -> str | None:
    outputs = [o for o in node.outputs if o]
    if not all(_static(graph, o) for o in outputs):
        return "Split outputs must have static shapes"
    return data_check(node, graph)


@gpu_kernel("Split", check=_split_check)
def split(ctx, node) -> list[Launch]:
    """One Slice-like remap per output.  The sizes come from the outputs' static shapes (which
    shape inference derived from the 'split' input, attribute or num_outputs), so every form
    of the op is covered alike."""
    shape = list(ctx.shape(node.inputs[0]))
    rank = len(shape)
    axis = int(node.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    strides = _row_major_strides(shape)
    launches, start = [], 0
    for y in node.outputs:
        size = int(ctx.shape(y)[axis]) if y else 0
        if y and size:
            launches += _remap(ctx, node, *_pad6(list(ctx.shape(y)), strides), start * strides[axis], y=y)
        start += size
    return launches


# --------------------------------------------------------------------------- Concat
def _concat_check(node: Node, graph: Graph) -> str | None:
    inputs = [i for i in node.inputs if i]
    reason = data_check(node, graph, inputs)
    if reason:
        return reason
    if len({len(graph.shape_of(i)) for i in inputs}) != 1:
        return "Concat of inputs of different ranks"
    return None


@gpu_kernel("Concat", check=_concat_check)
def concat(ctx, node) -> list[Launch]:
    y = node.outputs[0]
    out_shape = ctx.shape(y)
    rank = len(out_shape)
    axis = int(node.attrs["axis"])
    axis = axis + rank if axis < 0 else axis
    axis4 = logical_axis_to4(rank, axis)
    _, oc, oh, ow = dims4(out_shape)
    launches, offset = [], 0
    for index, name in enumerate(node.inputs):
        if not name:
            continue
        shape = ctx.shape(name)
        if shape[axis] == 0:
            continue
        _, ic, ih, iw = dims4(shape)
        count = packed_elements(shape) // 4
        launches.append(Launch("tensor.cl", "concat_part", [source(ctx, node, index), ctx.tensor(y), count,
                                                             ic, ih, iw, oc, oh, ow, axis4, offset], (count,)))
        offset += int(shape[axis])
    return launches


# --------------------------------------------------------------------------- Pad
_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


def _pad_params(node, const, rank: int) -> tuple[list[int], float] | str:
    """Begin pads per logical axis and the constant value, or why they cannot be had."""
    if len(node.inputs) > 1 and node.inputs[1]:
        pads = const(node.inputs[1])
        if pads is None:
            return "Pad pads must be a constant"
        pads = _ints(pads)
        value = 0.0
        if len(node.inputs) > 2 and node.inputs[2]:
            v = const(node.inputs[2])
            if v is None:
                return "Pad constant_value must be a constant"
            value = float(np.asarray(v).reshape(-1)[0]) if v.size else 0.0
    else:
        pads = _ints(node.attrs.get("pads", node.attrs.get("paddings", [])))
        value = float(node.attrs.get("value", 0.0))
    axes = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3]:
        a = const(node.inputs[3])
        if a is None:
            return "Pad axes must be a constant"
        axes = [v + rank if v < 0 else v for v in _ints(a)]
    begin = [0] * rank
    for i, a in enumerate(axes):
        begin[a] = pads[i]
        if node.attrs.get("mode", "constant") != "constant" and (pads[i] < 0 or pads[i + len(axes)] < 0):
            return f"Pad mode {node.attrs.get('mode')} with negative pads"
    return begin, value


def _pad_check(node: Node, graph: Graph) -> str | None:
    mode = node.attrs.get("mode", "constant")
    if mode not in _PAD_MODES:
        return f"Pad mode {mode}"
    if _static(graph, node.inputs[0]):
        params = _pad_params(node, graph.const, len(graph.shape_of(node.inputs[0])))
        if isinstance(params, str):
            return params
    return data_check(node, graph)


@gpu_kernel("Pad", check=_pad_check)
def pad(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    begin, value = _pad_params(node, ctx.const, len(shape))
    begin4 = [0, 0, 0, 0]
    for a, p in enumerate(begin):
        begin4[logical_axis_to4(len(shape), a)] = p
    _, oc, oh, ow = dims4(ctx.shape(y))
    count = packed_elements(ctx.shape(y)) // 4
    return [Launch("tensor.cl", "pad", [source(ctx, node, 0), ctx.tensor(y), count, oc, oh, ow, *dims4(shape), *begin4,
                                        _PAD_MODES[node.attrs.get("mode", "constant")], value], (count,))]
