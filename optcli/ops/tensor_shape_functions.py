"""Shape functions of the tensor ops (``optcli.ops.tensor``): reshapes, slicing, indexing, constants.

Kept beside ``tensor.py`` rather than in it only to keep both files readable; each function
follows its kernel's reading of the attributes and inputs (attribute or input by opset, 0 and -1
in Reshape, Slice's clamping).  Sizes that come from data the derivation does not know (a Range
bound, NonZero, a Reshape target computed at run time) are None: the run computes them.
"""

from __future__ import annotations

import math

import numpy as np

from optcli.ir import Dim
from optcli.ops.shape_functions import (
    Shape,
    ShapeArgs,
    ShapeDerivationError,
    broadcast,
    first_input,
    fixed,
    is_int,
    norm_axis,
    product,
    same_dim,
    shape_fn,
    show,
    unknown,
)

shape_fn(["Identity", "Cast", "CastLike", "Trilu", "CumSum"])(first_input)


def _length_of(args: ShapeArgs, k: int) -> int | None:
    """The element count of 1-D input k when its shape is known (the rank a shape input gives)."""
    s = args.shape(k)
    return fixed(s[0]) if s is not None and len(s) == 1 else (1 if s == () else None)


@shape_fn("Reshape")
def reshape_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    target = args.dims_of(1) if args.has(1) else tuple(int(a) for a in args.attrs.get("shape") or ())
    if target is None:
        return [unknown(_length_of(args, 1))]
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeDerivationError(f"the target {show(target)} has more than one -1")
    out: list[Dim] = []
    copied: set[int] = set()  # positions whose dim a 0 copies from x
    for i, d in enumerate(target):
        if d == 0 and not args.attrs.get("allowzero", 0):
            if x is not None and i >= len(x):
                raise ShapeDerivationError(f"the target {show(target)} copies dim {i} of {show(x)}")
            d = x[i] if x is not None else None
            copied.add(i)
        elif is_int(d) and d < -1:
            raise ShapeDerivationError(f"the target {show(target)} has a negative dim")
        out.append(d)
    if -1 in out:
        at = out.index(-1)
        # A copied dim is the same on both sides, known or not: it cancels (a BiLSTM's [T, 1, 2, 64]
        # reshaped by [0, 0, -1] gives [T, 1, 128] with T unknown).
        out[at] = None if x is None else _quotient([d for i, d in enumerate(x) if i not in copied],
                                                   [d for i, d in enumerate(out) if i != at and i not in copied],
                                                   target)
    elif x is not None:
        total, new = product(x), product(out)
        if is_int(total) and is_int(new) and total != new:
            raise ShapeDerivationError(f"cannot reshape {show(x)} ({total} elements) to {show(target)}")
    return [tuple(out)]


def _quotient(x: tuple, others: list, target) -> Dim:
    """The dim -1 stands for: x's element count over the other target dims (symbols cancel)."""
    if any(d is None for d in (*x, *others)):
        return None
    num = [d for d in x if not is_int(d)]
    den = [d for d in others if not is_int(d)]
    for d in list(den):
        if d in num:
            num.remove(d)
            den.remove(d)
    top, bottom = product([d for d in x if is_int(d)]), product([d for d in others if is_int(d)])
    if den or (num and (bottom == 0 or top % bottom)):
        return None
    if bottom == 0 or top % bottom:
        raise ShapeDerivationError(f"cannot reshape {show(x)} to {show(target)}")
    if not num:
        return top // bottom
    return num[0] if len(num) == 1 and top == bottom else None


@shape_fn("Flatten")
def _flatten_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [(None, None)]
    axis = int(args.attrs.get("axis", 1))
    if not -len(x) <= axis <= len(x):
        raise ShapeDerivationError(f"axis {axis} is out of range for rank {len(x)}")
    axis = axis + len(x) if axis < 0 else axis
    return [(product(x[:axis]), product(x[axis:]))]


@shape_fn("Transpose")
def _transpose_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [None]
    perm = args.attrs.get("perm")
    perm = list(range(len(x)))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(norm_axis(p, len(x), "perm entry") for p in perm) != list(range(len(x))):
        raise ShapeDerivationError(f"perm {perm} is not a permutation of the {len(x)} axes")
    return [tuple(x[p] for p in perm)]


@shape_fn("Squeeze")
def _squeeze_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    given, axes = args.ints_attr_or_input(1, "axes")
    if x is None:
        return [None]
    if given and axes is None:
        n = _length_of(args, 1)
        return [unknown(None if n is None else len(x) - n)]
    if not given:
        if not all(is_int(d) for d in x):
            return [None]  # which dims are 1 is not known yet
        return [tuple(d for d in x if d != 1)]
    picked = {norm_axis(a, len(x), "squeezed axis") for a in axes}
    for a in picked:
        if is_int(x[a]) and x[a] != 1:
            raise ShapeDerivationError(f"axis {a} of {show(x)} has size {x[a]}, not 1")
    return [tuple(d for i, d in enumerate(x) if i not in picked)]


@shape_fn("Unsqueeze")
def _unsqueeze_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    given, axes = args.ints_attr_or_input(1, "axes")
    if x is None:
        return [None]
    if axes is None:
        n = _length_of(args, 1) if given else 0
        return [unknown(None if n is None else len(x) + n)]
    rank = len(x) + len(axes)
    picked = sorted(norm_axis(a, rank, "unsqueezed axis") for a in axes)
    if len(set(picked)) != len(picked):
        raise ShapeDerivationError(f"axes {axes} repeat an axis")
    out = list(x)
    for a in picked:
        out.insert(a, 1)
    return [tuple(out)]


def slice_length(dim: Dim, start: int, end: int, step: int) -> Dim:
    """Elements a Slice keeps on one axis, clamped as the kernel clamps (None: unknown)."""
    if step == 0:
        raise ShapeDerivationError("a slice step is 0")
    if not is_int(dim):
        whole = step == 1 and start == 0 and end >= 2**31 - 1
        return dim if whole else None
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -(-(start - end) // -step))


@shape_fn("Slice")
def _slice_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [None]
    if args.opset < 10 or not args.has(1):
        starts, ends = args.attrs.get("starts"), args.attrs.get("ends")
        axes, steps = args.attrs.get("axes"), None
        starts = None if starts is None else [int(a) for a in starts]
        ends = None if ends is None else [int(a) for a in ends]
        axes = None if axes is None else [int(a) for a in axes]
        if starts is None or ends is None:
            raise ShapeDerivationError("no starts and ends")
    else:
        starts, ends = args.ints(1), args.ints(2)
        axes = args.ints(3) if args.has(3) else None
        steps = args.ints(4) if args.has(4) else None
        if args.has(3) and axes is None:
            return [unknown(len(x))]
    if starts is None or ends is None or (args.has(4) and steps is None):
        n = _length_of(args, 1)
        if axes is None and n is None:
            return [unknown(len(x))]
        axes = list(range(n)) if axes is None else axes
        picked = {norm_axis(a, len(x), "sliced axis") for a in axes}
        return [tuple(None if i in picked else d for i, d in enumerate(x))]
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeDerivationError(f"starts, ends, axes and steps have lengths {len(starts)}, {len(ends)}, "
                                   f"{len(axes)}, {len(steps)}")
    out = list(x)
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, len(x), "sliced axis")
        if a in seen:
            raise ShapeDerivationError(f"axis {a} is sliced twice")
        seen.add(a)
        out[a] = slice_length(x[a], s, e, st)
    return [tuple(out)]


@shape_fn("Split")
def _split_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    n = args.n_outputs
    if x is None:
        return [None] * n
    axis = norm_axis(int(args.attrs.get("axis", 0)), len(x))
    dim = x[axis]
    given, sizes = args.ints_attr_or_input(1, "split")
    if given and sizes is None:
        return [unknown(len(x))] * n
    if sizes is None:
        count = int(args.attrs.get("num_outputs") or n)
        if not is_int(dim):
            return [x if count == 1 else tuple(None if i == axis else d for i, d in enumerate(x))] * n
        chunk = -(-dim // count)
        sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        if args.attrs.get("num_outputs") is None and dim % count:
            raise ShapeDerivationError(f"dim {dim} does not split into {count} equal outputs")
    if len(sizes) != n:
        raise ShapeDerivationError(f"{len(sizes)} split sizes for {n} outputs")
    if is_int(dim) and sum(sizes) != dim or any(s < 0 for s in sizes):
        raise ShapeDerivationError(f"split sizes {sizes} do not add up to dim {dim}")
    return [tuple(s if i == axis else d for i, d in enumerate(x)) for s in sizes]


def concat_shape(shapes: list[Shape], axis: int) -> Shape:
    """Inputs of one rank, equal on every axis but ``axis``, whose sizes add up."""
    known = [s for s in shapes if s is not None]
    if not known:
        return None
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        raise ShapeDerivationError(f"inputs {', '.join(show(s) for s in shapes)} differ in rank")
    axis = norm_axis(axis, rank)
    out = list(known[0])
    for s in known[1:]:
        for i in range(rank):
            if i != axis:
                out[i] = same_dim(out[i], s[i], f"inputs differ on axis {i} (not the concatenation axis {axis})")
    total: Dim = 0
    for s in shapes:
        d = None if s is None else s[axis]
        total = total + d if is_int(total) and is_int(d) else (d if total == 0 else (total if d == 0 else None))
    out[axis] = total
    return tuple(out)


@shape_fn("Concat")
def _concat_shape(args: ShapeArgs) -> list[Shape]:
    return [concat_shape([args.shape(k) for k in range(len(args.shapes)) if args.has(k)],
                         int(args.attrs.get("axis", 0)))]


@shape_fn("Shape")
def shape_of_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [(None,)]
    end = args.attrs.get("end")
    return [(len(x[int(args.attrs.get("start", 0)):None if end is None else int(end)]),)]


@shape_fn("Size")
def _size_shape(args: ShapeArgs) -> list[Shape]:
    return [()]


@shape_fn(["DepthToSpace", "SpaceToDepth"])
def _depth_space_shape(args: ShapeArgs) -> list[Shape]:
    x, bs = args.shape(0), int(args.attrs.get("blocksize", 0))
    if bs < 1:
        raise ShapeDerivationError(f"blocksize {bs} is not positive")
    if x is None:
        return [unknown(4)]
    if len(x) != 4:
        raise ShapeDerivationError(f"the input has rank {len(x)}, not 4")
    b, c, h, w = x

    def divide(d: Dim, by: int, what: str) -> Dim:
        if not is_int(d):
            return None
        if d % by:
            raise ShapeDerivationError(f"{what} {d} does not divide by {by}")
        return d // by

    def times(d: Dim, by: int) -> Dim:
        return d * by if is_int(d) else None

    if args.op == "SpaceToDepth":
        return [(b, times(c, bs * bs), divide(h, bs, "height"), divide(w, bs, "width"))]
    return [(b, divide(c, bs * bs, "channels"), times(h, bs), times(w, bs))]


@shape_fn("Expand")
def _expand_shape(args: ShapeArgs) -> list[Shape]:
    target = args.dims_of(1)
    if target is None:  # its value unknown: its length still gives the rank, and x's dims > 1 stay
        n = _length_of(args, 1)
        target = None if n is None else (None,) * n
    if target is None:
        return [None]
    return [broadcast(args.shape(0), tuple(target))]


@shape_fn("Tile")
def _tile_shape(args: ShapeArgs) -> list[Shape]:
    x, repeats = args.shape(0), args.ints(1)
    if x is None or repeats is None:
        return [unknown(None if x is None else len(x))]
    if len(repeats) != len(x):
        raise ShapeDerivationError(f"{len(repeats)} repeats for rank {len(x)}")
    if any(r < 0 for r in repeats):
        raise ShapeDerivationError(f"repeats {repeats} are negative")
    return [tuple(product([d, r]) for d, r in zip(x, repeats))]


@shape_fn("Pad")
def _pad_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [None]
    pads = args.ints(1) if args.has(1) else [int(a) for a in args.attrs.get("pads", args.attrs.get("paddings", []))]
    axes = args.ints(3) if args.has(3) else list(range(len(x)))
    if axes is None:
        return [unknown(len(x))]
    axes = [norm_axis(a, len(x), "padded axis") for a in axes]
    if pads is None:
        return [tuple(None if i in axes else d for i, d in enumerate(x))]
    if len(pads) != 2 * len(axes):
        raise ShapeDerivationError(f"{len(pads)} pads for {len(axes)} axes")
    out = list(x)
    for i, a in enumerate(axes):
        extra = pads[i] + pads[i + len(axes)]
        out[a] = x[a] + extra if is_int(x[a]) else (x[a] if extra == 0 else None)
        if is_int(out[a]) and out[a] < 0:
            raise ShapeDerivationError(f"pads {pads} crop axis {a} of {show(x)} below zero")
    return [tuple(out)]


@shape_fn("Constant")
def _constant_shape(args: ShapeArgs) -> list[Shape]:
    a = args.attrs
    if "value" in a:
        return [tuple(np.shape(a["value"]))]
    for name in ("value_float", "value_int", "value_string"):
        if name in a:
            return [()]
    for name in ("value_floats", "value_ints", "value_strings"):
        if name in a:
            return [(len(a[name]),)]
    return [None]


@shape_fn("ConstantOfShape")
def _constant_of_shape_shape(args: ShapeArgs) -> list[Shape]:
    dims = args.dims_of(0)
    if dims is None:
        return [unknown(_length_of(args, 0))]
    if any(is_int(d) and d < 0 for d in dims):
        raise ShapeDerivationError(f"the shape {show(dims)} has a negative dim")
    return [tuple(dims)]


@shape_fn("Range")
def _range_shape(args: ShapeArgs) -> list[Shape]:
    values = [args.value(k) for k in range(3)]
    if any(v is None for v in values):
        return [(None,)]  # sized by data: the run computes it
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in values)
    if delta == 0:
        raise ShapeDerivationError("its delta is 0, so the range never ends")
    count = math.ceil((limit - start) / delta)
    return [(max(int(count), 0),)]


@shape_fn("Gather")
def _gather_shape(args: ShapeArgs) -> list[Shape]:
    x, idx = args.shape(0), args.shape(1)
    if x is None or idx is None:
        return [None]
    if not x:
        raise ShapeDerivationError("Gather does not take a scalar")
    axis = norm_axis(int(args.attrs.get("axis", 0)), len(x))
    return [(*x[:axis], *idx, *x[axis + 1:])]


@shape_fn("GatherElements")
def _gather_elements_shape(args: ShapeArgs) -> list[Shape]:
    x, idx = args.shape(0), args.shape(1)
    if x is not None and idx is not None and len(x) != len(idx):
        raise ShapeDerivationError(f"indices {show(idx)} and data {show(x)} differ in rank")
    if x is not None:
        norm_axis(int(args.attrs.get("axis", 0)), len(x))
    return [idx]


@shape_fn("GatherND")
def _gather_nd_shape(args: ShapeArgs) -> list[Shape]:
    x, idx = args.shape(0), args.shape(1)
    b = int(args.attrs.get("batch_dims", 0))
    if x is None or idx is None or not idx or not is_int(idx[-1]):
        return [None]
    k = int(idx[-1])
    if b >= min(len(x), len(idx)) or b + k > len(x):
        raise ShapeDerivationError(f"indices {show(idx)} (batch_dims {b}) do not index data {show(x)}")
    for i in range(b):
        same_dim(x[i], idx[i], f"batch dim {i} of data and indices")
    return [(*idx[:-1], *x[b + k:])]


@shape_fn(["ScatterElements", "Scatter", "ScatterND"])
def _scatter_shape(args: ShapeArgs) -> list[Shape]:
    x, idx, upd = args.shape(0), args.shape(1), args.shape(2)
    if args.op != "ScatterND" and idx is not None and upd is not None:
        if len(idx) != len(upd):
            raise ShapeDerivationError(f"indices {show(idx)} and updates {show(upd)} differ in rank")
        for i, (a, b) in enumerate(zip(idx, upd)):
            same_dim(a, b, f"indices and updates differ on axis {i}")
    return [x]


@shape_fn("TopK")
def _topk_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    given, k = args.ints_attr_or_input(1, "k")
    if x is None:
        return [None, None]
    axis = norm_axis(int(args.attrs.get("axis", -1)), len(x))
    kk = None if k is None else k[0]
    if kk is not None and (kk < 0 or (is_int(x[axis]) and kk > x[axis])):
        raise ShapeDerivationError(f"k {kk} is more than axis {axis}'s {x[axis]} elements")
    out = tuple(kk if i == axis else d for i, d in enumerate(x))
    return [out, out]


@shape_fn(["ArgMax", "ArgMin"])
def _arg_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is None:
        return [None]
    axis = norm_axis(int(args.attrs.get("axis", 0)), len(x))
    if args.attrs.get("keepdims", 1):
        return [tuple(1 if i == axis else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i != axis)]


@shape_fn("NonZero")
def _nonzero_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    return [(None if x is None else max(len(x), 1), None)]  # how many are non-zero is data


@shape_fn("OneHot")
def _one_hot_shape(args: ShapeArgs) -> list[Shape]:
    idx = args.shape(0)
    if idx is None:
        return [None]
    depth = args.ints(1)
    axis = norm_axis(int(args.attrs.get("axis", -1)), len(idx) + 1)
    out = list(idx)
    out.insert(axis, None if depth is None else depth[0])
    return [tuple(out)]
