"""Keep freed activation memory in the process instead of handing it back to the kernel.

The host kernels allocate each activation afresh (numpy arrays of 100 KB to a few MB) and the
executor drops it after its last reader.  glibc serves such sizes with ``mmap`` (or gives the top
of the heap back with ``brk``), so the next run touches new pages: a page fault per 4 KB, each
a few microseconds in a VM.  On the mediapipe face detector (0.9 ms in onnxruntime) the faults
were 13% of a run's profile, and its runs came out either 2.2 or 2.6 ms depending on where the
allocator's adaptive threshold had settled.  Raising the mmap threshold to its maximum (32 MB)
and the trim threshold well above a model's activations keeps the freed blocks for the next
run, as onnxruntime's own arena does: 2.2 ms every time, and no change on models where the
threshold already sat high.

This sets glibc's allocator for the whole process, once, when the first plan with host steps is
loaded; ``OPTCLI_MALLOC_TUNING=0`` leaves the allocator alone.  Elsewhere (musl, macOS) it does
nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit machines
TRIM_THRESHOLD = 512 << 20

_lock = threading.Lock()
_state: str | None = None  # None: not tried yet; else what happened, for status()


def keep_freed_memory() -> str:
    """Tune glibc's malloc thresholds once per process; returns what was done (for messages)."""
    global _state
    with _lock:
        if _state is None:
            _state = _tune()
        return _state


def _tune() -> str:
    if os.environ.get("OPTCLI_MALLOC_TUNING", "1").strip() == "0":
        return "left alone (OPTCLI_MALLOC_TUNING=0)"
    if not sys.platform.startswith("linux"):
        return "left alone (not glibc)"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        gnu_get_libc_version = libc.gnu_get_libc_version  # only glibc has it: musl's mallopt ignores these
    except (OSError, AttributeError):
        return "left alone (not glibc)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    gnu_get_libc_version.restype = ctypes.c_char_p
    version = gnu_get_libc_version().decode()
    return f"glibc {version}: freed blocks kept" if ok else f"glibc {version} refused the thresholds"
