"""Resize (opset 10-19) and Upsample (opset 7/9) as separable per-axis interpolation.

Every Resize mode is separable: resizing an N-D tensor is a 1-D resize along each resized axis
in turn.  Along one axis the output is ``sum_t take(x, idx[:, t]) * w[:, t]`` with a small
``[out, taps]`` table of source indices and weights computed once from the coordinate
transformation (nearest: 1 tap, linear: 2, cubic: 4, antialiased: wider), so the data is
touched a handful of times per axis with no per-pixel Python.  The index and weight tables
follow the ONNX reference implementation exactly (including its tie-breaking), which is what
the ONNX backend tests check.

Resize-10 and Upsample use the pre-11 semantics: ``asymmetric`` coordinates and onnxruntime's
"simple" nearest rounding (floor when upsampling, ceil when downsampling).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, norm_axis, shape_fn


def _str(attrs: dict[str, Any], name: str, default: str) -> str:
    v = attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else (v or default)


def _source_coords(mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float] | None
                   ) -> np.ndarray:
    """Source coordinate of every output index along one axis (ONNX coordinate transformations).

    Computed in float32, as onnxruntime does: nearest-neighbour rounding of near-ties (and so
    which pixel is picked) depends on it.
    """
    f = np.float32
    y = np.arange(out_len, dtype=f)
    scale = f(scale)
    out_w = scale * f(in_len)  # ONNX uses the non-integral resized length in these formulas
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_w)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    if mode == "align_corners":
        return np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi if roi is not None else (0.0, 1.0)
        if out_w == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        else:
            x = y * (end - start) * (in_len - 1) / (out_w - 1)
        return x + start * (in_len - 1)
    raise ValueError(f"unknown coordinate_transformation_mode '{mode}'")


def _nearest_index(x: np.ndarray, mode: str, scale: float) -> np.ndarray:
    if mode == "round_prefer_floor":
        idx = np.ceil(x - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(x + 0.5)
    elif mode == "floor":
        idx = np.floor(x)
    elif mode == "ceil":
        idx = np.ceil(x)
    elif mode == "simple":  # Resize-10 / Upsample, as onnxruntime does it
        idx = np.ceil(x) if scale < 1 else np.floor(x)
    else:
        raise ValueError(f"unknown nearest_mode '{mode}'")
    return idx.astype(np.int64)


def _coeffs(mode: str, ratio: np.ndarray, scale: float, a: float, antialias: bool) -> tuple[np.ndarray, int]:
    """Per-output interpolation weights [out, taps] for a fractional offset ``ratio`` in (0, 1]."""
    r = ratio[:, None]
    if mode == "linear":
        if not antialias:
            return np.concatenate([1 - r, r], axis=1), 2
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start)[None, :] - r) * s
        w = np.clip(1 - np.abs(args), 0, 1)
    else:  # cubic
        if not antialias:
            d = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)
        else:
            s = min(scale, 1.0)
            start = int(np.floor(-2 / s) + 1)
            d = s * (np.arange(start, 2 - start)[None, :] - r)
        d = np.abs(d)
        w = np.where(
            d <= 1,
            ((a + 2) * d - (a + 3)) * d * d + 1,
            np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
        )
        if not antialias:
            return w, 4
    return w / w.sum(axis=1, keepdims=True), w.shape[1]


def _nearest_source(in_len: int, out_len: int, scale: float, roi: tuple[float, float] | None,
                    attrs: dict[str, Any], legacy: bool) -> np.ndarray:
    """The input index each output index of one axis copies, in mode 'nearest'."""
    ctm = "asymmetric" if legacy else _str(attrs, "coordinate_transformation_mode", "half_pixel")
    src = _source_coords(ctm, out_len, in_len, scale, roi)
    nmode = "simple" if legacy else _str(attrs, "nearest_mode", "round_prefer_floor")
    return np.clip(_nearest_index(src, nmode, scale), 0, in_len - 1)


def _repeat_factor(idx: np.ndarray, in_len: int) -> int:
    """k where ``idx`` is every input index k times in order (an integer upscale: the FPN's 2x, 4x
    and 8x nearest Upsamples, whatever coordinate mode gives it), else 0."""
    out_len = len(idx)
    if in_len == 0 or out_len % in_len:
        return 0
    k = out_len // in_len
    return k if np.array_equal(idx, np.arange(out_len) // k) else 0


def _nearest_by_repeats(x: np.ndarray, repeats: dict[int, int]) -> np.ndarray:
    """x with axis a repeated repeats[a] times, where a take per axis made a full gathered copy
    each (6x onnxruntime's time on an FPN's upsamples).  The last axis by stacking k copies (its
    elements interleaved: 29 us where np.repeat took 66 and a broadcast into [..., W, k] 182 on a
    [1, 16, 40, 40] map), every other axis by one broadcast copy into the output seen as
    [..., d_a, k, rest], whose inner runs are whole rows.  A float32 image upscaled along its rows and
    columns only takes the native kernel (upsample.c): each output row made once, the copies of
    it memcpys, 2.5x faster than the two numpy copies on an FPN's maps."""
    if x.ndim == 4 and x.dtype == np.float32 and x.size and not any(repeats.get(a, 1) > 1 for a in (0, 1)) \
            and native.available():
        return native.upsample_nearest(x, repeats.get(2, 1), repeats.get(3, 1))
    y, last = x, x.ndim - 1
    if repeats.get(last, 1) > 1:
        k = repeats[last]
        y = np.stack([y] * k, axis=-1).reshape(y.shape[:-1] + (y.shape[-1] * k,))
    for a in sorted(a for a, k in repeats.items() if k > 1 and a != last):
        k = repeats[a]
        out = np.empty(y.shape[:a] + (y.shape[a] * k,) + y.shape[a + 1:], dtype=y.dtype)
        out.reshape(y.shape[:a + 1] + (k,) + y.shape[a + 1:])[...] = np.expand_dims(y, a + 1)
        y = out
    return y if y is not x else y.copy()


def _resize_axis(x: np.ndarray, axis: int, out_len: int, scale: float, roi: tuple[float, float] | None,
                 attrs: dict[str, Any], legacy: bool) -> np.ndarray:
    in_len = x.shape[axis]
    mode = _str(attrs, "mode", "nearest")
    ctm = "asymmetric" if legacy else _str(attrs, "coordinate_transformation_mode", "half_pixel")
    src = _source_coords(ctm, out_len, in_len, scale, roi)
    bshape = (out_len,) + (1,) * (x.ndim - axis - 1)
    if mode == "nearest":
        y = np.take(x, _nearest_source(in_len, out_len, scale, roi, attrs, legacy), axis=axis)
    else:
        if mode not in ("linear", "cubic", "bilinear"):
            raise ValueError(f"unknown Resize mode '{mode}'")
        mode = "linear" if mode == "bilinear" else mode
        antialias = bool(int(attrs.get("antialias", 0)))
        base = np.floor(src)
        ratio = np.where(src == base, 1.0, src - base)
        w, n = _coeffs(mode, ratio, scale, float(attrs.get("cubic_coeff_a", -0.75)), antialias)
        # The n source taps nearest to src (ties to the left), as the ONNX reference picks them.
        pad = -(-n // 2)
        xp = src + pad
        p = np.floor(xp)
        frac = xp - p
        if n % 2 == 0:
            off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
        idx = (p + off).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
        if int(attrs.get("exclude_outside", 0)):
            w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        idx = np.clip(idx, 0, in_len - 1)
        ct = x.dtype
        wt = w.astype(ct)
        y = np.take(x, idx[:, 0], axis=axis) * wt[:, 0].reshape(bshape)
        for t in range(1, n):
            y += np.take(x, idx[:, t], axis=axis) * wt[:, t].reshape(bshape)
    if ctm == "tf_crop_and_resize":
        outside = (src < 0) | (src > in_len - 1)
        if outside.any():
            y = np.where(outside.reshape(bshape), y.dtype.type(attrs.get("extrapolation_value", 0.0)), y)
    return y


def _geometry(shape: tuple[int, ...], roi: np.ndarray | None, scales: np.ndarray | None,
              sizes: np.ndarray | None, attrs: dict[str, Any]) -> tuple[list[int], list[float], dict, str, list[int]]:
    """(output dims, per-axis factors, per-axis roi, coordinate mode, the axes that change)."""
    if int(attrs.get("antialias", 0)) and _str(attrs, "mode", "nearest") == "nearest":
        raise NotImplementedError("Resize: antialias is undefined for mode 'nearest'")
    r = len(shape)
    axes = [int(a) + r if int(a) < 0 else int(a) for a in (attrs.get("axes") or range(r))]
    shape = list(shape)
    factors = [1.0] * r
    out = list(shape)
    if sizes is not None and sizes.size:
        for a, s in zip(axes, sizes.tolist()):
            out[a] = int(s)
            factors[a] = out[a] / shape[a] if shape[a] else 1.0  # an empty axis stays empty
        policy = _str(attrs, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(factors[a] for a in axes)
            for a in axes:
                factors[a] = scale
                out[a] = int(scale * shape[a] + 0.5)
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.astype(np.float64).tolist()):
            factors[a] = s
            out[a] = int(np.floor(s * shape[a]))
    else:
        raise ValueError("Resize needs either scales or sizes")
    rois: dict[int, tuple[float, float]] = {}
    ctm = _str(attrs, "coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_crop_and_resize" and roi is not None and roi.size:
        vals = roi.astype(np.float64).tolist()
        k = len(vals) // 2
        names = axes if k == len(axes) else list(range(r))
        rois = {a: (vals[i], vals[k + i]) for i, a in enumerate(names)}
    changed = [a for a in axes if not (out[a] == shape[a] and factors[a] == 1.0 and rois.get(a) in (None, (0.0, 1.0)))]
    return out, factors, rois, ctm, changed


def _repeats(shape: tuple[int, ...], roi: np.ndarray | None, scales: np.ndarray | None, sizes: np.ndarray | None,
             attrs: dict[str, Any], legacy: bool = False) -> dict[int, int] | None:
    """{axis: k} where this nearest Resize copies each input index k times along every axis it
    changes (an integer upscale, in whatever coordinate and rounding mode gives that), else None."""
    if _str(attrs, "mode", "nearest") != "nearest":
        return None
    out, factors, rois, ctm, changed = _geometry(shape, roi, scales, sizes, attrs)
    if not changed or ctm == "tf_crop_and_resize":  # the latter may extrapolate
        return None
    repeats = {a: _repeat_factor(_nearest_source(shape[a], out[a], factors[a], rois.get(a), attrs, legacy), shape[a])
               for a in changed}
    return repeats if all(repeats.values()) else None


def _resize(x: np.ndarray, roi: np.ndarray | None, scales: np.ndarray | None, sizes: np.ndarray | None,
            attrs: dict[str, Any], legacy: bool, repeats: dict[int, int] | None) -> np.ndarray:
    """The resized x; ``repeats`` is ``_repeats`` for these arguments (worked out by the caller,
    which may have it remembered)."""
    if repeats:
        return _nearest_by_repeats(x, repeats)
    out, factors, rois, ctm, changed = _geometry(x.shape, roi, scales, sizes, attrs)
    ct = x.dtype if x.dtype.kind == "f" and x.dtype != np.float16 else np.dtype(np.float32)
    y = x if _str(attrs, "mode", "nearest") == "nearest" else x.astype(ct, copy=False)
    for a in changed:
        y = _resize_axis(y, a, out[a], factors[a], rois.get(a), attrs, legacy)
    if y.dtype != x.dtype:
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            y = np.clip(np.rint(y), info.min, info.max)
        y = y.astype(x.dtype)
    return np.ascontiguousarray(y) if y is not x else y.copy()


def _opt(inputs: list[np.ndarray | None], i: int) -> np.ndarray | None:
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


@kernel("Resize")
def resize(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Resize: inputs (X, roi, scales, sizes); opset 10's (X, scales) form is recognised too."""
    x = inputs[0]
    legacy = int(attrs.get("_opset", 11)) < 11 or len(inputs) == 2
    args = (None, np.asarray(inputs[1]), None) if legacy else (_opt(inputs, 1), _opt(inputs, 2), _opt(inputs, 3))
    return [_resize(x, *args, attrs, legacy, _memo_repeats(attrs, inputs, args, legacy))]


def _memo_repeats(attrs: dict[str, Any], inputs: list[np.ndarray | None], args: tuple, legacy: bool):
    """``_repeats`` for these inputs; a plan step remembers it for the input shape and the scales /
    sizes / roi it last saw (working it out took ~25 us a call, half of the copy)."""
    x = inputs[0]
    if type(attrs) is not StepAttrs or type(x) is not np.ndarray:
        return _repeats(x.shape, *args, attrs, legacy)
    key = (x.shape,) + tuple(None if a is None else (np.asarray(a).dtype.str, np.asarray(a).tobytes())
                             for a in inputs[1:])
    hit = attrs.memo.get("nearest repeats")
    if hit is None or hit[0] != key:
        hit = attrs.memo["nearest repeats"] = (key, _repeats(x.shape, *args, attrs, legacy))
    return hit[1]


@kernel("Upsample")
def upsample(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Upsample (deprecated): scales from the input (opset 9) or the attribute (opset 7)."""
    scales = _opt(inputs, 1)
    if scales is None:
        scales = np.asarray(attrs["scales"], dtype=np.float32)
    x, scales = inputs[0], np.asarray(scales)
    return [_resize(x, None, scales, None, attrs, True, _repeats(x.shape, None, scales, None, attrs, legacy=True))]


# ----------------------------------------------------------------------------- shape functions

def _resized(x: Shape, attrs: dict[str, Any], scales: list[float] | None, sizes: list[int] | None) -> Shape:
    """``_resize``'s output shape: sizes win over scales; a dim stays unknown where its input dim is
    (scales, a keep-aspect-ratio policy) or where neither is known."""
    if x is None:
        return None
    r = len(x)
    axes = [norm_axis(int(a), r, "Resize axis") for a in (attrs.get("axes") or range(r))]
    out = list(x)
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ShapeDerivationError(f"{len(sizes)} sizes for {len(axes)} axes")
        if _str(attrs, "keep_aspect_ratio_policy", "stretch") != "stretch":
            dims = [fixed(x[a]) for a in axes]
            if None in dims:
                return tuple(None if a in axes else d for a, d in enumerate(x))
            pick = min if _str(attrs, "keep_aspect_ratio_policy", "stretch") == "not_larger" else max
            scale = pick(s / d if d else 1.0 for s, d in zip(sizes, dims))
            for a, d in zip(axes, dims):
                out[a] = int(scale * d + 0.5)
        else:
            for a, s in zip(axes, sizes):
                out[a] = int(s)
    elif scales is not None:
        if len(scales) != len(axes):
            raise ShapeDerivationError(f"{len(scales)} scales for {len(axes)} axes")
        for a, s in zip(axes, scales):
            d = fixed(x[a])
            out[a] = (x[a] if s == 1.0 else None) if d is None else int(np.floor(s * d))
    else:
        return _unknown_sizes(x, attrs)
    if any(isinstance(d, int) and d < 0 for d in out):
        raise ShapeDerivationError(f"the output would have a negative dim {out}")
    return tuple(out)


def _unknown_sizes(x: Shape, attrs: dict[str, Any]) -> Shape:
    """Scales or sizes of unknown value: the resized axes are unknown, the others keep their dims."""
    if x is None:
        return None
    axes = {norm_axis(int(a), len(x), "Resize axis") for a in (attrs.get("axes") or range(len(x)))}
    return tuple(None if a in axes else d for a, d in enumerate(x))


def _floats(v: np.ndarray | None) -> list[float] | None:
    return None if v is None else np.asarray(v).astype(np.float32).astype(np.float64).reshape(-1).tolist()


@shape_fn("Resize")
def _resize_shape(args: ShapeArgs) -> list[Shape]:
    """Inputs (X, roi, scales, sizes), or opset 10's (X, scales).  An empty scales or sizes input
    counts as absent, as in the kernel; a given one of unknown value leaves the dims unknown."""
    x = args.shape(0)
    if args.opset < 11 or len(args.shapes) == 2:
        scales = args.value(1)
        return [_resized(x, args.attrs, _floats(scales), None) if scales is not None else _unknown_sizes(x, args.attrs)]

    def empty(k: int) -> bool:
        s = args.shape(k)
        return not args.has(k) or (s is not None and 0 in s)

    if not empty(3):
        sizes = args.ints(3)
        return [_resized(x, args.attrs, None, sizes) if sizes is not None else _unknown_sizes(x, args.attrs)]
    if not empty(2):
        scales = args.value(2)
        return [_resized(x, args.attrs, _floats(scales), None) if scales is not None else _unknown_sizes(x, args.attrs)]
    raise ShapeDerivationError("Resize needs either scales or sizes")


@shape_fn("Upsample")
def _upsample_shape(args: ShapeArgs) -> list[Shape]:
    scales = args.value(1) if args.has(1) else args.attrs.get("scales")
    if scales is None:
        return [_unknown_sizes(args.shape(0), {})]
    return [_resized(args.shape(0), {}, _floats(np.asarray(scales)), None)]
