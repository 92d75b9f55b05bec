"""Normalisation and softmax kernels, plus the fused ``ChannelAffine`` op.

Inference-time BatchNormalization is a per-channel affine map, so it is computed as one
multiply-add with folded ``scale / sqrt(var + eps)`` and ``B - mean * that`` rather than the
textbook four passes; a stand-alone BatchNormalization that cannot be folded into a Conv
becomes ``ChannelAffine`` (domain ``optcli``: inputs ``X, scale, shift`` with 1-D ``[C]``
scale and shift applied along axis 1, then the fused activation epilogue).

Reductions accumulate in float32 for float16 inputs (LayerNormalization's ``stash_type``).

Softmax and LogSoftmax changed meaning at opset 13: before, the input was coerced to 2-D at
``axis`` (default 1) and normalised over everything from ``axis`` on; from 13 on, over the
single ``axis`` (default -1).  The runtime passes the model's default-domain opset as the
``_opset`` attribute; without it the opset-13 semantics apply.

Output counts: LayerNormalization returns ``[Y, Mean, InvStdDev]`` and BatchNormalization in
training mode ``[Y, running_mean, running_var]`` (both cheap by-products); a runtime binds as
many as the node has outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from optcli import native
from optcli.ir import OPTCLI_DOMAIN
from optcli.ops.activation import apply_activation, apply_output_quant, epilogue
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, check_length, first_input, norm_axis, shape_fn
from optcli.ops.spatial import compute_dtype, prod


def _channel_shape(x: np.ndarray, p: np.ndarray) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel parameter (axis 1) over ``x``."""
    if p.ndim <= 1:
        return (1, -1) + (1,) * (x.ndim - 2)
    return (1,) + p.shape  # pre-opset-7 BatchNormalization with spatial=0: [C, *spatial]


def _native_affine(x: np.ndarray, scale: np.ndarray) -> bool:
    """Whether a per-channel affine map of ``x`` runs in the native library (one threaded pass with
    the activation, where numpy makes one per operation): float32 [N, C, ...] with one scale per channel."""
    if x.dtype != np.float32 or x.ndim < 2 or scale.ndim > 1 or scale.size != x.shape[1] or not x.size:
        return False
    if not native.available():
        native.note_unavailable()
        return False
    return True


@kernel("BatchNormalization")
def batch_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``(X - mean) / sqrt(var + eps) * scale + B`` as one folded per-channel multiply-add."""
    x, scale, bias, mean, var = inputs[:5]
    ct = compute_dtype(x.dtype)
    eps = float(attrs.get("epsilon", 1e-5))
    xc = x.astype(ct, copy=False)
    extra: list[np.ndarray] = []
    if int(attrs.get("training_mode", 0)):
        axes = (0,) + tuple(range(2, x.ndim))
        bmean = xc.mean(axis=axes)
        bvar = xc.var(axis=axes)
        mom = float(attrs.get("momentum", 0.9))
        extra = [
            (mean * mom + bmean * (1 - mom)).astype(mean.dtype),
            (var * mom + bvar * (1 - mom)).astype(var.dtype),
        ]
        mean, var = bmean, bvar
    a = scale.astype(ct) / np.sqrt(var.astype(ct) + ct.type(eps))
    b = bias.astype(ct) - mean.astype(ct) * a
    if _native_affine(x, a):
        return [native.channel_affine(x, a, b)] + extra
    shape = _channel_shape(x, scale)
    y = xc * a.reshape(shape)
    y += b.reshape(shape)
    return [y.astype(x.dtype, copy=False)] + extra


@kernel("ChannelAffine", domain=OPTCLI_DOMAIN)
def channel_affine(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``X * scale[c] + shift[c]`` along axis 1, then the fused activation epilogue."""
    x, scale, shift = inputs[0], inputs[1], inputs[2]
    if _native_affine(x, scale) and (shift is None or shift.size == scale.size):
        return [apply_output_quant(native.channel_affine(x, scale, shift, *epilogue(attrs)), attrs)]
    ct = compute_dtype(x.dtype)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = x.astype(ct, copy=False) * scale.astype(ct, copy=False).reshape(shape)
    if shift is not None:
        y += shift.astype(ct, copy=False).reshape(shape)
    y = apply_activation(y, *epilogue(attrs))
    return [apply_output_quant(y.astype(x.dtype, copy=False), attrs)]


def _native_layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int,
                       eps: float) -> list[np.ndarray] | None:
    """LayerNormalization of float32 ``x`` in the native library, or None where it does not apply
    (other dtypes, broadcast scale or bias, eps too small for float32).  Rows of contiguous
    values run as they lie; over the last axis of a channels-last view of a contiguous [N, C, ...]
    tensor (ConvNeXt's Transpose -> LayerNorm -> Transpose), the strided rows are normalised in
    place in that layout and the result is the same view of it: no transposing copy either way."""
    c = prod(x.shape[axis:])
    if x.dtype != np.float32 or not x.size or scale.size != c or (bias is not None and bias.size != c) \
            or not eps >= 1.2e-38:
        return None
    if not native.available():
        native.note_unavailable()
        return None
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    if not x.flags.c_contiguous and axis == x.ndim - 1 and x.ndim >= 3:
        last = x.ndim - 1  # transpose, not np.moveaxis: ~3 us a call, a third of this kernel's Python time
        xt = x.transpose(0, last, *range(1, last))  # channels-last view -> the [N, C, ...] array it was made from
        if xt.flags.c_contiguous:
            y, mean, inv = native.layer_norm(xt, scale, bias, eps, inner=prod(xt.shape[2:]))
            return [y.transpose(0, *range(2, x.ndim), 1), mean.reshape(stat_shape), inv.reshape(stat_shape)]
    y, mean, inv = native.layer_norm(np.ascontiguousarray(x), scale, bias, eps)
    return [y, mean.reshape(stat_shape), inv.reshape(stat_shape)]


def _prepare_layer_norm(memo: dict, x: Any, scale: Any, bias: Any, axis: int, eps: float, attrs: Any) -> Any:
    """Remember (and return) this step's native call for this input shape
    (``native.prepared_layer_norm``), or None where it does not apply.  It applies to float32 rows
    of contiguous values with scale and bias float32 arrays of the row's size, read-only (a plan's
    constants, which cannot change under the memo), and eps that float32 holds.  The statistics
    are made only where the step names more than Y."""
    c = prod(x.shape[axis:]) if type(x) is np.ndarray else 0
    if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous and x.size and 0 <= axis < x.ndim
            and native.available() and eps >= 1.2e-38):
        return None
    for v in (scale, bias):
        if v is not None and not (type(v) is np.ndarray and v.dtype is _F32 and v.size == c
                                  and not v.flags.writeable):
            return None
    stats = int(attrs.get("_n_outputs", 3)) > 1
    call = native.prepared_layer_norm(scale, bias, eps, x.shape, axis, stats)
    memo["layer norm"] = (scale, bias, x.shape, call)
    return call


@kernel("LayerNormalization")
def layer_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Normalise over axes ``[axis, rank)``; returns ``[Y, Mean, InvStdDev]``."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is not None and type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous:
        hit = memo.get("layer norm")
        if hit is not None and hit[0] is scale and hit[1] is bias and hit[2] == x.shape:
            return hit[3](x)
    axis = int(attrs.get("axis", -1))
    axis = axis + x.ndim if axis < 0 else axis
    eps = float(attrs.get("epsilon", 1e-5))
    if memo is not None:
        prepared = _prepare_layer_norm(memo, x, scale, bias, axis, eps, attrs)
        if prepared is not None:
            return prepared(x)
    stash = np.float32 if int(attrs.get("stash_type", 1)) == 1 and x.dtype != np.float64 else x.dtype
    done = _native_layer_norm(x, scale, bias, axis, eps) if stash == np.float32 else None
    if done is not None:
        return done
    ct = np.dtype(stash)
    xr = x.astype(ct, copy=False).reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))  # -1: ambiguous if empty
    mean = xr.mean(axis=1, keepdims=True)
    d = xr - mean
    var = np.einsum("ij,ij->i", d, d)[:, None] / ct.type(xr.shape[1])
    inv = ct.type(1.0) / np.sqrt(var + ct.type(eps))
    d *= inv
    y = d.reshape(x.shape)
    y *= scale.astype(ct, copy=False)
    if bias is not None:
        y += bias.astype(ct, copy=False)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    return [y.astype(x.dtype, copy=False), mean.reshape(stat_shape), inv.reshape(stat_shape)]


@kernel("InstanceNormalization")
def instance_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Per-(image, channel) normalisation over the spatial axes, then per-channel scale and B."""
    x, scale, bias = inputs[0], inputs[1], inputs[2]
    ct = compute_dtype(x.dtype)
    eps = float(attrs.get("epsilon", 1e-5))
    n, c = x.shape[:2]
    xr = x.astype(ct, copy=False).reshape(n, c, prod(x.shape[2:]))
    mean = xr.mean(axis=2, keepdims=True)
    d = xr - mean
    var = np.einsum("ncs,ncs->nc", d, d)[:, :, None] / ct.type(xr.shape[2])
    a = scale.astype(ct).reshape(1, c, 1) / np.sqrt(var + ct.type(eps))
    d *= a
    d += bias.astype(ct).reshape(1, c, 1)
    return [d.reshape(x.shape).astype(x.dtype, copy=False)]


_F32 = np.dtype(np.float32)


def _softmax_view(x: np.ndarray, attrs: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The array to normalise and the axis, per the node's opset semantics."""
    if int(attrs.get("_opset", 13)) >= 13:
        return x, int(attrs.get("axis", -1))
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(rows, -1), 1


_TINY_SOFTMAX = 8  # elements up to which Python floats beat numpy's calls (30: 7.9 against 4.2 us)


_DOT_SUM_MAX = 1024  # elements up to which a row's sum is a dot product with ones (float32 accumulation)
_ONES = np.ones(_DOT_SUM_MAX, np.float32)
_ONES.setflags(write=False)


def _one_row_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of a float32 array whose softmax axis holds all its elements (a decoder's [1, K]
    scores, its [1, T, 1] attention weights, every step of its Loop): the max and the sum over
    the whole array, ~1 us a call less than along an axis with keepdims.  The max is the element
    argmax points at, the sum of a short row a dot product with ones: ufunc reductions cost ~0.75
    us each on 30-64 floats, those ~0.3.  A NaN (argmax's pick), or inf - inf, makes every value
    NaN, as the general path makes the row."""
    flat = x.reshape(-1)
    e = np.subtract(x, flat[flat.argmax()])
    np.exp(e, out=e)
    n = e.size
    total = e.reshape(-1).dot(_ONES[:n]) if n <= _DOT_SUM_MAX else np.add.reduce(e, axis=None)
    return np.divide(e, total, out=e)


def _tiny_softmax(x: np.ndarray) -> np.ndarray | None:
    """Softmax along the last axis of a float32 array of a few elements (a face detector's [1, 2]
    class scores) in Python floats, rounded to float32 once: ~3 us where numpy's five calls took
    ~9.  None where a row holds a NaN (Python's max would depend on its order; numpy's path
    makes the row NaN)."""
    out = []
    for row in x.reshape(-1, x.shape[-1]).tolist():
        m = max(row)
        if m != m or any(v != v for v in row):
            return None
        e = [math.exp(v - m) for v in row]
        total = sum(e)
        out.append([v / total for v in e])
    return np.array(out, np.float32).reshape(x.shape)


@kernel("Softmax")
def softmax(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``exp(x - max) / sum`` along the axis (opset < 13: over the 2-D coerced input)."""
    x = inputs[0]
    if x.size == 0:  # nothing to normalise (and max() has no identity over an empty axis)
        return [x.copy()]
    opset = attrs.get("_opset", 13)
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
    if type(x) is np.ndarray and x.dtype is _F32 and (opset >= 13 or axis in (-1, x.ndim - 1)):
        # float32 along one axis (a decoder's attention weights and its output distribution every
        # step, a transformer's attention scores; before opset 13, an axis that is the last, as a
        # classifier's [N, classes] has).  Along the last axis one native call: 1.2 us on 2..200
        # floats, 2.7 on [2, 2, 16, 16], where numpy's five calls took 3.3 and 8.7
        if x.ndim and x.flags.c_contiguous and native.available():
            if axis in (-1, x.ndim - 1):
                return [native.softmax_rows(x)]
            if -x.ndim <= axis < x.ndim and x.shape[axis] == x.size:  # one row on another axis ([1, T, 1])
                return [native.softmax_rows(x.reshape(1, -1)).reshape(x.shape)]
            a = axis + x.ndim if axis < 0 else axis
            if 0 <= a < x.ndim - 1 and 1 <= x.shape[a] <= native.elementwise.SOFTMAX_MID_MAX_N and x.size:
                return [native.softmax_mid(x, a)]  # a middle axis: strided rows, eight at a time
        # without the library: Python floats for a few elements, else three numpy passes in place,
        # where the general path's casts and views cost as much again
        if x.size <= _TINY_SOFTMAX and x.ndim and axis in (-1, x.ndim - 1):
            tiny = _tiny_softmax(x)
            if tiny is not None:
                return [tiny]
        if x.ndim and -x.ndim <= axis < x.ndim and x.shape[axis] == x.size:
            return [_one_row_softmax(x)]
        e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
        np.exp(e, out=e)
        return [np.divide(e, np.add.reduce(e, axis=axis, keepdims=True), out=e)]
    v, axis = _softmax_view(x.astype(compute_dtype(x.dtype), copy=False), attrs)
    e = v - v.max(axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return [e.reshape(x.shape).astype(x.dtype, copy=False)]


@kernel("LogSoftmax")
def log_softmax(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``x - max - log(sum(exp(x - max)))`` along the axis (opset < 13: 2-D coerced)."""
    x = inputs[0]
    if x.size == 0:
        return [x.copy()]
    v, axis = _softmax_view(x.astype(compute_dtype(x.dtype), copy=False), attrs)
    d = v - v.max(axis=axis, keepdims=True)
    d -= np.log(np.exp(d).sum(axis=axis, keepdims=True))
    return [d.reshape(x.shape).astype(x.dtype, copy=False)]


# ----------------------------------------------------------------------------- shape functions

def _channels(x: Shape):
    return x[1] if x is not None and len(x) > 1 else None


@shape_fn("BatchNormalization")
def _batch_norm_shape(args: ShapeArgs) -> list[Shape]:
    """Y has X's shape; scale, B, mean and var hold one value per channel (the training outputs too)."""
    x, c = args.shape(0), _channels(args.shape(0))
    if args.rank(1) == 1:  # pre-opset-7 spatial=0 parameters are [C, *spatial]: not per channel
        for k, name in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")):
            check_length(args, k, c, name)
    return [x, args.shape(3), args.shape(4)]


@shape_fn("ChannelAffine", domain=OPTCLI_DOMAIN)
def _channel_affine_shape(args: ShapeArgs) -> list[Shape]:
    for k in (1, 2):
        check_length(args, k, _channels(args.shape(0)), f"input {k}", allow_one=True)
    return [args.shape(0)]


@shape_fn("InstanceNormalization")
def _instance_norm_shape(args: ShapeArgs) -> list[Shape]:
    for k, name in ((1, "scale"), (2, "B")):
        check_length(args, k, _channels(args.shape(0)), name)
    return [args.shape(0)]


@shape_fn("LayerNormalization")
def _layer_norm_shape(args: ShapeArgs) -> list[Shape]:
    """Y has X's shape; Mean and InvStdDev keep the axes before ``axis`` and 1 for the others."""
    x = args.shape(0)
    if x is None:
        return [None]
    axis = norm_axis(int(args.attrs.get("axis", -1)), len(x))
    stats = (*x[:axis], *(1,) * (len(x) - axis))
    return [x, stats, stats]


shape_fn(["Softmax", "LogSoftmax"])(first_input)
