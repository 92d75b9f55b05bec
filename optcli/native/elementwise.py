"""Element-wise kernels: stand-alone activations, sums with an activation, LayerNormalization and
row means (kernels/host/elementwise.c)."""

from __future__ import annotations

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.library import _check, require


def activation(x: np.ndarray, name: str, alpha: float = 0.0, beta: float = 0.0,
               out: np.ndarray | None = None) -> np.ndarray:
    """The fused epilogue's activation ``name`` over a float32 array as a stand-alone op (GELU,
    sigmoid, hard-swish...), in one threaded pass; ``out=x`` works in place."""
    require(library._lib is not None, 'activation')
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(np.shape(x))  # a 0-d x stays 0-d
    if out is None:
        out = np.empty_like(x)
    require(out.dtype == np.float32 and out.flags.c_contiguous and out.shape == x.shape, 'activation')
    _check(library.function("optcli_activation_f32")(x, out, x.size, ACTIVATION_CODES[name], alpha, beta),
           f"{name} activation")
    return out


_F32 = np.dtype(np.float32)


def activation_(y: np.ndarray, name: str, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """``activation(y, name, out=y)`` for a C-contiguous, writable float32 ``y``, without the
    conversions ``activation`` makes for any input: a GRU's gates in a decoder's Loop (96 floats)
    took ~4 us of those checks around a native sigmoid of ~0.2 us, and numpy's five in-place passes
    ~3 us.  Anything else is refused (NativeError), not converted."""
    require(library._lib is not None and type(y) is np.ndarray and y.dtype is _F32 and y.flags.c_contiguous
            and y.flags.writeable, 'activation')
    rc = library.function("optcli_activation_f32")(y, y, y.size, ACTIVATION_CODES[name], alpha, beta)
    if rc:
        _check(rc, f"{name} activation")
    return y


def add_period(a: np.ndarray, b: np.ndarray, activation: str | None = None, alpha: float = 0.0,
               beta: float = 0.0) -> np.ndarray:
    """``act(a + b)`` of a C-contiguous float32 ``a`` and a C-contiguous float32 ``b`` whose elements
    repeat along ``a`` (numpy's broadcast of b's trailing dims: a bias row [C] or a [T, C] block
    over [..., T, C]; the caller checks the shapes), in a new array of a's shape, one threaded pass."""
    require(library._lib is not None and type(a) is np.ndarray and type(b) is np.ndarray and a.dtype is _F32
            and b.dtype is _F32 and a.flags.c_contiguous and b.flags.c_contiguous and b.size >= 1
            and a.size % b.size == 0, 'add')
    out = np.empty_like(a)
    rc = library.function("optcli_add_period_f32")(a, b, out, a.size, b.size, ACTIVATION_CODES[activation], alpha, beta)
    if rc:
        _check(rc, "add")
    return out


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax along the last axis of a C-contiguous float32 ``x`` (at least one element a row) in a
    new array: one native call where numpy takes five (kernels/host/elementwise.c).  Anything else
    is refused (NativeError), not converted."""
    require(library._lib is not None and type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous
            and x.ndim and x.shape[-1] >= 1, 'softmax')
    y = np.empty_like(x)
    n = x.shape[-1]
    rc = library.function("optcli_softmax_f32")(x, y, x.size // n, n)
    if rc:
        _check(rc, "softmax")
    return y


SOFTMAX_MID_MAX_N = 4096  # the longest rows optcli_softmax_mid_f32 takes (SOFTMAX_STRIDED_MAX_N in C)


def softmax_mid(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax along ``axis`` (not the last) of a C-contiguous float32 ``x``, in a new array: x seen as
    [outer, n, inner], eight inner positions a vector (kernels/host/elementwise.c), where numpy's
    five calls made strided passes (a segmentation head's classes, a YOLOv8 head's 16 bins).  Anything
    else is refused (NativeError), not converted."""
    require(library._lib is not None and type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous
            and 0 <= axis < x.ndim - 1 and 1 <= x.shape[axis] <= SOFTMAX_MID_MAX_N and x.size, 'softmax')
    y = np.empty_like(x)
    outer, n = int(np.prod(x.shape[:axis], dtype=np.int64)), x.shape[axis]
    rc = library.function("optcli_softmax_mid_f32")(x, y, outer, n, x.size // (outer * n))
    if rc:
        _check(rc, "softmax")
    return y


def add(a: np.ndarray, b: np.ndarray, activation: str | None = None, alpha: float = 0.0,
        beta: float = 0.0) -> np.ndarray:
    """``act(a + b)`` of two C-contiguous float32 arrays of one shape, in one threaded pass (a
    residual Add and the Relu fused after it, where numpy takes two passes)."""
    require(library._lib is not None and a.shape == b.shape and a.dtype == b.dtype == np.float32, 'add')
    require(a.flags.c_contiguous and b.flags.c_contiguous, 'add')
    out = np.empty_like(a)
    _check(library.function("optcli_add_f32")(a, b, out, a.size, ACTIVATION_CODES[activation], alpha, beta), "add")
    return out


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float, inner: int = 1,
               stats: bool = True) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """LayerNormalization of a C-contiguous float32 ``x`` seen as [outer, C, inner] over C (``inner``
    1: rows of C contiguous), ``scale`` and ``bias`` [C]; ``eps`` > 0.  Returns (y as x's shape,
    mean and 1 / std as float32 [outer * inner] or None without ``stats``)."""
    require(library._lib is not None and x.dtype == np.float32 and x.flags.c_contiguous and eps > 0, 'layer norm')
    c = scale.size
    outer = x.size // (c * inner) if c * inner else 0
    require(outer * c * inner == x.size and (bias is None or bias.size == c), 'layer norm')
    s = np.ascontiguousarray(scale, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    y = np.empty_like(x)
    mean = np.empty(outer * inner, np.float32) if stats else None
    inv = np.empty(outer * inner, np.float32) if stats else None
    _check(library.function("optcli_layer_norm_f32")(x, s, b, y, mean, inv, outer, c, inner, eps),
           "layer normalization")
    return y, mean, inv


def prepared_layer_norm(scale: np.ndarray, bias: np.ndarray | None, eps: float, shape: tuple[int, ...], axis: int,
                        stats: bool):
    """``layer_norm`` over the axes ``[axis, rank)`` of C-contiguous float32 inputs of ``shape``, worked
    out once for one plan step: a function of ``x`` giving ``[y]``, or ``[y, mean, inv]`` (shaped as
    LayerNormalization's outputs) with ``stats``.  Per call the output arrays and one C call, where
    ``layer_norm`` converts and checks every argument again (~3 us of a transformer's 5 us LayerNorm
    on [2, 16, 128])."""
    c = int(np.prod(shape[axis:], dtype=np.int64))
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    s = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
    require(library._lib is not None and c >= 1 and s.size == c and (b is None or b.size == c) and eps > 0,
            'layer norm')
    fn, empty, f32 = library.function("optcli_layer_norm_f32"), np.empty, np.float32
    stat_shape = tuple(shape[:axis]) + (1,) * (len(shape) - axis)

    def call(x: np.ndarray) -> list[np.ndarray]:
        y = empty(shape, f32)
        if not stats:
            rc = fn(x, s, b, y, None, None, outer, c, 1, eps)
            if rc:
                _check(rc, "layer normalization")
            return [y]
        mean, inv = empty(stat_shape, f32), empty(stat_shape, f32)
        rc = fn(x, s, b, y, mean, inv, outer, c, 1, eps)
        if rc:
            _check(rc, "layer normalization")
        return [y, mean, inv]

    return call


def row_mean(x: np.ndarray, n: int) -> np.ndarray:
    """The mean of each run of ``n`` floats of a C-contiguous float32 ``x`` (its trailing axes making
    ``n``): a flat float32 array of x.size // n means, summed in float32 blocks and double."""
    require(library._lib is not None and x.dtype == np.float32 and x.flags.c_contiguous and n >= 1 and x.size % n == 0,
            'row mean')
    y = np.empty(x.size // n, np.float32)
    _check(library.function("optcli_row_mean_f32")(x, y, y.size, n), "row mean")
    return y


def to_half(x: np.ndarray) -> np.ndarray | None:
    """``x`` (float32, any shape) as a new C-contiguous float16 array: rounding to nearest even,
    finite values beyond +-65504 saturating to it, infinities and NaN kept (the GPU's half storage,
    ``runtime/gpu_common/device_buffers.to_storage``); None where the library cannot (absent, or
    built without _Float16), and the caller casts with numpy."""
    if library._lib is None or x.dtype != np.float32:
        return None
    out = np.empty(x.shape, np.float16)  # (before ascontiguousarray, which makes a 0-d x 1-d)
    x = np.ascontiguousarray(x)
    return out if library.function("optcli_f32_to_f16")(x, out, x.size) == 0 else None


def from_half(x: np.ndarray) -> np.ndarray | None:
    """``x`` (float16) as a new C-contiguous float32 array, exactly; None where the library cannot."""
    if library._lib is None or x.dtype != np.float16:
        return None
    out = np.empty(x.shape, np.float32)
    x = np.ascontiguousarray(x)
    return out if library.function("optcli_f16_to_f32")(x, out, x.size) == 0 else None
