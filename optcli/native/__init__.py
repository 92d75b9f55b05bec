"""Native host kernels: a small C library (``optcli/native/src``) built by ``pip install`` when a C
compiler is present, loaded here once with ctypes.

The library has no Python API, only a C ABI: ctypes releases the GIL around each call, and the
library splits the work over its own pthread pool (never OpenMP, which fights OpenBLAS), sized
by ``optcli.load(..., threads=N)`` through threadpoolctl like the BLAS threads are.

The library is optional.  Where it was not built (no compiler at install), failed to load, or is
turned off with ``OPTCLI_NATIVE=0``, the numpy kernels run instead and compute the same results;
``status()`` says which, and the first kernel that would have used it logs that once.  Kernels
keep their ids either way, so a ``.nb`` never depends on whether this library exists.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import platform
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES

LOG = logging.getLogger("optcli")

ABI = 2  # OPTCLI_NATIVE_ABI in src/optcli_native.h
LIB_PREFIX = "_optcli_native"  # the extension's file name starts with this (threadpoolctl matches it)


_i64p = ctypes.POINTER(ctypes.c_int64)
_vp = ctypes.c_void_p
_SIGNATURES = {
    "optcli_native_abi": ([], ctypes.c_int),
    "optcli_get_num_threads": ([], ctypes.c_int),
    "optcli_set_num_threads": ([ctypes.c_int], ctypes.c_int),
    "optcli_pool_workers": ([], ctypes.c_int),
    "optcli_pool_selftest": ([ctypes.c_int64, ctypes.c_int, _i64p], ctypes.c_int64),  # tests only
    "optcli_dwconv2d_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_stem_conv2d_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float],
                               ctypes.c_int),
    "optcli_pool2d_f32": ([_vp, _vp, _vp, ctypes.c_int, _vp, _vp], ctypes.c_int),
    "optcli_gemm_conv_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_gemm_pack_wt_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
    "optcli_gemm_conv_t_f32": ([_vp, _vp, ctypes.c_int64, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float],
                               ctypes.c_int),
    "optcli_gemm_variant": ([ctypes.c_int], ctypes.c_int),  # tests only
    "optcli_conv2d_gemm_f32": ([_vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float],
                               ctypes.c_int),
    "optcli_conv2d_gemm_grouped_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                        ctypes.c_float], ctypes.c_int),
    "optcli_channel_affine_f32": ([_vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                   ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_activation_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_add_f32": ([_vp, _vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_layer_norm_f32": ([_vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_float], ctypes.c_int),
    "optcli_row_mean_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
    "optcli_to_blocked_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64],
                              ctypes.c_int),
    "optcli_from_blocked_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64],
                                ctypes.c_int),
    "optcli_conv2d_blocked_f32": ([_vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float],
                                  ctypes.c_int),
    "optcli_dwconv2d_blocked_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float],
                                    ctypes.c_int),
    "optcli_pool2d_blocked_f32": ([_vp, _vp, _vp, ctypes.c_int, _vp, _vp], ctypes.c_int),
    "optcli_global_avg_blocked_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64],
                                      ctypes.c_int),
}


def library_path() -> Path | None:
    """The built library beside this file (``_optcli_native*.so`` from setup.py), if any."""
    here = Path(__file__).resolve().parent
    found = sorted(p for p in here.glob(LIB_PREFIX + "*") if p.suffix in (".so", ".dylib", ".pyd", ".dll"))
    return found[0] if found else None


def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("OPTCLI_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by OPTCLI_NATIVE=0: the numpy kernels run"
    path = library_path()
    if path is None:
        return None, ("not built (no C compiler when optcli was installed?): the numpy kernels run; "
                      "reinstall with gcc or clang present for faster CPU kernels")
    try:
        lib = ctypes.CDLL(str(path))
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        abi = lib.optcli_native_abi()
    except (OSError, AttributeError) as exc:
        return None, f"{path.name} failed to load ({exc}): the numpy kernels run; reinstall optcli"
    if abi != ABI:
        return None, f"{path.name} has ABI {abi}, this optcli expects {ABI}: the numpy kernels run; reinstall optcli"
    return lib, f"loaded {path} ({platform.machine()}, {lib.optcli_get_num_threads()} threads by default)"


_lib, _why = _load()
_noted = threading.Event()


def _register_with_threadpoolctl() -> None:
    """Let ``threadpoolctl`` (and so ``optcli.load(..., threads=N)``) size the library's pool."""
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - a dependency
        return
    if not hasattr(threadpoolctl, "register"):  # threadpoolctl < 3.5: the pool keeps its default size
        return

    class NativeController(threadpoolctl.LibController):
        user_api = "optcli"
        internal_api = "optcli_native"
        filename_prefixes = (LIB_PREFIX,)

        def get_num_threads(self):
            return self.dynlib.optcli_get_num_threads()

        def set_num_threads(self, num_threads):
            return self.dynlib.optcli_set_num_threads(int(num_threads))

        def get_version(self):
            return f"abi {self.dynlib.optcli_native_abi()}"

    threadpoolctl.register(NativeController)


if _lib is not None:
    _register_with_threadpoolctl()


def available() -> bool:
    """Whether the native kernels run (else the numpy kernels do)."""
    return _lib is not None


def status() -> str:
    """One line: where the native host kernels come from, or why the numpy kernels run."""
    return f"native host kernels: {_why}"


def note_unavailable() -> None:
    """Log once per process that a kernel ran in numpy because the library is absent."""
    if _lib is None and not _noted.is_set():
        _noted.set()
        LOG.info("optcli: %s", status())


def get_num_threads() -> int:
    return _lib.optcli_get_num_threads() if _lib is not None else 1


def vector_width() -> int:
    """The kernels' vector width in floats (4, 8 or 16: the GEMM's variant, picked by the CPU), 0 without
    the library.  It is the block of the channel-blocked host layout (optcli/ops/blocked.py)."""
    return _lib.optcli_gemm_variant(-1) if _lib is not None else 0


def set_num_threads(n: int) -> int:
    """Size the pool (the previous size is returned); ``optcli.load(threads=N)`` does this per run."""
    return _lib.optcli_set_num_threads(int(n)) if _lib is not None else 1


class NativeError(RuntimeError):
    """The library refused its arguments (a bug on our side: callers check shapes first)."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise NativeError(f"native {what} failed with code {rc}" + (" (out of memory)" if rc == -2 else ""))


_CONST_ADDRS: dict[int, tuple[weakref.ref, int]] = {}  # id -> (weak reference to a read-only array, its address)
_GEOMS: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}  # geometry values -> (int64 array, address)
_CACHE_MAX = 4096


def _ptr(a: np.ndarray | None) -> int | None:
    """The data address of ``a`` (None for None).  Read-only arrays (a plan's weights, mapped from
    the .nb file) are looked up by identity: numpy takes ~0.8 us to answer, a few times per call of
    kernels that take ~10 us on a model's small layers.  An entry holds its array weakly (a dropped
    predictor's weights are freed) and leaves with it, so an id is never reused while cached; an
    array's data never moves."""
    if a is None:
        return None
    key = id(a)
    hit = _CONST_ADDRS.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    addr = a.ctypes.data
    if not a.flags.writeable:
        if len(_CONST_ADDRS) >= _CACHE_MAX:
            _CONST_ADDRS.clear()
        _CONST_ADDRS[key] = (weakref.ref(a, lambda _, k=key: _forget_addr(k)), addr)
    return addr


def _forget_addr(key: int) -> None:
    hit = _CONST_ADDRS.get(key)
    if hit is not None and hit[0]() is None:
        del _CONST_ADDRS[key]


def _geom(values: tuple[int, ...]) -> int:
    """The address of an int64 array of ``values``, made once per distinct geometry (a model's
    layers repeat theirs run after run; np.array and its address cost ~1.3 us a call)."""
    hit = _GEOMS.get(values)
    if hit is None:
        if len(_GEOMS) >= _CACHE_MAX:
            _GEOMS.clear()
        arr = np.array(values, dtype=np.int64)
        hit = _GEOMS[values] = (arr, arr.ctypes.data)
    return hit[1]


def depthwise_fits(kernel: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the native depthwise takes this window: any usual one; absurd windows and strides
    (a scratch row per stride phase, a register pass per tap) stay in numpy."""
    return math.prod(kernel) <= 1024 and max(strides, default=1) <= 16


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                     dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                     activation: str | None = None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """Depthwise conv of float32 NCHW ``x`` by ``w`` [M, 1, KH, KW] (M a multiple of C), with bias
    and a fused activation; zero padding at the start is ``pad_begin``, at the end whatever
    ``out`` implies.  Returns a new float32 array [N, M, *out]."""
    assert _lib is not None
    return _window_conv(_lib.optcli_dwconv2d_f32, "depthwise conv", x, w, bias, strides, dilations, pad_begin, out,
                        activation, alpha, beta)


def _window_conv(fn, what: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                 dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                 activation: str | None, alpha: float, beta: float) -> np.ndarray:
    """The call shared by the convs that take the 15 geometry values (depthwise, stem)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    assert b is None or b.shape == (w.shape[0],)
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    y = np.empty((n, m, out[0], out[1]), dtype=np.float32)
    geom = _geom((n, c, h, wd, m, kh, kw, *strides, *dilations, *pad_begin, *out))
    _check(fn(x.ctypes.data, _ptr(w), _ptr(b), y.ctypes.data, geom, ACTIVATION_CODES[activation], alpha, beta), what)
    return y


STEM_MAX_CHANNELS = 4  # input channels up to which a one-group conv always runs in stem_conv2d
STEM_MAX_TAPS = 576  # beyond the stems: C * KH * KW up to this (64 channels of 3x3) ...
STEM_MIN_WIDTH = 14  # ... and output rows at least this wide


def stem_fits(channels: int, kernel: tuple[int, ...], strides: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether ``stem_conv2d`` takes a one-group 2-D conv: always with few input channels (the
    stems: the GEMM's packing costs as much as its K = C*KH*KW multiply-adds), and measured faster
    than the implicit GEMM also for up to 64 channels of a 3x3 window (ResNet's first stage, the
    3x3 convs of detection necks) where the output rows fill its vectors; 1x1 windows are GEMMs.
    With wider windows and narrow rows (7x7 maps of 512 channels: 3x slower) the GEMM stays."""
    if not (math.prod(kernel) <= 1024 and max(strides, default=1) <= 16 and channels >= 1):
        return False
    taps = channels * math.prod(kernel)
    return channels <= STEM_MAX_CHANNELS or (taps <= STEM_MAX_TAPS and math.prod(kernel) > 1
                                              and out[-1] >= STEM_MIN_WIDTH)


def stem_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                activation: str | None = None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """Dense (one group) conv of float32 NCHW ``x`` by ``w`` [M, C, KH, KW] with bias and a fused
    activation, for few input channels (src/stem.c): zero padding at the start is ``pad_begin``, at
    the end whatever ``out`` implies, applied by the kernel (no padded copy).  Returns a new float32
    array [N, M, *out]."""
    assert _lib is not None and x.ndim == 4 and w.ndim == 4 and w.shape[1] == x.shape[1]
    return _window_conv(_lib.optcli_stem_conv2d_f32, "stem conv", x, w, bias, strides, dilations, pad_begin, out,
                        activation, alpha, beta)


POOL_OPS = {"max": 1, "avg": 2}


def pool2d(x: np.ndarray, op: str, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
           pad_begin: tuple[int, int], out: tuple[int, int], rrow: np.ndarray | None = None,
           rcol: np.ndarray | None = None) -> np.ndarray:
    """Max or average pooling of float32 NCHW ``x``; padding is -inf (max) or 0 (average), at the end
    whatever ``out`` implies.  Average pooling multiplies each window's sum by ``rrow[oh] * rcol[ow]``
    (1 / count along each axis).  Returns a new float32 array [N, C, *out]."""
    assert _lib is not None
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, c, h, wd = x.shape
    y = np.empty((n, c, out[0], out[1]), dtype=np.float32)
    geom = _geom((n, c, h, wd, c, *kernel, *strides, *dilations, *pad_begin, *out))
    r = None if rrow is None else np.ascontiguousarray(rrow, dtype=np.float32)
    k = None if rcol is None else np.ascontiguousarray(rcol, dtype=np.float32)
    _check(_lib.optcli_pool2d_f32(x.ctypes.data, y.ctypes.data, geom, POOL_OPS[op], _ptr(r), _ptr(k)),
           f"{op} pooling")
    return y


def channel_affine(x: np.ndarray, scale: np.ndarray | None, shift: np.ndarray | None,
                   activation: str | None = None, alpha: float = 0.0, beta: float = 0.0,
                   out: np.ndarray | None = None) -> np.ndarray:
    """``act(x * scale[c] + shift[c])`` over a float32 [N, C, ...] in one pass (``out=x``: in place);
    ``scale`` / ``shift`` None mean 1 / 0."""
    assert _lib is not None and x.ndim >= 2
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == x.shape
    s = None if scale is None else np.ascontiguousarray(scale, dtype=np.float32)
    b = None if shift is None else np.ascontiguousarray(shift, dtype=np.float32)
    assert (s is None or s.size == x.shape[1]) and (b is None or b.size == x.shape[1])
    px = x.ctypes.data
    po = px if out is x else out.ctypes.data
    _check(_lib.optcli_channel_affine_f32(px, po, _ptr(s), _ptr(b), x.shape[0], x.shape[1], math.prod(x.shape[2:]),
                                          ACTIVATION_CODES[activation], alpha, beta), "channel affine")
    return out


def bias_activation_(y: np.ndarray, bias: np.ndarray | None, activation: str | None = None,
                     alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """``y = act(y + bias[channel])`` in place, one pass; ``y`` a C-contiguous float32 [N, C, ...]."""
    assert y.dtype == np.float32 and y.flags.c_contiguous
    return channel_affine(y, None, bias, activation, alpha, beta, out=y)


def gemm_conv(w: np.ndarray, x: np.ndarray, bias: np.ndarray | None = None, activation: str | None = None,
              alpha: float = 0.0, beta: float = 0.0, residual: np.ndarray | None = None,
              out: np.ndarray | None = None, panels: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """``act(w @ x[b] + bias[:, None] + residual[b])`` for each image ``b`` of float32 ``x`` [B, K, N],
    with ``w`` [M, K]: the product and its epilogue in one pass over the output (src/gemm.c), where
    BLAS needs a second pass for bias and activation.  ``bias`` and ``residual`` [B, M, N] may be
    None; ``out`` (C-contiguous float32 [B, M, N], not overlapping the inputs) is written if given;
    ``panels`` (``pack_panels(w)``) lets products of 16 to 256 columns run transposed."""
    assert _lib is not None and w.ndim == 2 and x.ndim == 3 and w.shape[1] == x.shape[1] >= 1
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    (m, k), (b, _, n) = w.shape, x.shape
    if out is None:
        out = np.empty((b, m, n), dtype=np.float32)
    else:
        assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (b, m, n)
    bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    assert bias is None or bias.shape == (m,)
    r = None if residual is None else np.ascontiguousarray(residual, dtype=np.float32)
    assert r is None or r.shape == out.shape
    if panels is not None:  # W.T's panels (pack_panels): small planes taken transposed
        nr, wt = panels
        assert wt.dtype == np.float32 and wt.flags.c_contiguous and wt.size == m * k
        _check(_lib.optcli_gemm_conv_t_f32(_ptr(w), _ptr(wt), nr, x.ctypes.data, _ptr(bias), _ptr(r),
                                           out.ctypes.data, b, m, k, n, ACTIVATION_CODES[activation], alpha, beta),
               "GEMM conv")
        return out
    _check(_lib.optcli_gemm_conv_f32(_ptr(w), x.ctypes.data, _ptr(bias), _ptr(r), out.ctypes.data, b, m, k, n,
                                     ACTIVATION_CODES[activation], alpha, beta), "GEMM conv")
    return out


def prepared_gemm_conv(w: np.ndarray, bias: np.ndarray | None, activation: str | None, alpha: float, beta: float,
                       panels: tuple[int, np.ndarray] | None, images: int, columns: int, shape: tuple[int, ...]):
    """``gemm_conv`` for one plan step, worked out once: a function of ``x`` ([images, K, columns],
    C-contiguous float32) that returns the product in a new array of ``shape``.  The weights, bias
    and panels are the step's own (kept alive by the function); per call only the two data
    addresses are asked, where ``gemm_conv`` checks and converts every argument again (~4 us of
    a 1x1 conv that takes 20-40 us on a MobileNet's late layers)."""
    assert _lib is not None and w.ndim == 2 and w.dtype == np.float32 and w.flags.c_contiguous
    assert bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[0],) and bias.flags.c_contiguous)
    m, k = w.shape
    code, b_addr = ACTIVATION_CODES[activation], _ptr(bias)
    if panels is not None:
        fn, head = _lib.optcli_gemm_conv_t_f32, (_ptr(w), _ptr(panels[1]), panels[0])
    else:
        fn, head = _lib.optcli_gemm_conv_f32, (_ptr(w),)
    empty, f32 = np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        y = empty(shape, f32)
        rc = fn(*head, x.ctypes.data, b_addr, None, y.ctypes.data, images, m, k, columns, code, alpha, beta)
        if rc:
            _check(rc, "GEMM conv")
        return y

    call.keep = (w, bias, panels)  # what the addresses point into
    return call


def prepared_depthwise_conv2d(xshape: tuple[int, int, int, int], w: np.ndarray, bias: np.ndarray | None,
                              strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                              out: tuple[int, int], activation: str | None, alpha: float, beta: float):
    """``depthwise_conv2d`` for one plan step and input shape, worked out once (see
    ``prepared_gemm_conv``): a function of a C-contiguous float32 ``x`` of ``xshape``."""
    assert _lib is not None and w.ndim == 4 and w.dtype == np.float32 and w.flags.c_contiguous
    assert bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[0],) and bias.flags.c_contiguous)
    n, c, h, wd = xshape
    m, _, kh, kw = w.shape
    geom_values = np.array((n, c, h, wd, m, kh, kw, *strides, *dilations, *pad_begin, *out), dtype=np.int64)
    geom = geom_values.ctypes.data  # the call's own array: the shared cache may drop its copy
    fn, code, w_addr, b_addr = _lib.optcli_dwconv2d_f32, ACTIVATION_CODES[activation], _ptr(w), _ptr(bias)
    shape, empty, f32 = (n, m, out[0], out[1]), np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        y = empty(shape, f32)
        rc = fn(x.ctypes.data, w_addr, b_addr, y.ctypes.data, geom, code, alpha, beta)
        if rc:
            _check(rc, "depthwise conv")
        return y

    call.keep = (w, bias, geom_values)
    return call


def pack_panels(w: np.ndarray) -> tuple[int, np.ndarray] | None:
    """``w`` [M, K] packed into the panels of W.T that ``gemm_conv(panels=...)`` reads on small planes
    (src/gemm.c, optcli_gemm_pack_wt_f32): (the panel width, the M * K floats), or None where M is
    not a multiple of the GEMM's vector width."""
    assert _lib is not None and w.ndim == 2
    w = np.ascontiguousarray(w, dtype=np.float32)
    wt = np.empty(w.size, dtype=np.float32)
    nr = _lib.optcli_gemm_pack_wt_f32(w.ctypes.data, wt.ctypes.data, *w.shape)
    return (nr, wt) if nr else None


_UNMADE = object()  # a _DERIVED entry seen once, nothing made yet
_DERIVED: dict[tuple[int, str], tuple[Any, Any]] = {}  # (id(array), tag) -> (weakref to it, what was made)


def derived(array: np.ndarray, tag: str, make: Callable[[np.ndarray], Any]) -> Any:
    """``make(array)``, made once per array and kept while it lives (a constant weight's transpose
    or packed panels), or None.

    Kernels get a model's constant weights as the same array objects run after run, so what is
    made from one is found again by the array's identity (a weak reference checks that the array
    is still the one the entry was made for; the entry goes when the array does).  Nothing is
    made on an array's first sighting (None is returned): an array made afresh for each call (a
    weight dequantized per run) never comes back, and making the derivative every time would
    cost more than it saves.  The array must not be changed in place while it is kept."""
    key = (id(array), tag)
    entry = _DERIVED.get(key)
    if entry is not None and entry[0]() is array:
        if entry[1] is _UNMADE:
            _DERIVED[key] = entry = (entry[0], make(array))
        return entry[1]
    try:
        ref = weakref.ref(array, lambda _r, key=key, kept=_DERIVED: kept.pop(key, None))
    except TypeError:  # not weakly referenceable: nothing kept
        return None
    _DERIVED[key] = (ref, _UNMADE)
    return None


def conv2d_gemm(xp: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                dilations: tuple[int, int], out: tuple[int, int], activation: str | None = None, alpha: float = 0.0,
                beta: float = 0.0, group: int = 1) -> np.ndarray:
    """A 2-D convolution of the zero-padded float32 ``xp`` [N, C, HP, WP] by ``w`` [M, C / group, KH,
    KW] as an implicit GEMM: the im2col columns are gathered while packing (src/gemm.c), never
    formed, and bias and activation are applied in the GEMM's own pass; with ``group`` > 1 each
    group is a GEMM of its own, the groups of all images spread over the pool.  Returns [N, M, *out]."""
    assert _lib is not None and xp.ndim == 4 and w.ndim == 4 and group >= 1
    assert w.shape[1] * group == xp.shape[1] and w.shape[0] % group == 0
    xp = np.ascontiguousarray(xp, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    assert b is None or b.shape == (w.shape[0],)
    y = np.empty((xp.shape[0], w.shape[0]) + tuple(out), dtype=np.float32)
    if group == 1:
        geom = _geom((xp.shape[0], w.shape[0], *xp.shape[1:], *w.shape[2:], *strides, *dilations, *out))
        _check(_lib.optcli_conv2d_gemm_f32(_ptr(w), xp.ctypes.data, _ptr(b), None, y.ctypes.data,
                                           geom, ACTIVATION_CODES[activation], alpha, beta), "conv GEMM")
        return y
    geom = _geom((xp.shape[0], w.shape[0] // group, w.shape[1], *xp.shape[2:], *w.shape[2:], *strides, *dilations,
                  *out))
    _check(_lib.optcli_conv2d_gemm_grouped_f32(_ptr(w), xp.ctypes.data, _ptr(b), y.ctypes.data, geom,
                                               group, ACTIVATION_CODES[activation], alpha, beta), "grouped conv GEMM")
    return y


def activation(x: np.ndarray, name: str, alpha: float = 0.0, beta: float = 0.0,
               out: np.ndarray | None = None) -> np.ndarray:
    """The fused epilogue's activation ``name`` over a float32 array as a stand-alone op (GELU,
    sigmoid, hard-swish...), in one threaded pass; ``out=x`` works in place."""
    assert _lib is not None
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(np.shape(x))  # a 0-d x stays 0-d
    if out is None:
        out = np.empty_like(x)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == x.shape
    _check(_lib.optcli_activation_f32(x.ctypes.data, out.ctypes.data, x.size, ACTIVATION_CODES[name], alpha, beta),
           f"{name} activation")
    return out


def add(a: np.ndarray, b: np.ndarray, activation: str | None = None, alpha: float = 0.0,
        beta: float = 0.0) -> np.ndarray:
    """``act(a + b)`` of two C-contiguous float32 arrays of one shape, in one threaded pass (a
    residual Add and the Relu fused after it, where numpy takes two passes)."""
    assert _lib is not None and a.shape == b.shape and a.dtype == b.dtype == np.float32
    assert a.flags.c_contiguous and b.flags.c_contiguous
    out = np.empty_like(a)
    _check(_lib.optcli_add_f32(a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size, ACTIVATION_CODES[activation],
                               alpha, beta), "add")
    return out


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float, inner: int = 1,
               stats: bool = True) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """LayerNormalization of a C-contiguous float32 ``x`` seen as [outer, C, inner] over C (``inner``
    1: rows of C contiguous), ``scale`` and ``bias`` [C]; ``eps`` > 0.  Returns (y as x's shape,
    mean and 1 / std as float32 [outer * inner] or None without ``stats``)."""
    assert _lib is not None and x.dtype == np.float32 and x.flags.c_contiguous and eps > 0
    c = scale.size
    outer = x.size // (c * inner) if c * inner else 0
    assert outer * c * inner == x.size and (bias is None or bias.size == c)
    s = np.ascontiguousarray(scale, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    y = np.empty_like(x)
    mean = np.empty(outer * inner, np.float32) if stats else None
    inv = np.empty(outer * inner, np.float32) if stats else None
    _check(_lib.optcli_layer_norm_f32(x.ctypes.data, s.ctypes.data, _ptr(b), y.ctypes.data, _ptr(mean), _ptr(inv),
                                      outer, c, inner, eps), "layer normalization")
    return y, mean, inv


def row_mean(x: np.ndarray, n: int) -> np.ndarray:
    """The mean of each run of ``n`` floats of a C-contiguous float32 ``x`` (its trailing axes making
    ``n``): a flat float32 array of x.size // n means, summed in float32 blocks and double."""
    assert _lib is not None and x.dtype == np.float32 and x.flags.c_contiguous and n >= 1 and x.size % n == 0
    y = np.empty(x.size // n, np.float32)
    _check(_lib.optcli_row_mean_f32(x.ctypes.data, y.ctypes.data, y.size, n), "row mean")
    return y
