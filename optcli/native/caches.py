"""Small caches the native wrappers share: the data addresses of read-only arrays (``_ptr``), int64
geometry arrays (``_geom``) and what is made once from a constant weight (``derived``)."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

_CONST_ADDRS: dict[int, tuple[weakref.ref, int]] = {}  # id -> (weak reference to a read-only array, its address)
_GEOMS: dict[tuple[int, ...], np.ndarray] = {}  # geometry values -> int64 array
_CACHE_MAX = 4096
_char_at, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def _ptr(a: np.ndarray | None) -> int | None:
    """The data address of ``a`` (None for None).  Read-only arrays (a plan's weights, mapped from
    the .nb file) are looked up by identity: numpy takes ~0.8 us to answer, a few times per call of
    kernels that take ~10 us on a model's small layers.  An entry holds its array weakly (a dropped
    predictor's weights are freed) and leaves with it, so an id is never reused while cached; an
    array's data never moves.  Any other array's address comes through ctypes' buffer view of it
    (~0.9 us where ``a.ctypes.data`` builds a helper object, ~2.4 us on a busy 2-core machine):
    the native wrappers take three to a dozen addresses a call."""
    if a is None:
        return None
    key = id(a)
    hit = _CONST_ADDRS.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    try:  # a writable contiguous array (a result, a scratch buffer): ctypes reads its buffer in ~1/3 the time
        return _addressof(_char_at(a))
    except (TypeError, ValueError, BufferError):  # read-only, not contiguous, or empty
        pass
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


def _geom(values: tuple[int, ...]) -> np.ndarray:
    """An int64 array of ``values``, made once per distinct geometry (a model's layers repeat theirs
    run after run; np.array cost ~1 us a call).  The caller passes the array itself to its C call
    (``library.function`` holds it for the call): another thread's predictor may clear this cache
    in between, and an address alone would then point at freed memory (issue 23)."""
    hit = _GEOMS.get(values)
    if hit is None:
        if len(_GEOMS) >= _CACHE_MAX:
            _GEOMS.clear()
        hit = _GEOMS[values] = np.array(values, dtype=np.int64)
    return hit


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
