"""Conv and ConvTranspose: numpy kernels that are both the reference and the `arm` CPU kernels.

Three Conv variants, because no single formulation is fast for every layer of a mobile net:

* ``1x1`` (pointwise, stride 1, unpadded, one group) is a single GEMM, ``W[M, C] @ X[C, H*W]``;
* ``depthwise`` (one input channel per group) has almost no reuse, so a GEMM would be a pile of
  matrix-vector products: instead it accumulates ``kh*kw`` scaled, strided views of the padded
  input, channel block by channel block so the accumulator stays in cache;
* ``im2col`` handles everything else: one strided view of the padded input gathered into a
  ``[C*kh*kw, OH*OW]`` column matrix per image, then one (grouped) BLAS matmul.

Every variant falls back to ``im2col`` when called on a node it does not fit, so a plan that
recorded a variant can never compute a wrong answer.  All of them finish with the fused
epilogue: optional bias, then ``activate``, then the fused FakeQuant if any.
ConvTranspose is the adjoint: a GEMM to columns, then a col2im scatter-add over kernel taps.

Where the native library is loaded (``optcli.native``: C, built at install), ``depthwise``
runs its fp32 2-D and 1-D cases there, bias and activation included; ``1x1`` and single-group
``im2col`` run their fp32 GEMMs in its GEMM, bias and activation applied to each register tile
before it is stored, and the other GEMM variants finish with its one-pass bias + activation.
Single-group 2-D ``im2col`` convs with few input channels (the stems of vision nets, 3 -> 16..64
channels) run in its stem conv instead, which pads the input itself and shares each input row
among all output channels: there K = C*kh*kw is too small for the GEMM's packing to pay off.  It
also takes the 3x3 convs of up to 64 channels with wide enough rows, where it measured faster
(``native.stem_fits``).
The kernel ids stay the same, so a plan runs the same way, with the same results within fp32
rounding, where the library is absent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from optcli import native
from optcli.ops.activation import activate, apply_output_quant, epilogue, output_quant
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, check_length, fixed, shape_fn
from optcli.ops.spatial import compute_dtype, conv_transpose_geometry, pad_input, prod, window, window_dims

_BLOCK_BYTES = 1 << 19  # accumulator size the depthwise kernel aims for (fits a typical L2)


# --------------------------------------------------------------------------- applies predicates
def _weight_shape(node: Any, graph: Any) -> tuple[int, ...] | None:
    name = node.input(1)
    w = graph.const(name)
    shape = tuple(w.shape) if w is not None else graph.shape_of(name)
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _is_pointwise(attrs: dict[str, Any], wshape: tuple[int, ...]) -> bool:
    ks = attrs.get("kernel_shape") or wshape[2:]
    strides = attrs.get("strides") or []
    pads = attrs.get("pads") or []
    return (
        int(attrs.get("group", 1)) == 1
        and all(int(k) == 1 for k in ks)
        and all(int(s) == 1 for s in strides)
        and all(int(p) == 0 for p in pads)
    )


def _is_depthwise(attrs: dict[str, Any], wshape: tuple[int, ...]) -> bool:
    group = int(attrs.get("group", 1))
    return group > 1 and wshape[1] == 1 and wshape[0] % group == 0


def applies_1x1(node: Any, graph: Any) -> bool:
    shape = _weight_shape(node, graph)
    return shape is not None and _is_pointwise(node.attrs, shape)


def applies_depthwise(node: Any, graph: Any) -> bool:
    shape = _weight_shape(node, graph)
    return shape is not None and _is_depthwise(node.attrs, shape)


def conv_by_shape(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Conv where no kernel selection ran: inside If/Loop/Scan bodies (``control_flow.Body``), whose
    nodes meet their weights' shapes only at run time.  The pointwise or depthwise variant where the
    weight and attributes are theirs, else im2col.  Each of those falls back to im2col itself when
    its case does not fit, so the choice is one of speed, never of results: a voice detector's
    [1, 64, 17] 1x1 Conv1d in its If took 56 us through im2col, 12 us through the 1x1 variant.
    The pointwise choice is kept in the step's memo while the same weight array comes back (a
    body's constant): the tests cost ~1 us of that Conv1d's ~3 us through the 1x1 variant."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    w = inputs[1]
    if memo is not None and memo.get("pointwise weight") is w:
        return conv_1x1(inputs, attrs)
    fast = _prepared_conv1d(attrs, inputs)
    if fast is not None:  # before the variant's tests: the call a 1-D conv's first run prepared
        return [fast(inputs[0])]
    shape = np.shape(w)
    if len(shape) >= 3 and _is_pointwise(attrs, shape):
        if memo is not None:
            memo["pointwise weight"] = w
        return conv_1x1(inputs, attrs)
    if len(shape) >= 3 and _is_depthwise(attrs, shape):
        return conv_depthwise(inputs, attrs)
    return conv_im2col(inputs, attrs)


# --------------------------------------------------------------------------------- shared parts
def _finish(
    y: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any], dtype: np.dtype
) -> list[np.ndarray]:
    """Bias along the channel axis, then the fused activation, then back to the input dtype."""
    # Below ~32K elements numpy's two passes cost less than a call into the library.
    if native.available() and y.dtype == np.float32 and y.ndim >= 2 and y.flags.c_contiguous and y.size >= 1 << 15:
        if bias is None or bias.shape == (y.shape[1],):
            y = native.bias_activation_(y, bias, *epilogue(attrs))
            return [apply_output_quant(y.astype(dtype, copy=False), attrs)]
    if bias is not None:
        y += bias.astype(y.dtype, copy=False).reshape((1, -1) + (1,) * (y.ndim - 2))
    y = activate(y, *epilogue(attrs))
    return [apply_output_quant(y.astype(dtype, copy=False), attrs)]


def _bias(inputs: list[np.ndarray | None]) -> np.ndarray | None:
    return inputs[2] if len(inputs) > 2 and inputs[2] is not None else None


# ----------------------------------------------------------------------------------- variants
def _conv1d_as_2d(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A 1-D convolution as a 2-D one of height 1 ([N, C, L] as [N, C, 1, L]), so it gets the native
    stem / implicit-GEMM kernels: the numpy im2col path cost 0.24 ms for a speech model's Conv1d of
    64 -> 96 channels over 100 frames.  The 2-D attributes and the weight's 4-D view are made once
    per bound step (the view kept while the same weight comes back, so the kernels' caches, keyed
    on the weight array, find it again)."""
    fast = _prepared_conv1d(attrs, inputs)
    if fast is not None:
        return [fast(inputs[0])]
    memo = getattr(attrs, "memo", None)
    made = memo.get("conv1d_as_2d") if memo is not None else None
    w = inputs[1]
    if made is None or made[0] is not w:
        values = dict(attrs)
        for name in ("kernel_shape", "strides", "dilations"):
            if attrs.get(name) is not None:
                values[name] = [1, *[int(v) for v in attrs[name]]]
        if attrs.get("pads") is not None:
            begin, end = [int(v) for v in attrs["pads"]]
            values["pads"] = [0, begin, 0, end]
        made = (w, w[:, :, None, :], StepAttrs(values))
        if memo is not None:
            memo["conv1d_as_2d"] = made
    x, bias = inputs[0], _bias(inputs)
    if int(attrs.get("group", 1)) == 1 and _preparable(attrs, x, w, bias) and made[1].flags.c_contiguous \
            and x.size and w.size:
        fast = _prepare_conv1d(attrs, x, w, made[1], bias, made[2])
        if fast is not None:  # the first run too: every run of the step gives the same bits
            return [fast(x)]
    y = conv_im2col([x[:, :, None, :], made[1], *inputs[2:]], made[2])[0]
    return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]


def _prepared_conv1d(attrs: dict[str, Any], inputs: list[np.ndarray | None]) -> Any:
    """The step's 1-D conv worked out once (``_prepare_conv1d``), if it applies to these inputs: the
    same weight and bias, the same input shape, a float32 array."""
    if type(attrs) is not StepAttrs:
        return None
    hit = attrs.memo.get("prepared conv1d")
    x = inputs[0]
    if hit is None or hit[0] is not inputs[1] or hit[1] is not _bias(inputs) or type(x) is not np.ndarray \
            or hit[2] != x.shape or x.dtype != np.float32 or not native.available():
        return None
    return hit[3]


def _prepare_conv1d(attrs: StepAttrs, x: np.ndarray, w: np.ndarray, w4: np.ndarray, bias: np.ndarray | None,
                    attrs2d: dict[str, Any]) -> Any:
    """Remember one group's 1-D conv for this input shape as one call, and return it (None where it
    does not apply): zero padding into a fresh [N, C, 1, L + pads] buffer, then the prepared
    implicit GEMM.  A voice detector's Conv1d layers inside an If cost 40-45 us a run through the
    2-D path's window, ``pad_input`` and the stem or GEMM's argument checks, around ~5 us of
    arithmetic (onnxruntime: 4-8 us): small layers are prepared whichever kernel the 2-D path
    would take; large ones only where it would take the implicit GEMM."""
    n, c, length = x.shape
    win = window(attrs2d, (1, length), w4.shape[2:])
    begin, end = win.pad_begin[1], win.pad_end[1]
    if win.pad_begin[0] or win.pad_end[0] or begin < 0 or end < 0 or win.out[0] != 1 or not all(win.out):
        return None  # cropping or an empty output: the general path
    if native.stem_fits(c, win.kernel, win.strides, win.out) and w.shape[0] * c * w4.shape[3] * win.out[1] > 1 << 18:
        return None  # a large layer the stem conv takes (measured faster there than the implicit GEMM)
    padded = (n, c, 1, length + begin + end)
    gemm = native.prepared_conv2d_gemm(w4, bias, padded, win.strides, win.dilations, win.out, *epilogue(attrs))
    out, inner, zeros, f32 = (n, w.shape[0], win.out[1]), slice(begin, begin + length), np.zeros, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        xp = zeros(padded, f32)
        xp[:, :, 0, inner] = x
        return gemm(xp).reshape(out)

    attrs.memo["prepared conv1d"] = (w, bias, x.shape, call)
    return call


@kernel("Conv", variant="im2col", priority=0)
def conv_im2col(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Generic convolution: gather columns with one strided view, then a grouped BLAS matmul."""
    x, w = inputs[0], inputs[1]
    if x.ndim == 3 and w.ndim == 3 and native.available():
        return _conv1d_as_2d(inputs, attrs)
    strided = _strided_pointwise(inputs, attrs) or _full_height(inputs, attrs)
    if strided is not None:
        return strided
    fast = _prepared_im2col(attrs, x, w, _bias(inputs))
    if fast is not None:
        return [fast(x)]
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    group = int(attrs.get("group", 1))
    if x.ndim == 4 and ct == np.float32 and x.size and w.size and (group == 1 or (cg > 1 and m % group == 0)):
        if native.available():
            win = _window_of(attrs, x.shape, w.shape)
            fits = (native.stem_fits(c, win.kernel, win.strides, win.out) if group == 1
                    else native.stem_fits_grouped(cg, win.kernel, win.strides))
            if fits:  # no padded copy, no im2col
                y = native.stem_conv2d(x, w, _bias(inputs), win.strides, win.dilations, win.pad_begin, win.out,
                                       *epilogue(attrs), groups=group)
                if _preparable(attrs, x, w, _bias(inputs)):
                    _prepare_stem(attrs, x, w, _bias(inputs), win, group)
                return [apply_output_quant(y.astype(x.dtype, copy=False), attrs)]
        else:
            native.note_unavailable()
    win = window(attrs, x.shape[2:], attrs.get("kernel_shape") or w.shape[2:])
    xp = pad_input(x.astype(ct, copy=False), win)
    ksize = int(np.prod(win.kernel))
    osize = int(np.prod(win.out))
    # The implicit GEMM, or numpy's im2col + BLAS below.  Below 16 output positions BLAS wins a
    # single call, but a plan step that keeps the implicit GEMM's call prepared wins where the work
    # is small (a face detector's last 3x3 conv over a 4x4 map: 97 us through numpy, 24 prepared).
    prepared_small = (group == 1 and osize < 16 and w.shape[0] * cg * ksize * osize <= 1 << 21
                      and native.available() and _preparable(attrs, x, w, _bias(inputs)))
    if x.ndim == 4 and cg and (_native_gemm(ct, osize) or prepared_small):  # the columns gathered while packing
        y = native.conv2d_gemm(xp, w.astype(ct, copy=False), _bias(inputs), win.strides, win.dilations, win.out,
                               *epilogue(attrs), group=group)
        if group == 1 and _preparable(attrs, x, w, _bias(inputs)):
            _prepare_im2col(attrs, x, w, _bias(inputs), win, xp.shape)
        return [apply_output_quant(y.astype(x.dtype, copy=False), attrs)]
    # View [N, C, *K, *O] of the padded input: tap k of output o reads xp[o*s + k*d].
    sp = xp.strides[2:]
    view = as_strided(
        xp,
        shape=(n, c) + win.kernel + win.out,
        strides=xp.strides[:2] + tuple(d * s for d, s in zip(win.dilations, sp))
        + tuple(st * s for st, s in zip(win.strides, sp)),
        writeable=False,
    )
    wg = w.astype(ct, copy=False).reshape(group, m // group, cg * ksize)
    y = np.empty((n, group, m // group, osize), dtype=ct)
    fused = group == 1 and _native_gemm(ct, osize)
    for b in range(n):  # one image at a time bounds the column buffer
        cols = view[b].reshape(group, cg * ksize, osize)
        if fused:  # bias and activation in the GEMM's own pass over y
            native.gemm_conv(wg[0], cols, _bias(inputs), *epilogue(attrs), out=y[b])
        else:
            np.matmul(wg, cols, out=y[b])
    if fused:
        return [apply_output_quant(y.reshape((n, m) + win.out).astype(x.dtype, copy=False), attrs)]
    return _finish(y.reshape((n, m) + win.out), _bias(inputs), attrs, x.dtype)


# Bound steps keep their native call worked out once (native.prepared_*) in their attrs' memo
# (StepAttrs): (weights, bias, x.shape, call), taken only while the step sees the same weights, bias
# and input shape, and an input the call can read as it is (C-contiguous float32).


def _prepared(attrs: dict[str, Any], x: Any, w: Any, bias: Any) -> Any:
    """The step's prepared native call, if it applies to this input; else None."""
    if type(attrs) is not StepAttrs or not native.available():  # the library set aside (OPTCLI_NATIVE=0, tests)
        return None
    hit = attrs.memo.get("prepared")
    if hit is None or hit[0] is not w or hit[1] is not bias or hit[2] != x.shape:
        return None
    if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    return hit[3]


def _preparable(attrs: dict[str, Any], x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> bool:
    """Whether a prepared call can stand for this step: fixed attrs, float32 weights and bias as the
    library reads them, no fused FakeQuant after the activation."""
    return (type(attrs) is StepAttrs and x.dtype == np.float32 and w.dtype == np.float32
            and w.flags.c_contiguous and (bias is None or (bias.dtype == np.float32 and bias.flags.c_contiguous))
            and output_quant(attrs) is None and native.available())


def _prepare(attrs: StepAttrs, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, call: Any,
             xshape: tuple[int, ...]) -> None:
    call.xshape = xshape  # the shape the call reads x as (a view of the same memory)
    attrs.memo["prepared"] = (w, bias, x.shape, call)


def _prepared_im2col(attrs: dict[str, Any], x: Any, w: Any, bias: Any) -> Any:
    """The step's implicit-GEMM conv worked out once (``_prepare_im2col``), if it applies to this
    input: the same weights, bias and input shape, a float32 array.  Kept under its own memo key:
    the 1x1 and depthwise variants' prepared calls take their input in another form."""
    if type(attrs) is not StepAttrs or type(x) is not np.ndarray or x.dtype != np.float32:
        return None
    hit = attrs.memo.get("prepared im2col")
    if hit is None or hit[0] is not w or hit[1] is not bias or hit[2] != x.shape or not native.available():
        return None
    return hit[3]


def _prepare_im2col(attrs: StepAttrs, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, win: Any,
                    padded: tuple[int, ...]) -> None:
    """Remember the implicit-GEMM call of this step for this input shape: the window, the padding
    and the C call's geometry, which cost ~100 us of Python a call (a speech model's Conv1d inside
    an If, run after run) around a few microseconds of arithmetic."""
    gemm = native.prepared_conv2d_gemm(w, bias, padded, win.strides, win.dilations, win.out, *epilogue(attrs))

    def call(x: np.ndarray) -> np.ndarray:
        return gemm(np.ascontiguousarray(pad_input(x, win)))

    attrs.memo["prepared im2col"] = (w, bias, x.shape, call)


def _prepare_stem(attrs: StepAttrs, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, win: Any,
                  group: int) -> None:
    """Remember the stem conv's call of this step for this input shape (under the implicit GEMM's
    memo key: both read x as it is, and the step takes one or the other)."""
    stem = native.prepared_stem_conv2d(x.shape, w, bias, win.strides, win.dilations, win.pad_begin, win.out,
                                       *epilogue(attrs), groups=group)

    def call(x: np.ndarray) -> np.ndarray:
        return stem(np.ascontiguousarray(x))

    attrs.memo["prepared im2col"] = (w, bias, x.shape, call)


def _strided_pointwise(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray] | None:
    """A 1x1 conv with strides (ResNet's and RegNet's downsampling shortcuts) as the pointwise conv
    of the subsampled input: one strided copy of a quarter of the input, then the 1x1 path (its
    transposed small-plane product, its prepared call), where the implicit GEMM gathered every
    column at the stride (3.5-4x onnxruntime's time on ResNet-18's shortcuts).  None where it
    does not apply (padding, groups, another window, not 2-D)."""
    x, w = inputs[0], inputs[1]
    strides = attrs.get("strides") or ()
    if x.ndim != 4 or w.ndim != 4 or tuple(w.shape[2:]) != (1, 1) or len(strides) != 2 \
            or all(int(s) == 1 for s in strides):
        return None
    if int(attrs.get("group", 1)) != 1 or any(int(p) for p in attrs.get("pads") or ()) \
            or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or x.dtype != np.float32:
        return None
    if type(attrs) is StepAttrs:  # the same unit-stride attrs every run: the 1x1 path prepares its call on them
        unit = attrs.memo.get("unit strides")
        if unit is None:
            unit = attrs.memo["unit strides"] = StepAttrs({**attrs, "strides": [1, 1]})
    else:
        unit = {**attrs, "strides": [1, 1]}
    sub = np.ascontiguousarray(x[:, :, ::int(strides[0]), ::int(strides[1])])
    return conv_1x1([sub, w, *inputs[2:]], unit)


def _full_height(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray] | None:
    """A conv whose window spans the input's whole height and one column (an OCR recogniser's
    [4, 1] conv that folds the last 4 rows of features into one) as the pointwise conv of the input
    seen as [N, C * H, 1, W]: a reshape, no copy, where the implicit GEMM gathered each column's
    C * H taps (~2x onnxruntime's time).  None where it does not apply (padding, groups, a wider
    window, a column stride, dilated rows, not 2-D float32)."""
    x, w = inputs[0], inputs[1]
    if x.ndim != 4 or w.ndim != 4 or w.shape[3] != 1 or w.shape[2] != x.shape[2] or x.dtype != np.float32:
        return None
    strides, dilations = attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1)
    if int(attrs.get("group", 1)) != 1 or any(int(p) for p in attrs.get("pads") or ()) or len(strides) != 2 \
            or int(strides[1]) != 1 or len(dilations) != 2 or int(dilations[0]) != 1 \
            or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or w.shape[1] != x.shape[1]:
        return None
    n, c, h, width = x.shape
    if type(attrs) is StepAttrs:  # the same weight every run: its reshaped view and the 1x1 attrs made once
        hit = attrs.memo.get("full height")
        if hit is None or hit[0] is not w:
            hit = attrs.memo["full height"] = (w, w.reshape(w.shape[0], c * h, 1, 1),
                                               StepAttrs({**attrs, "kernel_shape": [1, 1], "strides": [1, 1],
                                                          "dilations": [1, 1]}))
        w2, unit = hit[1], hit[2]
    else:
        w2, unit = w.reshape(w.shape[0], c * h, 1, 1), {**attrs, "kernel_shape": [1, 1], "strides": [1, 1],
                                                      "dilations": [1, 1]}
    return conv_1x1([np.ascontiguousarray(x).reshape(n, c * h, 1, width), w2, *inputs[2:]], unit)


def _native_gemm(ct: np.dtype, columns: int, narrow: bool = False) -> bool:
    """Whether a GEMM conv runs in the native GEMM: fp32 with 16 or more output positions per
    image (its register tiles are 8 to 32 columns wide), or, with ``narrow`` (a plain [K, N]
    product: the 1x1 convs), any number: fewer than 16 columns take the native dot-product path
    (squeeze-excitation blocks, conv heads on [1, C, 1, 1]), where BLAS would leave its threads
    spinning into the next layers, stealing the cores from the native pool."""
    if not native.available():
        native.note_unavailable()
        return False
    return ct == np.float32 and (columns >= 16 or narrow)


@kernel("Conv", variant="1x1", applies=applies_1x1, priority=20)
def conv_1x1(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Pointwise convolution (1x1 kernel, stride 1, no padding, one group): a single GEMM."""
    x, w = inputs[0], inputs[1]
    if type(x) is np.ndarray and not x.flags.c_contiguous:  # a transposed view: the GEMM's reshape copies
        x = np.ascontiguousarray(x)                          # it anyway, and contiguous takes the prepared call
        inputs = [x, *inputs[1:]]
    fast = _prepared(attrs, x, w, _bias(inputs))
    if fast is not None:
        return [fast(x.reshape(fast.xshape))]
    if x.ndim < 3 or not _is_pointwise(attrs, w.shape):
        return conv_im2col(inputs, attrs)
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    m = w.shape[0]
    xr = x.astype(ct, copy=False).reshape(n, c, prod(x.shape[2:]))  # not -1: ambiguous for N = 0
    wr = w.astype(ct, copy=False).reshape(m, c)
    if c and _native_gemm(ct, xr.shape[2], narrow=True):  # bias and activation in the GEMM's own pass over y
        # small planes (7x7, 14x14) run transposed on W.T's panels, packed once per weight
        panels = native.derived(w, "conv.panels", lambda _: native.pack_panels(wr)) \
            if 16 <= xr.shape[2] <= 256 else None
        bias = _bias(inputs)
        y = native.gemm_conv(wr, xr, bias, *epilogue(attrs), panels=panels)
        if _preparable(attrs, x, w, bias):
            call = native.prepared_gemm_conv(wr, bias, *epilogue(attrs), panels, n, xr.shape[2], (n, m) + x.shape[2:])
            _prepare(attrs, x, w, bias, call, xr.shape)
        return [apply_output_quant(y.reshape((n, m) + x.shape[2:]).astype(x.dtype, copy=False), attrs)]
    y = np.matmul(wr, xr[0])[None] if n == 1 else np.matmul(wr, xr)
    return _finish(y.reshape((n, m) + x.shape[2:]), _bias(inputs), attrs, x.dtype)


def _phases(x: np.ndarray, begin: tuple[int, ...], padded: list[int], strides: tuple[int, ...],
            keys: set[tuple[int, ...]]) -> tuple[dict[tuple[int, ...], np.ndarray], list[int]]:
    """Zero-padded input split by stride phase, each flattened to [N, C, Q].

    Phase ``a`` holds padded positions ``a + r*s``; with unit strides there is a single phase,
    the padded input itself.  One extra leading-axis row lets every tap read a contiguous run
    of ``O0 * prod(Q[1:])`` elements (see ``conv_depthwise``).
    """
    q = [-(-p // s) for p, s in zip(padded, strides)]
    spatial = x.shape[2:]
    out = {}
    for key in keys:
        buf = np.zeros(x.shape[:2] + (q[0] + 1,) + tuple(q[1:]), dtype=x.dtype)
        dst, src = [], []
        for a, s, b, n, qq in zip(key, strides, begin, spatial, q):
            lo = max(0, -(-(b - a) // s))  # first r with a + r*s - b >= 0
            hi = min(qq, (b - a + n - 1) // s + 1)
            dst.append(slice(lo, max(lo, hi)))
            src.append(slice(a + lo * s - b, a + (hi - 1) * s - b + 1 if hi > lo else 0, s))
        buf[(slice(None), slice(None)) + tuple(dst)] = x[(slice(None), slice(None)) + tuple(src)]
        out[key] = buf.reshape(x.shape[0], x.shape[1], prod(buf.shape[2:]))
    return out, q


@kernel("Conv", variant="depthwise", applies=applies_depthwise, priority=10)
def conv_depthwise(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise convolution: sum of kh*kw scaled shifted copies, without any im2col buffer.

    The padded input is split by stride phase so that every tap, for every output position,
    reads one contiguous run of the flattened phase (output rows are computed "wide", with
    ``Q[-1]`` columns, and cropped at the end).  Each tap is then one multiply and one add over
    contiguous memory, done a cache-sized block of channels at a time.
    """
    x, w = inputs[0], inputs[1]
    fast = _prepared(attrs, x, w, _bias(inputs))
    if fast is not None:
        return [fast(x)]
    group = int(attrs.get("group", 1))
    if x.ndim < 3 or not _is_depthwise(attrs, w.shape) or x.shape[1] != group:
        return conv_im2col(inputs, attrs)
    ct = compute_dtype(x.dtype)
    if x.ndim <= 4 and ct == np.float32 and x.size:
        if native.available():
            win = _window_of(attrs, x.shape, w.shape)
            if native.depthwise_fits(win.kernel, win.strides):
                return _native_depthwise(x, w, _bias(inputs), attrs, win)
        else:
            native.note_unavailable()
    n, c = x.shape[:2]
    mult = w.shape[0] // c
    win = window(attrs, x.shape[2:], attrs.get("kernel_shape") or w.shape[2:])
    xc = x.astype(ct, copy=False)
    begin = win.pad_begin
    if any(p < 0 for p in win.pad_begin + win.pad_end):  # negative pads crop: materialise them
        xc, begin = pad_input(xc, win), (0,) * len(begin)
    padded = [i + b + e for i, b, e in zip(x.shape[2:], win.pad_begin, win.pad_end)]
    s, d = win.strides, win.dilations
    taps = list(win.taps())
    keys = [tuple((t * dd) % ss for t, dd, ss in zip(tap, d, s)) for tap in taps]
    phases, q = _phases(xc, begin, padded, s, set(keys))
    row = [int(np.prod(q[k + 1:])) for k in range(len(q))]
    offsets = [sum(((t * dd) // ss) * r for t, dd, ss, r in zip(tap, d, s, row)) for tap in taps]
    length = win.out[0] * row[0]
    # Weights as [C, mult, taps]; output as [N, C, mult, L] (channel c*mult + j, as ONNX orders them).
    wr = w.astype(ct, copy=False).reshape(c, mult, len(taps), 1)
    y = np.empty((n, c, mult, length), dtype=ct)
    block = max(1, min(c, _BLOCK_BYTES // max(1, mult * length * ct.itemsize)))
    tmp = np.empty((block, mult, length), dtype=ct)
    for b in range(n):
        for c0 in range(0, c, block):
            c1 = min(c, c0 + block)
            yb, tb = y[b, c0:c1], tmp[: c1 - c0]
            for i, (key, off) in enumerate(zip(keys, offsets)):
                src = phases[key][b, c0:c1, None, off:off + length]
                if i == 0:
                    np.multiply(src, wr[c0:c1, :, i], out=yb)
                else:
                    np.multiply(src, wr[c0:c1, :, i], out=tb)
                    yb += tb
    # Epilogue on the wide rows, then crop them: [N, C*mult, O0, Q1, ...] -> [N, C*mult, *O].
    y = _finish(y.reshape((n, c * mult, win.out[0]) + tuple(q[1:])), _bias(inputs), attrs, ct)[0]
    y = y[(slice(None), slice(None), slice(None)) + tuple(slice(0, o) for o in win.out[1:])]
    return [np.ascontiguousarray(y, dtype=x.dtype)]


_GEOMETRY_ATTRS = ("kernel_shape", "strides", "dilations", "pads", "auto_pad")
_WINDOWS: dict[tuple, Any] = {}  # resolved windows of the native path, by shapes and geometry attributes


def _window_of(attrs: dict[str, Any], xshape: tuple[int, ...], wshape: tuple[int, ...]) -> Any:
    """``window()`` for a conv, memoised: resolving it costs more than a small native call.

    A bound step's fixed attrs (``StepAttrs``) keep it in their memo; other callers' dicts may
    change between calls, so theirs is found by the geometry attributes' values."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is not None:
        win = memo.get(("window", xshape, wshape))
        if win is not None:
            return win
    key = (xshape, wshape) + tuple(tuple(v) if isinstance(v, (list, tuple, np.ndarray)) else v
                                   for v in (attrs.get(k) for k in _GEOMETRY_ATTRS))
    win = _WINDOWS.get(key)
    if win is None:
        if len(_WINDOWS) >= 1024:
            _WINDOWS.clear()
        win = _WINDOWS[key] = window(attrs, xshape[2:], attrs.get("kernel_shape") or wshape[2:])
    if memo is not None:
        if len(memo) >= 64:  # a step fed ever new input shapes (dynamic dims): keep the memo small
            memo.clear()
        memo[("window", xshape, wshape)] = win
    return win


def _native_depthwise(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any],
                      win: Any) -> list[np.ndarray]:
    """The depthwise conv in the native library: 2-D as it is, 1-D as 2-D with a one-row window."""
    lift = x.ndim == 3
    if lift:
        x, w = x[:, :, None, :], w[:, :, None, :]
    one = (1,) if lift else ()
    strides, dil = one + win.strides, one + win.dilations
    begin, out = (0,) * lift + win.pad_begin, one + win.out
    y = native.depthwise_conv2d(x, w, bias, strides, dil, begin, out, *epilogue(attrs))
    if not lift and _preparable(attrs, x, w, bias):
        call = native.prepared_depthwise_conv2d(x.shape, w, bias, strides, dil, begin, out, *epilogue(attrs))
        _prepare(attrs, x, w, bias, call, x.shape)
    if lift:
        y = y.reshape(y.shape[:2] + win.out)
    return [apply_output_quant(y.astype(x.dtype, copy=False), attrs)]


# ------------------------------------------------------------------------------ ConvTranspose
def taps_never_overlap(kshape: tuple[int, ...], strides: list[int], dilations: list[int]) -> bool:
    """Whether each output position of a ConvTranspose gets exactly one tap (kernel == stride,
    no dilation): a 2x2 stride-2 upsampling head, written without a zeroed buffer to add into."""
    return tuple(kshape) == tuple(strides) and all(d == 1 for d in dilations)


@kernel("ConvTranspose", variant="col2im")
def conv_transpose(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Transposed convolution: ``W^T @ X`` to columns, then scatter-add the kernel taps."""
    x, w = inputs[0], inputs[1]
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    nsp = len(spatial)
    group = int(attrs.get("group", 1))
    cg, mg = c // group, w.shape[1]
    kshape = tuple(int(k) for k in (attrs.get("kernel_shape") or w.shape[2:]))
    strides, dil, begin, _end, out = conv_transpose_geometry(attrs, spatial, kshape)
    ksize = int(np.prod(kshape))
    isize = int(np.prod(spatial))
    # cols[n, g, (mg, *K), S] = W_g^T @ X_g
    wg = w.astype(ct, copy=False).reshape(group, cg, mg * ksize).transpose(0, 2, 1)
    xg = x.astype(ct, copy=False).reshape(n, group, cg, isize)
    if group == 1 and ct == np.float32 and native.available() and x.size and w.size:
        # the native GEMM, not BLAS (whose spinning threads then slow the native steps after it)
        cols = native.gemm_conv(wg[0], xg.reshape(n, cg, isize))
    else:
        cols = np.matmul(wg[None], xg)
    # Full (unpadded, unclipped) output: tap k of input i lands at i*s + k*d.
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, spatial, kshape, dil)]
    if nsp == 2 and group == 1 and ct == np.float32 and cols.dtype == np.float32 and native.available() and x.size \
            and tuple(strides) == kshape and all(d == 1 for d in dil) and all(b == 0 for b in begin) \
            and tuple(out) == tuple(full) and output_quant(attrs) is None:
        # taps side by side (a 2x2 / 2 upsampling head): each output row written once, bias and
        # activation with it (upsample.c), where the strided writes below cost 2x onnxruntime's time
        y = native.transpose_conv_taps(cols.reshape(n, mg * ksize, isize), _bias(inputs), n, mg, *spatial, *kshape,
                                       *epilogue(attrs))
        return [y.astype(x.dtype, copy=False)]
    cols = cols.reshape((n, group * mg) + kshape + tuple(spatial))
    if taps_never_overlap(kshape, strides, dil):
        # Taps that never overlap (a 2x2 stride-2 upsampling head): each lands on its own
        # positions, written once through a strided view, where zeroing a buffer and adding each
        # tap into it read and wrote the whole output once per tap.
        buf = np.empty((n, group * mg) + tuple(v for i, k in zip(spatial, kshape) for v in (i, k)), dtype=ct)
        for tap in np.ndindex(*kshape):
            dst = tuple(v for t in tap for v in (slice(None), t))
            buf[(slice(None), slice(None)) + dst] = cols[(slice(None), slice(None)) + tap]
        buf = buf.reshape((n, group * mg) + tuple(full))
    else:
        buf = np.zeros((n, group * mg) + tuple(full), dtype=ct)
        for tap in np.ndindex(*kshape):
            dst = tuple(
                slice(t * d, t * d + s * (i - 1) + 1, s) for t, d, s, i in zip(tap, dil, strides, spatial)
            )
            buf[(slice(None), slice(None)) + dst] += cols[(slice(None), slice(None)) + tap]
    # Output position o reads buf[o + pad_begin]; anything outside buf (output_padding,
    # negative pads) is zero.
    if all(b == 0 for b in begin) and tuple(out) == tuple(full):
        return _finish(buf, _bias(inputs), attrs, x.dtype)  # no crop, no padding: buf is the output
    y = np.zeros((n, group * mg) + tuple(out), dtype=ct)
    src, dst = [], []
    for b, o, f in zip(begin, out, full):
        lo, hi = max(0, -b), min(o, f - b)
        if hi <= lo:
            return _finish(y, _bias(inputs), attrs, x.dtype)
        dst.append(slice(lo, hi))
        src.append(slice(lo + b, hi + b))
    assert len(src) == nsp
    y[(slice(None), slice(None)) + tuple(dst)] = buf[(slice(None), slice(None)) + tuple(src)]
    return _finish(y, _bias(inputs), attrs, x.dtype)


# ----------------------------------------------------------------------------- shape functions

def conv_shape(args: ShapeArgs, x_at: int = 0, w_at: int = 1, b_at: int = 2, transpose: bool = False) -> list[Shape]:
    """Conv's (``transpose``: ConvTranspose's) output shape, and the checks its kernels rely on:
    input channels against the weight and group, output channels split into groups, the bias
    length (shared with QLinearConv and ConvInteger, whose operands sit at other positions)."""
    x, w = args.shape(x_at), args.shape(w_at)
    group = int(args.attrs.get("group", 1) or 1)
    if group < 1:
        raise ShapeDerivationError(f"group {group} is not positive")
    if x is not None and len(x) < 3:
        raise ShapeDerivationError(f"the input has rank {len(x)}; it needs a batch, channel and spatial axis")
    if x is not None and w is not None and len(x) != len(w):
        raise ShapeDerivationError(f"input rank {len(x)} differs from the weight's {len(w)}")
    rank = len(x) if x is not None else (len(w) if w is not None else None)
    if rank is None:
        return [None]
    w = w if w is not None else (None,) * rank
    x = x if x is not None else (None,) * rank
    c, w0, w1 = fixed(x[1]), fixed(w[0]), fixed(w[1])
    expected = (None if w1 is None else w1 * group) if not transpose else w0
    if c is not None and expected is not None and c != expected:
        raise ShapeDerivationError(f"the input has {c} channels, the weight takes {expected} (group {group})")
    if w0 is not None and w0 % group:
        what = "input" if transpose else "output"
        raise ShapeDerivationError(f"{w0} {what} channels do not split into {group} groups")
    outs = (None if w1 is None else w1 * group) if transpose else w0
    check_length(args, b_at, outs, "the bias")
    kernel = args.attrs.get("kernel_shape") or w[2:]
    if len(kernel) != rank - 2:
        raise ShapeDerivationError(f"kernel_shape {list(kernel)} has {len(kernel)} dims for {rank - 2} spatial axes")
    for k, wk in zip(kernel, w[2:]):
        if fixed(k) is not None and fixed(wk) is not None and fixed(k) != fixed(wk):
            # The kernels size their windows from one and read the weight by the other (issue 23).
            raise ShapeDerivationError(f"kernel_shape {list(kernel)} does not match the weight's spatial dims "
                                       f"{list(w[2:])}")
    try:
        spatial = window_dims(args.attrs, x[2:], [fixed(k) for k in kernel], transpose=transpose)
    except ValueError as exc:
        raise ShapeDerivationError(str(exc)) from None
    if outs is None:
        outs = w[0] if not transpose else (w[1] if group == 1 else None)
    return [(x[0], outs, *spatial)]


@shape_fn("Conv")
def _conv_shape(args: ShapeArgs) -> list[Shape]:
    return conv_shape(args)


@shape_fn("ConvTranspose")
def _conv_transpose_shape(args: ShapeArgs) -> list[Shape]:
    return conv_shape(args, transpose=True)
