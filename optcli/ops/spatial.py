"""Padding and output-size arithmetic shared by the Conv, ConvTranspose and pooling kernels.

ONNX spells the same windowed-op geometry in several ways (explicit ``pads``, ``auto_pad``
SAME_UPPER / SAME_LOWER / VALID, ``ceil_mode``, dilations).  Resolving them in one place keeps
the kernels about data movement only, and keeps Conv and the pools agreeing on edge cases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class WindowDoesNotFit(ValueError):
    """A Conv or pooling window larger than its (padded) input: the input's fault when it happens
    at run time (the executor says so with exit 2), as onnxruntime's "Invalid input shape"."""


def _ints(value: Any, n: int, default: int) -> list[int]:
    """An int-list attribute of length ``n`` (absent or empty -> ``default`` repeated)."""
    if value is None or len(value) == 0:
        return [default] * n
    return [int(v) for v in value]


def _auto_pad(attrs: dict[str, Any]) -> str:
    pad = attrs.get("auto_pad", "NOTSET")
    if isinstance(pad, bytes):
        pad = pad.decode()
    return pad or "NOTSET"


@dataclass(frozen=True)
class Window:
    """Resolved geometry of a sliding-window op over the spatial axes.

    ``pad_begin``/``pad_end`` are the padding the kernel must materialise so that every window
    lies inside the padded input (for ``ceil_mode`` this may exceed the declared pads; the
    declared end pads are kept in ``declared_end`` for AveragePool's divisor).
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    out: tuple[int, ...]
    declared_end: tuple[int, ...]

    @property
    def extent(self) -> tuple[int, ...]:
        """Span of one (dilated) window along each axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    def taps(self) -> Iterator[tuple[int, ...]]:
        """Every kernel tap index (kh, kw, ...), in C order."""
        return itertools.product(*(range(k) for k in self.kernel))

    def tap_slices(self, tap: Sequence[int]) -> tuple[slice, ...]:
        """Slices of the padded input read by one kernel tap, one per spatial axis."""
        return tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s)
            for t, d, s, o in zip(tap, self.dilations, self.strides, self.out)
        )


def window(
    attrs: dict[str, Any],
    spatial: Sequence[int],
    kernel: Sequence[int] | None = None,
    ceil_mode: bool = False,
) -> Window:
    """Resolve the window geometry of Conv / pooling ``attrs`` on input spatial shape ``spatial``.

    ``kernel`` overrides ``kernel_shape`` (Conv infers it from the weight).  Output sizes follow
    the ONNX formulas; with ``ceil_mode`` a last window that would start inside the end padding
    is dropped, as onnxruntime and PyTorch do.
    """
    n = len(spatial)
    ks = [int(k) for k in (kernel if kernel is not None else attrs["kernel_shape"])]
    strides = _ints(attrs.get("strides"), n, 1)
    dil = _ints(attrs.get("dilations"), n, 1)
    auto = _auto_pad(attrs)
    extent = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, extent, spatial)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
        out = [(i - e) // s + 1 for i, e, s in zip(spatial, extent, strides)]
    elif auto == "NOTSET":
        pads = _ints(attrs.get("pads"), 2 * n, 0)
        begin, end = pads[:n], pads[n:]
        out = []
        for i, b, e_, ext, s in zip(spatial, begin, end, extent, strides):
            span = i + b + e_ - ext
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= i + b:
                o -= 1
            out.append(o)
    else:
        raise ValueError(f"unknown auto_pad '{auto}'")
    if any(o <= 0 for o in out):
        raise WindowDoesNotFit(
            f"window {ks} (strides {strides}, dilations {dil}) does not fit input {tuple(spatial)}"
        )
    # Materialised end padding: enough for the last window (ceil_mode may need more).
    need_end = [max(e_, (o - 1) * s + ext - i - b) for o, s, ext, i, b, e_ in
                zip(out, strides, extent, spatial, begin, end)]
    return Window(
        tuple(ks), tuple(strides), tuple(dil), tuple(begin), tuple(need_end), tuple(out), tuple(end)
    )


def pad_input(x: np.ndarray, win: Window, value: float = 0.0) -> np.ndarray:
    """``x`` (N, C, *spatial) padded on the spatial axes as ``win`` needs (no copy when none)."""
    if not any(win.pad_begin) and not any(win.pad_end):
        return x
    n = x.ndim - 2
    # Negative pads (legal in ONNX) crop instead.
    crop = tuple(
        slice(max(0, -b), x.shape[2 + i] - max(0, -e))
        for i, (b, e) in enumerate(zip(win.pad_begin, win.pad_end))
    )
    src = x[(slice(None), slice(None)) + crop]
    begin = [max(0, b) for b in win.pad_begin]
    shape = x.shape[:2] + tuple(src.shape[2 + i] + begin[i] + max(0, win.pad_end[i]) for i in range(n))
    out = np.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + src.shape[2 + i]) for i, b in enumerate(begin))] = src
    return out


def conv_transpose_geometry(
    attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pad_begin, pad_end, output spatial shape) of a ConvTranspose.

    Follows the ONNX spec: explicit ``output_shape`` (or SAME auto_pad) determines the pads,
    splitting the total with the odd pixel at the end for SAME_UPPER and at the start otherwise.
    """
    n = len(spatial)
    strides = _ints(attrs.get("strides"), n, 1)
    dil = _ints(attrs.get("dilations"), n, 1)
    outpad = _ints(attrs.get("output_padding"), n, 0)
    auto = _auto_pad(attrs)
    full = [
        s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, spatial, outpad, kernel, dil)
    ]
    out_shape = attrs.get("output_shape")
    if out_shape is not None and len(out_shape) > 0:
        out = [int(v) for v in out_shape][-n:]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [i * s for i, s in zip(spatial, strides)]
    else:
        out = None
    if out is not None:
        total = [f - o for f, o in zip(full, out)]
        if auto == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    else:
        pads = [0] * (2 * n) if auto == "VALID" else _ints(attrs.get("pads"), 2 * n, 0)
        begin, end = pads[:n], pads[n:]
        out = [f - b - e for f, b, e in zip(full, begin, end)]
    return strides, dil, begin, end, out


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to do arithmetic in: BLAS has no float16, so half precision goes through float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


def _axis_attrs(attrs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """``attrs`` of a windowed op restricted to spatial axis ``i`` of ``n`` (one-axis geometry)."""
    one = dict(attrs)
    for name in ("kernel_shape", "strides", "dilations", "output_padding"):
        if attrs.get(name) is not None and len(attrs[name]) == n:
            one[name] = [attrs[name][i]]
    pads = attrs.get("pads")
    if pads is not None and len(pads) == 2 * n:
        one["pads"] = [pads[i], pads[n + i]]
    out_shape = attrs.get("output_shape")
    if out_shape is not None and len(out_shape) >= n:
        one["output_shape"] = [list(out_shape)[-n:][i]]
    return one


def window_dims(attrs: dict[str, Any], spatial: Sequence[Any], kernel: Sequence[Any],
                ceil_mode: bool = False, transpose: bool = False) -> list[Any]:
    """Output spatial dims of a Conv / pool (``transpose``: ConvTranspose) whose input dims may be
    symbols or None: each fixed axis goes through the kernels' own geometry (``window``,
    ``conv_transpose_geometry``) on its own, the others are None.  Raises ValueError where the
    window does not fit."""
    n = len(spatial)
    attr_len = [len(attrs[k]) for k in ("strides", "dilations") if attrs.get(k) is not None and len(attrs[k])]
    if len(kernel) != n or any(m != n for m in attr_len) or (attrs.get("pads") and len(attrs["pads"]) != 2 * n):
        raise ValueError(f"the window's attributes do not have {n} spatial axes")
    if all(isinstance(d, (int, np.integer)) for d in (*spatial, *kernel)):  # the usual case: all axes at once
        spatial, kernel = [int(d) for d in spatial], [int(k) for k in kernel]
        if transpose:
            return [int(o) for o in conv_transpose_geometry(attrs, spatial, kernel)[4]]
        return [int(o) for o in window(attrs, spatial, kernel, ceil_mode).out]
    out = []
    for i, (d, k) in enumerate(zip(spatial, kernel)):
        if not isinstance(d, (int, np.integer)) or not isinstance(k, (int, np.integer)):
            out.append(None)
            continue
        one = _axis_attrs(attrs, i, n)
        if transpose:
            out.append(int(conv_transpose_geometry(one, [int(d)], [int(k)])[4][0]))
        else:
            out.append(int(window(one, [int(d)], [int(k)], ceil_mode).out[0]))
    return out
