"""The native host kernels' library: a small C library (``kernels/host``) built by ``pip install``
when a C compiler is present, loaded here once with ctypes, with its ABI table, its thread pool's
size and the error its wrappers raise.

The library has no Python API, only a C ABI: ctypes releases the GIL around each call, and the
library splits the work over its own pthread pool (never OpenMP, which fights OpenBLAS), sized
by ``optcli.load(..., threads=N)`` through threadpoolctl like the BLAS threads are.

The library is optional.  Where it was not built (no compiler at install), failed to load, or is
turned off with ``OPTCLI_NATIVE=0``, the numpy kernels run instead and compute the same results;
``status()`` says which, and the first kernel that would have used it logs that once.  Kernels
keep their ids either way, so a ``.nb`` never depends on whether this library exists.

A testing hook: ``OPTCLI_NATIVE_LIBRARY=/path/to/_optcli_native_x.so`` loads that file instead of
the packaged one (``tools/sanitize_native.sh`` uses it for an ASan/UBSan build of the same
sources).  It is checked like the packaged one (every symbol of the ABI table, the ABI number),
its name must start with ``_optcli_native`` so threadpoolctl still finds and sizes its pool, and
``OPTCLI_NATIVE=0`` still wins over it.  A path that does not exist is not silently replaced by
the packaged library: the numpy kernels run and ``status()`` says why.

``_lib`` (the ctypes handle, None without the library) lives here only: the wrappers (window.py,
stem.py, gemm.py, epilogue.py, elementwise.py, blocked_*.py) read ``library._lib`` when called, so
setting it aside here (as the tests do) sets it aside for every kernel.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

import numpy as np

LOG = logging.getLogger("optcli")

ABI = 26  # OPTCLI_NATIVE_ABI in kernels/host/optcli_native.h
LIB_PREFIX = "_optcli_native"  # the extension's file name starts with this (threadpoolctl matches it)
LIBRARY_ENV = "OPTCLI_NATIVE_LIBRARY"  # a testing hook: load this file instead (sanitizer builds)


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
    "optcli_stem_conv2d_grouped_f32": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                        ctypes.c_float], ctypes.c_int),
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
    "optcli_channel_prelu_f32": ([_vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64],
                                 ctypes.c_int),
    "optcli_activation_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_add_f32": ([_vp, _vp, _vp, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_add_period_f32": ([_vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                               ctypes.c_float], ctypes.c_int),
    "optcli_fc_rows_f32": ([_vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                            ctypes.c_float, ctypes.c_float], ctypes.c_int),
    "optcli_softmax_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
    "optcli_softmax_mid_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
    "optcli_fc_f32": ([_vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                       ctypes.c_float, ctypes.c_float, _vp, ctypes.c_int64], ctypes.c_int),
    "optcli_fc_pack_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64], ctypes.c_int64),
    "optcli_layer_norm_f32": ([_vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_float], ctypes.c_int),
    "optcli_f32_to_f16": ([_vp, _vp, ctypes.c_int64], ctypes.c_int),
    "optcli_f16_to_f32": ([_vp, _vp, ctypes.c_int64], ctypes.c_int),
    "optcli_row_mean_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
    "optcli_upsample_taps_f32": ([_vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_float, ctypes.c_float], ctypes.c_int),
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
    "optcli_recurrent_f32": ([ctypes.c_int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                              _vp, _vp, ctypes.c_float, ctypes.c_int], ctypes.c_int),
    "optcli_recurrent_split_from": ([ctypes.c_int64], ctypes.c_int64),  # tests only
    "optcli_dynamic_quantize_f32": ([_vp, ctypes.c_int64, _vp, _vp], ctypes.c_int),
    "optcli_recurrent_lanes": ([ctypes.c_int], ctypes.c_int),  # tests only
    "optcli_dynamic_qrows_f32": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qconv2d_gemm": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qconv2d_depthwise": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qconv2d_pointwise": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qconv2d_dense": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qmatmul_rows": ([_vp, _vp, _vp, _vp, _vp, _vp, _vp], ctypes.c_int),
    "optcli_qgemm_variant": ([ctypes.c_int], ctypes.c_int),  # tests only
    "optcli_maxpool2d_q8": ([_vp, _vp, _vp, ctypes.c_int], ctypes.c_int),
    "optcli_qadd": ([_vp, _vp, _vp, ctypes.c_int64, _vp, _vp], ctypes.c_int),
    "optcli_quantize_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_float],
                            ctypes.c_int),
    "optcli_dequantize_f32": ([_vp, _vp, ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_int32], ctypes.c_int),
    "optcli_lookup_u8": ([_vp, _vp, ctypes.c_int64, _vp], ctypes.c_int),
    "optcli_lookup_variant": ([ctypes.c_int], ctypes.c_int),  # tests only
    "optcli_qmul_rows": ([_vp, _vp, _vp, ctypes.c_int64, ctypes.c_int64, _vp, _vp], ctypes.c_int),
    "optcli_qgap_rows": ([_vp, _vp, ctypes.c_int64, ctypes.c_int64, _vp, _vp], ctypes.c_int),
}


def library_path() -> Path | None:
    """The library to load: ``$OPTCLI_NATIVE_LIBRARY`` where set, else the built library beside this
    file (``_optcli_native*.so`` from setup.py), if any."""
    override = os.environ.get(LIBRARY_ENV, "").strip()
    if override:
        return Path(override).resolve()
    here = Path(__file__).resolve().parent
    found = sorted(p for p in here.glob(LIB_PREFIX + "*") if p.suffix in (".so", ".dylib", ".pyd", ".dll"))
    return found[0] if found else None


def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("OPTCLI_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by OPTCLI_NATIVE=0: the numpy kernels run"
    path = library_path()
    if os.environ.get(LIBRARY_ENV, "").strip():  # the testing hook: never the packaged library in its place
        if not path.is_file():
            return None, f"{LIBRARY_ENV}={path} does not exist: the numpy kernels run"
        if not path.name.startswith(LIB_PREFIX):  # threadpoolctl would not find it to size its pool
            return None, f"{LIBRARY_ENV}={path}: the file name must start with {LIB_PREFIX}: the numpy kernels run"
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
    """One line: where the native host kernels come from (and how they are called), or why the numpy
    kernels run."""
    return f"native host kernels: {_why}" + (f"; {fastcall_status()}" if _lib is not None else "")


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


_LETTERS = {ctypes.c_void_p: "p", _i64p: "p", ctypes.c_int64: "q", ctypes.c_int: "i", ctypes.c_int32: "i",
            ctypes.c_float: "f"}  # a parameter's ctypes type -> its letter in a _fastcall signature


def _load_fastcall() -> tuple[object | None, str]:
    """The fast call path (kernels/host/fastcall.c, a Python extension built beside the library),
    or None and why not: a Python without its headers builds the library but not this."""
    if os.environ.get("OPTCLI_FASTCALL", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by OPTCLI_FASTCALL=0: native calls go through ctypes"
    try:
        import optcli.native._fastcall as _fastcall  # (an extension: it imports nothing of ours)
    except ImportError as exc:
        return None, f"not built ({exc}): native calls go through ctypes (~2-3 us more a call)"
    return _fastcall, "native calls through optcli.native._fastcall"


_fastcall, _fastcall_why = _load_fastcall()
_FUNCTIONS: dict[str, tuple[object, Any]] = {}  # C function name -> (the library it came from, its caller)


def function(name: str) -> Any:
    """The library's C function ``name`` as a Python callable taking the C parameters in order: a
    pointer as None, an int address or a C-contiguous array (its data, kept alive for the call),
    integers and floats as Python numbers.  Through ``_fastcall`` where it was built (~1.1 us a
    call of ten arguments, four of them arrays, into a near-empty C function, where ctypes took
    3.4-3.6 us: a small model's layers take a few microseconds of arithmetic), else
    ctypes with the same arguments.  Made once per function and library (tests set ``_lib``
    aside or swap it; the entry notices)."""
    lib = _lib
    require(lib is not None, name)
    hit = _FUNCTIONS.get(name)
    if hit is not None and hit[0] is lib:
        return hit[1]
    fn = getattr(lib, name)
    sig = "".join(_LETTERS[t] for t in _SIGNATURES[name][0])
    call = None
    if _fastcall is not None and _SIGNATURES[name][1] is ctypes.c_int and sig in _fastcall.signatures():
        call = _fastcall.Caller(ctypes.cast(fn, ctypes.c_void_p).value, sig, name)
    if call is None:
        call = _ctypes_caller(fn, sig)
    _FUNCTIONS[name] = (lib, call)
    return call


def _ctypes_caller(fn: Any, sig: str) -> Any:
    """``fn`` (a ctypes function) taking arrays for its pointer parameters, as a _fastcall Caller does:
    each array's address is read per call (``caches._ptr``), a non-contiguous array refused."""
    from optcli.native.caches import _ptr

    slots = tuple(k for k, letter in enumerate(sig) if letter == "p")
    ndarray = np.ndarray

    def call(*args):
        args = list(args)
        for k in slots:
            a = args[k]
            if type(a) is ndarray:
                if not a.flags.c_contiguous:
                    raise TypeError(f"{fn.__name__}: argument {k} must be None, an address or a C-contiguous array")
                args[k] = _ptr(a)
        return fn(*args)

    return call


def fastcall_status() -> str:
    """How the native functions are called: through ``_fastcall``, or ctypes and why."""
    return _fastcall_why


class NativeError(RuntimeError):
    """The library refused its arguments (a bug on our side: callers check shapes first)."""


def require(condition: bool, what: str) -> None:
    """A guard the C code's memory safety rests on (shapes, dtypes, contiguity, the library being
    there): unlike an ``assert`` it holds under ``python -O`` (issue 23)."""
    if not condition:
        raise NativeError(f"native {what}: arguments the kernel cannot take safely (shape, dtype or layout); "
                          "callers check these first, so this is a bug in optcli")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise NativeError(f"native {what} failed with code {rc}" + (" (out of memory)" if rc == -2 else ""))
