"""Pooling kernels (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) for 1-D/2-D/3-D inputs.

A pool is a reduction over ``prod(kernel_shape)`` strided views of the padded input, so each
kernel tap is one vectorised ``maximum`` or ``add`` over the whole output; there is no window
buffer.  Geometry (pads, auto_pad, dilations, ceil_mode) comes from ``optcli.ops.spatial`` so
that it matches Conv exactly.

AveragePool divides by a per-position window count that is the outer product of per-axis
counts: with ``count_include_pad`` the declared padding counts, but window parts that only
exist because of ``ceil_mode`` never do (onnxruntime's and PyTorch's convention).

MaxPool's optional second output (Indices) is not produced: the kernel returns only ``Y``.
AveragePool and GlobalAveragePool may end in a fused FakeQuant (``fuse_fake_quant``).

Where the native library is loaded (``optcli.native``), fp32 1-D and 2-D MaxPool / AveragePool
run there (one pass over each window row in cache instead of a pass over the whole output per
tap), with the same ids and results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.ops.activation import apply_output_quant
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, shape_fn
from optcli.ops.spatial import Window, compute_dtype, pad_input, prod, window, window_dims


def _window(x: np.ndarray, attrs: dict[str, Any]) -> Window:
    if x.ndim < 3:
        raise ValueError(f"pooling needs an input of rank >= 3, got shape {x.shape}")
    return window(attrs, x.shape[2:], attrs["kernel_shape"], ceil_mode=bool(attrs.get("ceil_mode", 0)))


def _over_taps(xp: np.ndarray, win: Window, combine: np.ufunc) -> np.ndarray:
    """Combine (max or add) the strided views of every kernel tap into a fresh output array."""
    head = (slice(None), slice(None))
    taps = iter(win.taps())
    y = xp[head + win.tap_slices(next(taps))].copy()
    for tap in taps:
        combine(y, xp[head + win.tap_slices(tap)], out=y)
    return y


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _native_pool(x: np.ndarray, win: Window, op: str, include_pad: bool = False,
                 attrs: dict[str, Any] | None = None) -> np.ndarray | None:
    """The pool in the native library (fp32, 1-D as 2-D with a one-row window), or None where it
    does not run (no library, another dtype, 3-D, empty)."""
    if not (x.dtype == np.float32 and x.ndim in (3, 4) and x.size and native.depthwise_fits(win.kernel, win.strides)):
        return None
    if not native.available():
        native.note_unavailable()
        return None
    lift = x.ndim == 3
    one = (1,) if lift else ()
    rrow = rcol = None
    if op == "avg":
        counts = _axis_counts(win, x.shape[2:], include_pad)
        rrow, rcol = (np.ones(1) if lift else 1.0 / counts[0]), 1.0 / counts[-1]
    y = native.pool2d(x[:, :, None, :] if lift else x, op, one + win.kernel, one + win.strides, one + win.dilations,
                      (0,) * lift + win.pad_begin, one + win.out, rrow, rcol)
    if not lift and type(attrs) is StepAttrs and x.flags.c_contiguous:  # the next runs: one checked C call
        attrs.memo["prepared pool"] = (x.shape, native.window.prepared_pool2d(
            x.shape, op, win.kernel, win.strides, win.dilations, win.pad_begin, win.out, rrow, rcol))
    return y.reshape(y.shape[:2] + win.out) if lift else y


def _prepared_pool(attrs: dict[str, Any], x: Any) -> Any:
    """The step's pool worked out once (``_native_pool``), for an input of the shape it was made
    for: a C-contiguous float32 array."""
    if type(attrs) is not StepAttrs or type(x) is not np.ndarray or x.dtype != np.float32 \
            or not x.flags.c_contiguous or not native.available():
        return None
    hit = attrs.memo.get("prepared pool")
    return hit[1] if hit is not None and hit[0] == x.shape else None


def _q8_pool(attrs: dict[str, Any], x: Any, win: Window | None) -> Any:
    """The native 8-bit max pool for this step and input (an integer plan's pool: fuse_qdq_movement),
    made once per input shape and kept in the step's memo; None where it does not run."""
    if type(x) is not np.ndarray or x.dtype not in _BYTES or x.ndim != 4 or not x.size or not x.flags.c_contiguous:
        return None
    memo = attrs.memo if type(attrs) is StepAttrs else {}
    hit = memo.get("prepared q8 pool")
    if hit is not None and hit[0] == (x.shape, x.dtype):
        return hit[1]
    if win is None or not native.available() or max(win.strides) > native.window.Q8_MAX_STRIDE \
            or not native.depthwise_fits(win.kernel, win.strides):
        return None
    call = native.window.prepared_maxpool2d_q8(x.shape, x.dtype, win.kernel, win.strides, win.dilations,
                                               win.pad_begin, win.out)
    memo["prepared q8 pool"] = ((x.shape, x.dtype), call)
    return call


_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))


@kernel("MaxPool", max_outputs=1)
def max_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Max over the kernel taps of a -inf padded input (returns Y only, never Indices); 8-bit inputs (an
    integer plan's) in the native library's byte pool."""
    x = inputs[0]
    fast = _prepared_pool(attrs, x) or _q8_pool(attrs, x, None)
    if fast is not None:
        return [fast(x)]
    win = _window(x, attrs)
    q8 = _q8_pool(attrs, x, win)
    if q8 is not None:
        return [q8(x)]
    y = _native_pool(x, win, "max", attrs=attrs)
    if y is not None:
        return [y]
    return [_over_taps(pad_input(x, win, _lowest(x.dtype)), win, np.maximum)]


def _axis_counts(win: Window, spatial: tuple[int, ...], include_pad: bool) -> list[np.ndarray]:
    """Per spatial axis, the number of counted input positions in each output window's extent."""
    counts = []
    for size, k, s, d, b, e, o in zip(
        spatial, win.kernel, win.strides, win.dilations, win.pad_begin, win.declared_end, win.out
    ):
        # Position (in unpadded coordinates) of tap t of output j.
        pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - b
        ok = (pos >= -b) & (pos < size + e) if include_pad else (pos >= 0) & (pos < size)
        counts.append(ok.sum(axis=1).astype(np.float64))
    return counts


def _counts(win: Window, spatial: tuple[int, ...], include_pad: bool) -> np.ndarray:
    """Number of counted input positions in each output window, shaped to broadcast over Y."""
    total: np.ndarray | None = None
    n = len(spatial)
    for axis, cnt in enumerate(_axis_counts(win, spatial, include_pad)):
        cnt = cnt.reshape((len(cnt),) + (1,) * (n - axis - 1))
        total = cnt if total is None else total * cnt
    assert total is not None
    return total


@kernel("AveragePool")
def average_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Sum over the kernel taps of a zero-padded input, divided by the per-window count."""
    x = inputs[0]
    fast = _prepared_pool(attrs, x)
    if fast is not None:
        return [apply_output_quant(fast(x), attrs)]
    win = _window(x, attrs)
    y = _native_pool(x, win, "avg", bool(attrs.get("count_include_pad", 0)), attrs)
    if y is not None:
        return [apply_output_quant(y, attrs)]
    ct = compute_dtype(x.dtype)
    y = _over_taps(pad_input(x.astype(ct, copy=False), win, 0.0), win, np.add)
    counts = _counts(win, x.shape[2:], bool(attrs.get("count_include_pad", 0)))
    if np.all(counts == counts.flat[0]):
        y *= ct.type(1.0 / counts.flat[0])
    else:
        y /= counts.astype(ct)
    return [apply_output_quant(y.astype(x.dtype, copy=False), attrs)]


def _flat_spatial(x: np.ndarray) -> np.ndarray:
    """``x`` as (N, C, prod(spatial)); an explicit size, since -1 is ambiguous when N or C is 0."""
    return x.reshape(x.shape[:2] + (prod(x.shape[2:]),))


@kernel("GlobalAveragePool")
def global_average_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Mean over every spatial axis, keeping them as size-1 dims (float32 in the native library)."""
    x = inputs[0]
    if x.dtype == np.float32 and x.ndim >= 3 and x.size and x.flags.c_contiguous and native.available():
        y = native.row_mean(x, prod(x.shape[2:]))
    else:
        y = _flat_spatial(x).mean(axis=-1, dtype=compute_dtype(x.dtype))
    return [apply_output_quant(y.reshape(x.shape[:2] + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False), attrs)]


@kernel("GlobalMaxPool")
def global_max_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Max over every spatial axis, keeping them as size-1 dims."""
    x = inputs[0]
    y = _flat_spatial(x).max(axis=-1)
    return [y.reshape(x.shape[:2] + (1,) * (x.ndim - 2))]


# ----------------------------------------------------------------------------- shape functions

def pool_shape(x: Shape, attrs: dict[str, Any], channels_last: bool = False) -> Shape:
    """A windowed pool's output (N, C, *window dims), or (N, *window dims, C) ``channels_last``."""
    if x is None:
        return None
    if len(x) < 3:
        raise ShapeDerivationError(f"the input has rank {len(x)}; pooling needs a batch, channel and spatial axis")
    kernel = attrs.get("kernel_shape")
    if not kernel:
        raise ShapeDerivationError("no kernel_shape")
    spatial = x[1:-1] if channels_last else x[2:]
    try:
        out = window_dims(attrs, spatial, [int(k) for k in kernel], ceil_mode=bool(attrs.get("ceil_mode", 0)))
    except ValueError as exc:
        raise ShapeDerivationError(str(exc)) from None
    return (x[0], *out, x[-1]) if channels_last else (x[0], x[1], *out)


def global_pool_shape(x: Shape, channels_last: bool = False) -> Shape:
    if x is None:
        return None
    if len(x) < 2:
        raise ShapeDerivationError(f"the input has rank {len(x)}; global pooling needs a batch and channel axis")
    if channels_last:
        return (x[0], *(1,) * (len(x) - 2), x[-1])
    return (x[0], x[1], *(1,) * (len(x) - 2))


@shape_fn(["MaxPool", "AveragePool"])
def _pool_shape(args: ShapeArgs) -> list[Shape]:
    out = pool_shape(args.shape(0), args.attrs)
    return [out, out]  # MaxPool's Indices have Y's shape


@shape_fn(["GlobalAveragePool", "GlobalMaxPool"])
def _global_pool_shape(args: ShapeArgs) -> list[Shape]:
    return [global_pool_shape(args.shape(0))]
