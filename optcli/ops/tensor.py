"""Tensor ops: shape manipulation, indexing, gather/scatter, casts and constants.

These are both the reference and the host-CPU (`arm`) target's kernels.  Shape-only ops
(Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice, Split, Identity) return numpy views of
their input whenever the layout allows, so they cost nothing at run time; no kernel writes into
an input (inputs may be read-only memory-mapped weights).

Attributes that ONNX moved to inputs over the versions (Slice, Split, Squeeze, Unsqueeze, Pad,
TopK's ``k``, Reshape's ``shape``) are read from whichever form the node carries, so the same
kernel serves every opset from 7 on.  Split cannot see how many outputs its node has; when
neither ``split`` nor ``num_outputs`` is given it reads ``_n_outputs`` from the attrs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from optcli.errors import InputError
from optcli.ops.registry import StepAttrs, kernel

RANGE_LIMIT = 2**36  # elements: the largest value opt accepts (a count from data cannot ask for more)

Inputs = list[np.ndarray | None]
Attrs = dict[str, Any]


def _opt(inputs: Inputs, i: int) -> np.ndarray | None:
    """Optional input ``i`` (None when absent or not given)."""
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


def _ints(v: Any) -> list[int]:
    return [int(a) for a in np.asarray(v).reshape(-1)]


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _per_shape(attrs: Attrs, tag: str, x: np.ndarray, arg: Any, make):
    """``make()``, remembered in a bound step's memo (``StepAttrs``) while the step sees the same
    input shape and the same ``arg`` (its axes or shape input, ``_arg_key``).  A decoder's Loop pays
    each Unsqueeze/Squeeze/Reshape/Split once per iteration, where reading the axes out of an
    array and resolving them cost 4-7 us around a view of ~0.3 us."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is None:
        return make()
    key = _arg_key(arg)
    hit = memo.get(tag)
    if hit is not None and hit[1] == x.shape and _same_key(hit[0], key):
        return hit[2]
    made = make()
    memo[tag] = (key, x.shape, made)
    return made


def _arg_key(arg: Any) -> Any:
    """What a memo compares an argument array by: a read-only one (a plan's constant, mapped from
    the file) by identity (the memo holds it, so its id cannot be reused); any other by its
    contents (a body's constant, a value computed each run, a caller's array refilled between
    runs: the same object may come back holding other values)."""
    if arg is None or (type(arg) is np.ndarray and not arg.flags.writeable):
        return arg
    a = np.asarray(arg)
    return (a.dtype.str, a.shape, a.tobytes())


def _same_key(kept: Any, key: Any) -> bool:
    return kept is key or (type(kept) is tuple and type(key) is tuple and kept == key)


def _from_attr_or_input(inputs: Inputs, i: int, attrs: Attrs, name: str) -> list[int] | None:
    v = _opt(inputs, i)
    if v is not None:
        return _ints(v)
    if name in attrs and attrs[name] is not None:
        return _ints(attrs[name])
    return None


# ----------------------------------------------------------------------------- shape ops (views)

@kernel("Identity")
def identity(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [inputs[0]]


MAX_OUTPUT_ELEMENTS = 2**62  # a shape computed from data beyond this cannot even be formed by numpy


def _data_shape(op: str, dims) -> tuple[int, ...]:
    """A shape that input values give (Expand, Tile, ConstantOfShape): refused as the input's fault
    when a dim is negative or the elements overflow (numpy raised ValueError: our bug, said the
    CLI); a large but formable size goes on to the allocation (MemoryError: the input's fault)."""
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise InputError(f"{op}: the shape {list(dims)} computed from the input has a negative dim; check the "
                         "input values")
    if math.prod(dims) > MAX_OUTPUT_ELEMENTS:
        raise InputError(f"{op}: the shape {list(dims)} computed from the input has more than 2^62 elements; "
                         "check the input values")
    return dims


@kernel("Reshape")
def reshape(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """0 copies the input dim unless ``allowzero``; -1 is inferred.  A view when possible."""
    x = np.asarray(inputs[0])

    def target() -> list[int]:
        shape = _from_attr_or_input(inputs, 1, attrs, "shape") or []
        if not attrs.get("allowzero", 0):
            shape = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(shape)]
        return shape

    shape = _per_shape(attrs, "reshape", x, _opt(inputs, 1), target)
    try:
        return [x.reshape(shape)]
    except ValueError as exc:  # the target shape is data: it does not hold the input's elements
        raise InputError(f"Reshape: cannot reshape {list(x.shape)} into {list(shape)} ({exc}); check the input "
                         "values") from None


@kernel("Flatten")
def flatten(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axis = _axis(int(attrs.get("axis", 1)), x.ndim)
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]  # math.prod: np.prod costs ~2 us


@kernel("Transpose")
def transpose(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    perm = attrs.get("perm")
    # the array's own method: np.transpose's dispatch and a new perm list cost ~3 us a call, as
    # much as the rest of a decoder step's shape ops; a perm of the wrong length raises as before
    return [x.transpose() if perm is None else x.transpose(perm)]


@kernel("Squeeze")
def squeeze(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])

    def squeezed() -> tuple[int, ...]:  # np.squeeze checks the axes once; later calls reshape to its shape
        axes = _from_attr_or_input(inputs, 1, attrs, "axes")
        if axes is None:
            return np.squeeze(x).shape
        return np.squeeze(x, axis=tuple(_axis(a, x.ndim) for a in axes)).shape

    return [x.reshape(_per_shape(attrs, "squeeze", x, _opt(inputs, 1), squeezed))]


@kernel("Unsqueeze")
def unsqueeze(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])

    def unsqueezed() -> list[int]:
        axes = _from_attr_or_input(inputs, 1, attrs, "axes") or []
        rank = x.ndim + len(axes)
        shape = list(x.shape)
        for a in sorted(_axis(a, rank) for a in axes):
            shape.insert(a, 1)
        return shape

    return [x.reshape(_per_shape(attrs, "unsqueeze", x, _opt(inputs, 1), unsqueezed))]


@kernel("Slice")
def slice_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """starts/ends/axes as attributes (opset < 10) or inputs; negative steps clamp as ONNX says."""
    x = np.asarray(inputs[0])
    if attrs.get("_opset", 13) < 10 or _opt(inputs, 1) is None:
        starts, ends = _ints(attrs["starts"]), _ints(attrs["ends"])
        axes = _ints(attrs["axes"]) if "axes" in attrs else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = _ints(inputs[3]) if _opt(inputs, 3) is not None else list(range(len(starts)))
        steps = _ints(inputs[4]) if _opt(inputs, 4) is not None else [1] * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, x.ndim)
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st)
    return [x[tuple(index)]]


@kernel("Split")
def split(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    indices = _per_shape(attrs, "split", x, _opt(inputs, 1), lambda: _split_indices(x, inputs, attrs))
    return [x[index] for index in indices]


def _split_indices(x: np.ndarray, inputs: Inputs, attrs: Attrs) -> list[tuple]:
    """Split's outputs as index tuples into ``x`` (views by plain slicing: np.split's generic path
    cost ~20 us for a GRU cell's three gates)."""
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    dim = x.shape[axis]
    sizes = _from_attr_or_input(inputs, 1, attrs, "split")
    if sizes is None:
        n = attrs.get("num_outputs") or attrs.get("_n_outputs")
        if not n:
            raise ValueError("Split without 'split' or 'num_outputs' needs '_n_outputs' in attrs")
        n = int(n)
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        if attrs.get("num_outputs") is None and dim % n:
            raise ValueError(f"Split: dim {dim} not divisible into {n} equal outputs")
    outs, start, index = [], 0, [slice(None)] * x.ndim
    for size in sizes:
        index[axis] = slice(start, start + int(size))
        outs.append(tuple(index))
        start += int(size)
    if start != dim:
        raise ValueError(f"Split: sizes {list(sizes)} add up to {start}, not the dim {dim}")
    return outs


@kernel("Concat")
def concat(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    xs = [np.asarray(v) for v in inputs if v is not None]
    return [np.concatenate(xs, axis=_axis(int(attrs["axis"]), xs[0].ndim))]


@kernel("Shape")
def shape(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    s = np.shape(inputs[0])
    start = int(attrs.get("start", 0))
    end = attrs.get("end")
    return [np.array(s[start:None if end is None else int(end)], dtype=np.int64)]


@kernel("Size")
def size(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.array(np.size(inputs[0]), dtype=np.int64)]


@kernel("DepthToSpace")
def depth_to_space(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    bs = int(attrs["blocksize"])
    b, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "CRD":
        t = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        t = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    return [t.reshape(b, c // (bs * bs), h * bs, w * bs)]


@kernel("SpaceToDepth")
def space_to_depth(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    bs = int(attrs["blocksize"])
    b, c, h, w = x.shape
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.transpose(0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else t.transpose(0, 3, 5, 1, 2, 4)
    return [t.reshape(b, c * bs * bs, h // bs, w // bs)]


# ----------------------------------------------------------------------------- copies

@kernel("Expand")
def expand(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    # the output shape worked out once per input shape and shape input (a transformer's attention
    # mask: ~7 us of checks around a copy of ~2)
    out_shape = _per_shape(attrs, "expand", x, inputs[1], lambda: _expanded_shape(x.shape, inputs[1]))
    return [np.array(np.broadcast_to(x, out_shape))]


def _expanded_shape(shape: tuple[int, ...], arg: Any) -> tuple[int, ...]:
    target = _data_shape("Expand", _ints(arg))
    try:
        out_shape = np.broadcast_shapes(shape, target)
    except ValueError:
        raise InputError(f"Expand: {list(shape)} does not broadcast to {list(target)}; check the input "
                         "values") from None
    _data_shape("Expand", out_shape)
    return out_shape


@kernel("Tile")
def tile(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    repeats = _data_shape("Tile", _ints(inputs[1]))
    _data_shape("Tile", [d * r for d, r in zip(x.shape, repeats)])
    return [np.tile(x, repeats)]


@kernel("Pad")
def pad(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """pads attr (< 11) or input, optional ``axes`` input (18); negative pads crop first."""
    x = np.asarray(inputs[0])
    mode = attrs.get("mode", "constant")
    if _opt(inputs, 1) is not None:
        pads = _ints(inputs[1])
        cv = _opt(inputs, 2)
        value = cv.reshape(-1)[0] if cv is not None and cv.size else 0
    else:
        pads = _ints(attrs.get("pads", attrs.get("paddings", [])))
        value = attrs.get("value", 0.0)
    axes_in = _opt(inputs, 3)
    axes = [_axis(a, x.ndim) for a in _ints(axes_in)] if axes_in is not None else list(range(x.ndim))
    n = len(axes)
    widths = [[0, 0] for _ in range(x.ndim)]
    for i, a in enumerate(axes):
        widths[a] = [pads[i], pads[i + n]]
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if not any(b or e for b, e in widths):
        return [x.copy()]
    if mode == "constant":
        return [_pad_constant(x, widths, np.asarray(value).astype(x.dtype))]
    return [np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]


def _pad_constant(x: np.ndarray, widths: list[tuple[int, int]], value: np.ndarray) -> np.ndarray:
    """np.pad's constant mode as one copy of ``x`` and one fill per padded side: np.pad takes ~3x as
    long on the small tensors of mobile models (BlazeFace pads channels before each residual Add)."""
    y = np.empty(tuple(s + b + e for s, (b, e) in zip(x.shape, widths)), x.dtype)
    y[tuple(slice(b, b + s) for s, (b, _) in zip(x.shape, widths))] = x
    for axis, (b, e) in enumerate(widths):
        lead = (slice(None),) * axis
        if b:
            y[lead + (slice(0, b),)] = value
        if e:
            y[lead + (slice(y.shape[axis] - e, None),)] = value
    return y


# ----------------------------------------------------------------------------- casts, constants

def _np_dtype(to: int) -> np.dtype:
    from onnx import TensorProto, helper

    if to == TensorProto.STRING:
        return np.dtype(object)
    return np.dtype(helper.tensor_dtype_to_np_dtype(to))


_FLOAT8_MAX = {
    "float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0,
}


def _cast(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    if dtype == np.dtype(object):
        if x.dtype == object:
            return x.copy()
        if x.dtype.kind == "f":
            return np.vectorize(lambda v: repr(float(v)) if np.isfinite(v) else str(v).upper(),
                                otypes=[object])(x) if x.size else x.astype(object)
        return x.astype(str).astype(object)
    if x.dtype == object:
        return np.array([float(v) if dtype.kind == "f" else v for v in x.reshape(-1)],
                        dtype=np.float64 if dtype.kind == "f" else None).astype(dtype).reshape(x.shape)
    if dtype.name == "float8_e8m0fnu":  # power-of-two scales (Cast-24): ONNX's own rounding rules
        from onnx import numpy_helper

        return numpy_helper.to_float8e8m0(x.astype(np.float32), saturate, round_mode)
    fmax = _FLOAT8_MAX.get(dtype.name)
    if fmax is not None and saturate and x.dtype.kind in "fV":
        # Saturating float8 casts clamp out-of-range values and infinities to the largest finite.
        x = np.clip(x.astype(np.float32), -fmax, fmax)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


@kernel("Cast")
def cast(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    memo = attrs.memo if type(attrs) is StepAttrs else None
    target = memo.get("to") if memo is not None else None
    if target is None:
        to = _np_dtype(int(attrs["to"]))
        target = (to, to.kind in "biuf" and to.name not in _FLOAT8_MAX)  # (dtype, a plain numeric type)
        if memo is not None:
            memo["to"] = target
    to = target[0]
    if target[1] and type(x) is np.ndarray and x.dtype.kind in "biu":
        # from integers or bool to a plain numeric type: numpy's cast raises no warning and needs no
        # special rule (a mask's int64 -> float32, ~0.4 us where the general path's dtype lookup
        # and errstate cost ~5)
        return [x.astype(to)]
    return [_cast(np.asarray(x), to, bool(attrs.get("saturate", 1)), attrs.get("round_mode", "up"))]


@kernel("CastLike")
def cast_like(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_cast(np.asarray(inputs[0]), np.asarray(inputs[1]).dtype, bool(attrs.get("saturate", 1)),
                  attrs.get("round_mode", "up"))]


@kernel("Constant")
def constant(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    if "value" in attrs:
        return [np.asarray(attrs["value"])]
    if "value_float" in attrs:
        return [np.array(attrs["value_float"], dtype=np.float32)]
    if "value_floats" in attrs:
        return [np.array(attrs["value_floats"], dtype=np.float32)]
    if "value_int" in attrs:
        return [np.array(attrs["value_int"], dtype=np.int64)]
    if "value_ints" in attrs:
        return [np.array(attrs["value_ints"], dtype=np.int64)]
    if "value_string" in attrs:
        return [np.array(attrs["value_string"], dtype=object)]
    if "value_strings" in attrs:
        return [np.array(attrs["value_strings"], dtype=object)]
    raise ValueError("Constant: no supported value attribute (sparse_value is not supported)")


@kernel("ConstantOfShape")
def constant_of_shape(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    value = attrs.get("value")
    v = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_data_shape("ConstantOfShape", _ints(inputs[0])), v[0], dtype=v.dtype)]


@kernel("Range")
def range_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs[:3])
    dtype = start.dtype
    if float(delta) == 0:
        raise InputError("Range: its delta is 0, so the range never ends; check the input values")
    count = np.ceil((float(limit) - float(start)) / float(delta))
    if not np.isfinite(count) or count > RANGE_LIMIT:
        raise InputError(f"Range: start {start}, limit {limit} and delta {delta} make {count:g} elements, more than "
                         f"{RANGE_LIMIT}; check the input values")
    n = max(int(count), 0)
    if dtype.kind in "iu":
        return [(int(start) + np.arange(n, dtype=np.int64) * int(delta)).astype(dtype)]
    return [(start + np.arange(n, dtype=dtype) * delta).astype(dtype, copy=False)]


@kernel("Trilu")
def trilu(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    kk = _opt(inputs, 1)
    k = int(np.asarray(kk).reshape(-1)[0]) if kk is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


# ----------------------------------------------------------------------------- indexing

_INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _indices(op: str, idx, dims) -> np.ndarray:
    """``idx`` as int64 with negative indices counted from the end, after checking what ONNX allows:
    an int32 or int64 tensor (a float or uint64 index cast to int64 would read another element:
    2.9 reads 2, 2^64-1 reads the last) whose values lie in [-dim, dim - 1] for ``dims`` (one dim,
    or one per index column on the last axis).  Out of range is an ``IndexError`` (the executor
    reports it as the input's fault); numpy's own wrap-around of a once-normalised index never runs."""
    idx = np.asarray(idx)
    if idx.dtype not in (np.int32, np.int64):
        raise InputError(f"{op}: the indices have dtype {idx.dtype}; ONNX takes int32 or int64 indices")
    idx = idx.astype(np.int64, copy=False)
    if idx.size <= 32:  # a few indices (a decoder's step, a shape chain): checked in Python, ~10x cheaper
        per_column = list(dims) if np.ndim(dims) else [int(dims)]
        negative = False
        for k, v in enumerate(idx.reshape(-1).tolist()):
            d = per_column[k % len(per_column)]
            if not -d <= v < d:
                raise IndexError(f"{op}: index {v} is out of range for a dim of {dims}")
            negative |= v < 0
        if not negative:
            return idx
    dim = np.asarray(dims, dtype=np.int64)
    if idx.size and (np.any(idx < -dim) or np.any(idx >= dim)):
        bad = idx[(idx < -dim) | (idx >= dim)].reshape(-1)[0]
        raise IndexError(f"{op}: index {int(bad)} is out of range for a dim of {dims}")
    return np.where(idx < 0, idx + dim, idx)


@kernel("Gather")
def gather(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x, idx = np.asarray(inputs[0]), inputs[1]
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    if type(idx) is np.ndarray and idx.dtype in _INT_INDEX and 0 <= axis < x.ndim:
        # np.take's own check (its default mode, "raise") is ONNX's rule for int32/int64 indices:
        # [-dim, dim - 1], negative ones from the end, anything else an IndexError; ~1 us where
        # checking them first (_indices) cost ~4 more on an embedding lookup of 32 tokens
        try:
            return [np.take(x, idx, axis=axis)]
        except IndexError:
            pass  # _indices says which index, in the words of the other index ops
    return [np.take(x, _indices("Gather", idx, x.shape[axis]), axis=axis)]


_INT_INDEX = (np.dtype(np.int32), np.dtype(np.int64))


@kernel("GatherElements")
def gather_elements(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    idx = _indices("GatherElements", inputs[1], x.shape[axis])
    # Not take_along_axis: ONNX lets the indices be smaller than the data on the other axes too.
    index = list(np.indices(idx.shape, sparse=True))
    index[axis] = idx
    return [x[tuple(index)]]


@kernel("GatherND")
def gather_nd(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    data, raw = np.asarray(inputs[0]), np.asarray(inputs[1])
    b = int(attrs.get("batch_dims", 0))
    k = raw.shape[-1]
    idx = _indices("GatherND", raw, data.shape[b:b + k])
    nb = int(np.prod(data.shape[:b]))
    d = data.reshape((nb,) + data.shape[b:])
    i = idx.reshape((nb,) + idx.shape[b:])
    batch = np.arange(nb).reshape((nb,) + (1,) * (i.ndim - 2))
    out = d[(batch,) + tuple(i[..., j] for j in range(k))]
    return [out.reshape(idx.shape[:-1] + data.shape[b + k:])]


_REDUCE_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    if reduction in ("", "none"):
        out[index] = updates
    else:
        _REDUCE_AT[reduction].at(out, index, updates)
    return out


@kernel(["ScatterElements", "Scatter"])
def scatter_elements(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    data, updates = np.asarray(inputs[0]), np.asarray(inputs[2])
    axis = _axis(int(attrs.get("axis", 0)), data.ndim)
    idx = _indices("ScatterElements", inputs[1], data.shape[axis])
    index = list(np.indices(idx.shape, sparse=True))
    index[axis] = idx
    return [_scatter(data.copy(), tuple(index), updates, attrs.get("reduction", "none"))]


@kernel("ScatterND")
def scatter_nd(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_scatter_nd(inputs, attrs, True)]


def scatter_nd_in_place(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """ScatterND written into its data input itself, for a Loop whose carried value only this step
    reads and replaces (``control_flow.Body.scatter_in_place``: the Loop owns that array): a
    decoder writing one row of its [1, N, K] outputs per iteration copied all N rows every
    iteration, N^2 rows in all.  A data input it may not write (read-only) is copied as before."""
    return [_scatter_nd(inputs, attrs, False)]


def _scatter_nd(inputs: Inputs, attrs: Attrs, copy: bool) -> np.ndarray:
    data, raw, updates = np.asarray(inputs[0]), np.asarray(inputs[1]), np.asarray(inputs[2])
    copy = copy or type(data) is not np.ndarray or not data.flags.writeable
    k = raw.shape[-1]
    reduction = attrs.get("reduction", "none")
    if raw.size == k and raw.dtype in _INDEX_TYPES and 0 < k <= data.ndim and reduction in ("", "none") \
            and updates.shape == raw.shape[:-1] + data.shape[k:]:
        # one index row (a decoder's Loop writes one row of its outputs per iteration, 30 floats
        # in a [1, N, 30]): one tuple of ints, ~4 us less than the rows' general bookkeeping
        row = raw.reshape(-1).tolist()
        for v, d in zip(row, data.shape):
            if not -d <= v < d:  # in range, a negative index counts from the end as numpy's does
                raise IndexError(f"ScatterND: index {v} is out of range for a dim of {data.shape[:k]}")
        out = data.copy() if copy else data
        # the update's shape is its slot's after leading 1s, which assignment drops (reshaping it
        # cost ~0.5 us a call) except into one element, which takes no sequence
        out[tuple(row)] = updates if k < data.ndim else updates.reshape(())
        return out
    if 0 < k <= data.ndim and raw.size <= 32 and raw.dtype in _INDEX_TYPES and reduction in ("", "none") \
            and updates.shape == raw.shape[:-1] + data.shape[k:]:
        # A few index rows (a decoder's Loop writes one row of its outputs per iteration): checked
        # and each assigned through a tuple of ints, where numpy's fancy indexing costs ~10 us a call.
        dims = data.shape[:k]
        rows = raw.reshape(-1, k).tolist()
        for row in rows:
            for v, d in zip(row, dims):
                if not -d <= v < d:  # in range, a negative index counts from the end as numpy's does
                    raise IndexError(f"ScatterND: index {v} is out of range for a dim of {dims}")
        out = data.copy() if copy else data
        flat = updates.reshape((len(rows),) + data.shape[k:])
        for r, row in enumerate(rows):
            out[tuple(row)] = flat[r]
        return out
    idx = _indices("ScatterND", raw, data.shape[:k])
    index = tuple(idx[..., j] for j in range(idx.shape[-1]))
    return _scatter(data.copy() if copy else data, index, updates, reduction)


def _sort_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable argsort along ``axis``; ties keep the lower index first in both directions."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    rev = np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(rev, axis=axis)


@kernel("TopK")
def topk(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if _opt(inputs, 1) is not None else int(attrs["k"])
    axis = _axis(int(attrs.get("axis", -1)), x.ndim)
    order = _sort_order(x, axis, bool(attrs.get("largest", 1)))
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


_I64 = np.dtype(np.int64)


def _arg(x: np.ndarray, attrs: Attrs, method) -> np.ndarray:
    """ArgMax/ArgMin through the array's own method (``np.argmax`` adds ~1 us of dispatch, a
    decoder's Loop picks its next token with one every step); the result an int64 array."""
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    if attrs.get("select_last_index", 0):
        out = (x.shape[axis] - 1) - method(np.flip(x, axis=axis), axis)
    else:
        out = method(x, axis)
    if type(out) is not np.ndarray or out.dtype is not _I64:  # a 1-D input gives a numpy scalar
        out = np.asarray(out, dtype=np.int64)
    return np.expand_dims(out, axis) if attrs.get("keepdims", 1) else out


@kernel("ArgMax")
def argmax(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_arg(np.asarray(inputs[0]), attrs, np.ndarray.argmax)]


@kernel("ArgMin")
def argmin(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_arg(np.asarray(inputs[0]), attrs, np.ndarray.argmin)]


@kernel("NonZero")
def nonzero(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.atleast_1d(np.asarray(inputs[0]))
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _norm_index(idx: np.ndarray, dim: int) -> np.ndarray:
    """Negative indices counted from the end, once: for OneHot, where ONNX makes an index outside
    [-depth, depth - 1] a row of off-values, so an index still out of range after this matches no
    position (never an element of its own)."""
    idx = np.asarray(idx).astype(np.int64, copy=False)
    return np.where(idx < 0, idx + dim, idx)


@kernel("OneHot")
def one_hot(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    indices, depth_in, values = (np.asarray(v) for v in inputs[:3])
    # depth and the (off, on) pair: constants in every model seen, read once per bound step
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("one hot") if memo is not None else None
    keys = (_arg_key(depth_in), _arg_key(values)) if memo is not None else None
    if hit is not None and _same_key(hit[0], keys[0]) and _same_key(hit[1], keys[1]):
        depth, off, on = hit[2]
    else:
        depth, off, on = int(depth_in.reshape(-1)[0]), values.reshape(-1)[0], values.reshape(-1)[1]
        # an off value of +0 (every exporter's [0, 1]): np.zeros, ~2 us less than np.full
        off = None if off == 0 and not np.signbit(off) else off
        if memo is not None:
            memo["one hot"] = (*keys, (depth, off, on))
    if indices.dtype.kind == "f":
        indices = indices.astype(np.int64)
    axis = _axis(int(attrs.get("axis", -1)), indices.ndim + 1)
    # Filled with the off value, the on value written at each in-range index: one pass over the
    # output (a decoder's Loop runs this once per step on a row or two; the comparison against
    # arange and np.where cost ~30 us there).
    shape = (*indices.shape, depth)
    out = np.zeros(shape, values.dtype) if off is None else np.full(shape, off, dtype=values.dtype)
    if indices.size <= 32:  # a few rows: plain Python beats numpy's per-call cost
        flat = out.reshape(-1, depth)
        for i, r in enumerate(indices.reshape(-1).tolist()):
            r = r + depth if r < 0 else r  # ONNX counts negative indices from the end
            if 0 <= r < depth:
                flat[i, r] = on
        return [out if axis == indices.ndim else np.moveaxis(out, -1, axis)]
    idx = _norm_index(indices, depth)
    flat, rows = out.reshape(-1, depth), idx.reshape(-1)
    live = (rows >= 0) & (rows < depth)
    flat[np.nonzero(live)[0], rows[live]] = on
    return [out if axis == idx.ndim else np.moveaxis(out, -1, axis)]


@kernel("CumSum")
def cumsum(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axis = _axis(int(np.asarray(inputs[1]).reshape(-1)[0]), x.ndim)
    rev = attrs.get("reverse", 0)
    t = np.flip(x, axis=axis) if rev else x
    out = np.cumsum(t, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        shifted = np.zeros_like(out)
        src = [slice(None)] * x.ndim
        dst = [slice(None)] * x.ndim
        src[axis], dst[axis] = slice(0, -1), slice(1, None)
        shifted[tuple(dst)] = out[tuple(src)]
        out = shifted
    return [np.flip(out, axis=axis).copy() if rev else out]
