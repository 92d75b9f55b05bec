"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare.

One helper resolves what the ops share and what moved across ONNX versions: the reduced axes
come from the ``axes`` attribute (ReduceSum before opset 13, the others before 18) or from the
second input (later), an empty/absent list means "all axes" unless ``noop_with_empty_axes`` asks
to reduce over no axis at all (the element-wise part still applies: ReduceSumSquare gives x*x,
as in onnxruntime and the ONNX reference), and ``keepdims`` keeps the reduced axes as size 1.

Results keep the input dtype.  float16 accumulates in float32 and integers in float64 where the
op involves division or transcendental functions, as onnxruntime does.  Reducing an empty set
gives the identity of the reduction, as the spec says: 0 for sums, 1 for products, -inf (or
the dtype's minimum) for ReduceMax, +inf (or maximum) for ReduceMin, -inf for the log-sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from optcli import native
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, norm_axis, shape_fn, unknown

Inputs = list[np.ndarray | None]
Attrs = dict[str, Any]


def reduce_axes(x: np.ndarray, inputs: Inputs, attrs: Attrs) -> tuple[int, ...]:
    """The reduced axes, normalised and sorted; () for ``noop_with_empty_axes`` with no axes."""
    axes_in = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    if axes_in is not None:
        axes = [int(a) for a in np.asarray(axes_in).reshape(-1)]
    else:
        axes = [int(a) for a in attrs.get("axes") or []]
    if not axes:
        return () if attrs.get("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(sorted(a + x.ndim if a < 0 else a for a in axes))


def _acc_dtype(x: np.ndarray, integer_as_float: bool) -> np.dtype:
    if x.dtype == np.float16:
        return np.dtype(np.float32)
    if integer_as_float and x.dtype.kind in "iub":
        return np.dtype(np.float64)
    return x.dtype


_SMALL_MEAN = 4096
"""Elements up to which a bound ReduceMean step of fixed axes remembers them with its input's shape
and runs one numpy sum and one division: its general path (axes worked out, an error-state context,
the output reshaped) cost 35-50 us on a voice detector's [1, 1, 16] mean in its If (onnxruntime: 4).
It sums in float64 (no float32 overflow on the way; the general path's native mean sums in double
too), quiet on inf - inf as the general path is."""


_TINY_MEAN = 64
"""Elements up to which a small mean over trailing axes sums in Python floats (doubles, in order):
~1.8 us where numpy's error-state context, float64 sum and division took ~4.8 (a voice detector's
[1, 1, 16] mean in its If, ~16 us a run inside the body, where every numpy call runs cold)."""


def _small_mean(x: np.ndarray, plan: tuple) -> np.ndarray:
    """The mean ``_SMALL_MEAN`` describes: ``plan`` is (shape, axes, keepdims, count, out_shape),
    ``out_shape`` the result's shape where the axes are trailing and the input tiny, else None."""
    if plan[4] is not None:
        n = plan[3]
        rows = x.reshape(-1, int(n)).tolist()
        return np.array([sum(r) / n for r in rows], np.float32).reshape(plan[4])
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.add.reduce(x, axis=plan[1], keepdims=plan[2], dtype=np.float64)
    return np.divide(total, plan[3]).astype(np.float32)


def _reduction(compute: Callable[[np.ndarray, tuple[int, ...]], np.ndarray], integer_as_float: bool = False):
    """Build a kernel from ``compute(x_in_acc_dtype, axes)`` (called with keepdims semantics)."""

    def run(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        memo = getattr(attrs, "memo", None)
        fixed_axes = len(inputs) < 2 or inputs[1] is None
        if memo is not None and type(x) is np.ndarray and fixed_axes:
            hit = memo.get("small mean")
            if hit is not None and hit[0] == x.shape and x.dtype == np.float32:
                return [_small_mean(x, hit)]
        x = np.asarray(x)
        axes = reduce_axes(x, inputs, attrs)
        if compute is _mean and memo is not None and x.dtype == np.float32 and 0 < x.size <= _SMALL_MEAN \
                and axes and fixed_axes:  # the first run too: every run of the step gives the same bits
            keep, count = bool(attrs.get("keepdims", 1)), float(np.prod([x.shape[a] for a in axes]))
            trailing = tuple(sorted(axes)) == tuple(range(x.ndim - len(axes), x.ndim))
            out_shape = None
            if trailing and x.size <= _TINY_MEAN:
                out_shape = _kept_shape(x, axes) if keep else x.shape[:x.ndim - len(axes)]
            hit = memo["small mean"] = (x.shape, axes, keep, count, out_shape)
            return [_small_mean(x, hit)]
        xa = x.astype(_acc_dtype(x, integer_as_float), copy=False)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = np.asarray(compute(xa, axes))
        if not attrs.get("keepdims", 1):
            y = y.reshape([d for i, d in enumerate(y.shape) if i not in axes])
        if integer_as_float and x.dtype.kind in "iu":
            y = np.trunc(y)
        return [y.astype(x.dtype, copy=False)]

    return run


def _min_value(dt: np.dtype):
    if dt.kind == "f":
        return -np.inf
    if dt.kind == "b":
        return False
    return np.iinfo(dt).min


def _max_value(dt: np.dtype):
    if dt.kind == "f":
        return np.inf
    if dt.kind == "b":
        return True
    return np.iinfo(dt).max


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod([x.shape[a] for a in axes]))
    if n and x.size and x.dtype == np.float32 and axes == tuple(range(x.ndim - len(axes), x.ndim)) \
            and x.flags.c_contiguous and native.available():
        # trailing axes (squeeze-excite's spatial mean): one threaded pass, numpy's pairwise sum costs ~4x
        return native.row_mean(x, n).reshape(_kept_shape(x, axes))
    return _sum(x, axes) / x.dtype.type(n) if n else np.full(_kept_shape(x, axes), np.nan, x.dtype)


def _kept_shape(x: np.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=True, initial=_min_value(x.dtype))


def _min(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=True, initial=_max_value(x.dtype))


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    return np.log(np.sum(np.exp(x - shift), axis=axes, keepdims=True, dtype=x.dtype)) + shift


_REDUCTIONS: dict[str, tuple[Callable, bool]] = {
    "ReduceSum": (_sum, False),
    "ReduceMean": (_mean, True),
    "ReduceMax": (_max, False),
    "ReduceMin": (_min, False),
    "ReduceProd": (lambda x, a: np.prod(x, axis=a, keepdims=True, dtype=x.dtype), False),
    "ReduceL1": (lambda x, a: _sum(np.abs(x), a), False),
    "ReduceL2": (lambda x, a: np.sqrt(_sum(x * x, a)), True),
    "ReduceSumSquare": (lambda x, a: _sum(x * x, a), False),
    "ReduceLogSum": (lambda x, a: np.log(_sum(x, a)), True),
    "ReduceLogSumExp": (_log_sum_exp, True),
}

for _op, (_fn, _int_float) in _REDUCTIONS.items():
    kernel(_op)(_reduction(_fn, _int_float))



@shape_fn(list(_REDUCTIONS))
def reduce_shape(args: ShapeArgs) -> list[Shape]:
    """The reduced axes as ``reduce_axes`` reads them; kept as 1 with ``keepdims``, else dropped.
    Axes from an input of unknown value: with ``keepdims`` the rank is known, not the dims."""
    x = args.shape(0)
    keep = bool(args.attrs.get("keepdims", 1))
    given, axes = args.ints_attr_or_input(1, "axes")
    if x is None:
        return [None]
    if given and axes is None:
        return [unknown(len(x)) if keep else None]
    if not axes:
        if args.attrs.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(len(x)))
    picked = {norm_axis(a, len(x), "reduced axis") for a in axes}
    if keep:
        return [tuple(1 if i in picked else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in picked)]
