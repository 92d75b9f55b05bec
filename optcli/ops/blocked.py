"""The channel-blocked host layout (NCHWc): the kernels of the `arm` target's conv regions.

The host plan picks this layout for regions of convs, pools and the element-wise ops between
them (``passes/choose_host_layout.py``), the way the GPU plan picks NC4HW4: a value of logical
shape [N, C, H, W] is held as [N, ceil(C / B), H, W, B], channel c in lane c % B of block c // B.
B is the native library's vector width, chosen when the plan runs (16 with AVX-512, 8 on other
x86-64, 4 on aarch64), so a ``.nb`` stays portable; it travels with the data (a blocked array's
last dim), and only ``ToBlocked`` and the stem convs, which make blocked values from plain ones,
ask for it.  Lanes past the last channel (pad lanes) hold finite values no kernel mixes into a
real channel.  ``ToBlocked`` and ``FromBlocked`` are the conversions the pass puts at a region's
borders; nothing inside a region repacks.

Why: every lane of a vector is then a channel, so a depthwise conv is plain vector FMAs with no
stride-phase copy, and a dense conv a register tile of output-channel vectors times broadcast
inputs, with no im2col and no transpose on small planes.

Without the native library B is 1: a blocked array is its NCHW array with a trailing unit axis,
and each kernel here runs the plain kernel on that view, so a plan with blocked regions runs
unchanged, and gives the same results, where the library is absent.  With the library, whatever
its blocked kernels do not take (another dtype, a fused FakeQuant) runs the same way through
the conversions: slower, never wrong.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from optcli import native
from optcli.errors import InputError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native.stem import STEM_MAX_CHANNELS
from optcli.ops import activation as act_ops
from optcli.ops import elementwise, pool
from optcli.ops.activation import QUANT_ATTR, output_quant
from optcli.ops.conv import _bias, _window_of, conv_1x1, conv_depthwise, conv_im2col
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, shape_fn

LAYOUT = "nchwc"


# ------------------------------------------------------------------------------- the block width
_MODULES: list[tuple[Any, Any]] = []  # the imported native blocked modules, once


def _native_blocked() -> tuple[Any, Any] | None:
    """The native blocked kernels as (optcli.native.blocked_conv, optcli.native.blocked_window), each
    None where this build lacks it; None without the library (asked on every call: tests and the
    benchmark's numpy-only runs set the library aside).  Imported once: kernels ask per run."""
    if not native.available():
        return None
    if not _MODULES:
        try:
            from optcli.native import blocked_conv
        except ImportError:  # pragma: no cover - a library built before them
            blocked_conv = None
        try:
            from optcli.native import blocked_window
        except ImportError:  # pragma: no cover
            blocked_window = None
        _MODULES.append((blocked_conv, blocked_window))
    return _MODULES[0]


# Vector widths whose blocked kernels run a plan faster than the plain ones on the same views: all
# three.  With 8 (x86-64 with AVX2, no AVX-512) the dense convs with a spatial window are the
# exception (``DENSE_THROUGH_NCHW``); the blocked depthwise and pointwise convs beat the plain ones
# there (MobileNetV2 1.13x onnxruntime's time against 1.39x at 1 thread; docs/design.md).
FAST_BLOCKED_WIDTHS = (4, 8, 16)

# Widths at which a blocked region's dense convs with a spatial window (3x3, 7x7: ResNet's) run as
# the NCHW kernels between two conversions where their output rows are narrower than
# ``DIRECT_MIN_COLUMNS`` (or their input is plain): at 8 the blocked dense tile (2 output vectors x
# 6 pixels) fills rows of 14 or more pixels as well as the implicit GEMM fills its 16-column
# tiles, and needs no conversions nor padded copy (~100-150 us a conv); on ResNet's 7 x 7 planes
# its edge and remainder tiles (1 and 4 pixels) lose to the GEMM's 49 of 64 columns.
DENSE_THROUGH_NCHW = (8,)
DIRECT_MIN_COLUMNS = 14

# Grouped convs (neither one group nor depthwise) join a region where each group's input and output
# channels are a multiple of this: then at B = 4 and 8 every group is whole blocks and the blocked
# conv runs it directly (RegNetX's 8-channel groups; ``blocked_conv.grouped_fits``).  Other widths (16
# with AVX-512 for 8-channel groups) run it through the conversions, slower but right.  Without them
# RegNet's plan was cut at every grouped conv into regions of one or two convs, so it stayed NCHW:
# its 1x1 convs on the GEMM, its residual Adds as steps of their own.
GROUPED_CHANNELS = 8


def block_width() -> int:
    """B for blocked values made now: the native library's vector width where its blocked kernels
    pay (``FAST_BLOCKED_WIDTHS``), else 1 (also without the library).  ``OPTCLI_HOST_BLOCKED=1``
    forces the library's width, ``=0`` forces 1 (benchmarks, tests)."""
    mods = _native_blocked()
    if mods is None or not all(mods):
        return 1
    width = native.vector_width()
    forced = os.environ.get("OPTCLI_HOST_BLOCKED", "").strip().lower()
    if forced in ("1", "on", "yes", "true"):
        return width
    if forced in ("0", "off", "no", "false"):
        return 1
    return width if width in FAST_BLOCKED_WIDTHS else 1


# ------------------------------------------------------------------------------------ reorders
def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """[N, C, H, W] -> [N, ceil(C / B), H, W, B], pad lanes zero (a new array; B = 1 is a view)."""
    if block == 1:
        return x[..., None]
    mods = _native_blocked()
    if mods is not None and mods[0] is not None and x.dtype == np.float32 and x.ndim == 4:
        return mods[0].to_blocked(x, block)
    n, c, h, w = x.shape
    cb = -(-c // block)
    y = np.zeros((n, cb * block, h, w), x.dtype)
    y[:, :c] = x
    return np.ascontiguousarray(y.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """[N, Cb, H, W, B] -> [N, channels, H, W] (B = 1: a view)."""
    n, cb, h, w, b = x.shape
    if not (cb - 1) * b < channels <= cb * b and not (channels == 0 == cb):
        raise ValueError(f"a blocked value of {cb} blocks of {b} lanes cannot hold {channels} channels")
    if b == 1:
        return x.reshape(n, cb, h, w)
    mods = _native_blocked()
    if mods is not None and mods[0] is not None and x.dtype == np.float32 and x.flags.c_contiguous:
        return mods[0].from_blocked(x, channels)
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels])


def _all_lanes(x: np.ndarray) -> np.ndarray:
    """A blocked value as NCHW with its pad lanes as channels (element-wise and window ops run on
    them as on any channel)."""
    n, cb, h, w, b = x.shape
    return x.reshape(n, cb, h, w) if b == 1 else from_blocked(x, cb * b)


def _check_blocked(x: Any, what: str) -> None:
    if not isinstance(x, np.ndarray) or x.ndim != 5:
        raise ValueError(f"{what} expects a channel-blocked array [N, Cb, H, W, B], got "
                         f"{getattr(x, 'shape', type(x).__name__)}")


@kernel("ToBlocked", domain=OPTCLI_DOMAIN, blocked_outputs=True)
def to_blocked_kernel(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """NCHW -> the channel-blocked layout, at the border into a blocked region."""
    x = inputs[0]
    if x.ndim != 4:
        raise ValueError(f"ToBlocked expects [N, C, H, W], got shape {x.shape}")
    return [to_blocked(x, block_width())]


@kernel("FromBlocked", domain=OPTCLI_DOMAIN, blocked_inputs=(0,))
def from_blocked_kernel(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The channel-blocked layout -> NCHW, at the border out of a blocked region."""
    _check_blocked(inputs[0], "FromBlocked")
    return [from_blocked(inputs[0], int(attrs["channels"]))]


@shape_fn("ToBlocked", domain=OPTCLI_DOMAIN)
def _to_blocked_shape(args: ShapeArgs) -> list[Shape]:
    x = args.shape(0)
    if x is not None and len(x) != 4:
        raise ShapeDerivationError(f"ToBlocked takes [N, C, H, W], got rank {len(x)}")
    return [x]


@shape_fn("FromBlocked", domain=OPTCLI_DOMAIN)
def _from_blocked_shape(args: ShapeArgs) -> list[Shape]:
    """The logical shape passes through; the channel count the step names must be the one derived
    from the inputs (it sizes the plain result)."""
    x = args.shape(0)
    channels = args.attrs.get("channels")
    if x is not None and len(x) != 4:
        raise ShapeDerivationError(f"FromBlocked takes [N, C, H, W], got rank {len(x)}")
    if not isinstance(channels, int) or isinstance(channels, bool):
        raise ShapeDerivationError(f"FromBlocked needs an int attribute 'channels', got {channels!r}")
    c = fixed(x[1]) if x is not None else None
    if c is None or channels != c:
        raise ShapeDerivationError(f"FromBlocked names {channels} channels, its input has {x[1] if x else '?'}")
    return [x]



# ---------------------------------------------------------------- where the blocked kernels apply
# Asked by the layout pass (through the target: targets/arm.py) on the node and the graph's
# recorded shapes: a blocked value is a float32 image [N, C, H, W] with C fixed, so the plan
# knows how many channels to give back at the region's border.
def _image(graph: Any, name: str) -> tuple[Any, ...] | None:
    if not name or name in graph.initializers or graph.dtype_of(name) != "float32":
        return None
    shape = graph.shape_of(name)
    if shape is None or len(shape) != 4 or fixed(shape[1]) is None:
        return None
    return tuple(shape)


def _plain_epilogue(node: Any) -> bool:
    return QUANT_ATTR not in node.attrs


def applies_conv(node: Any, graph: Any) -> bool:
    x, w = _image(graph, node.input(0)), graph.const(node.input(1))
    if x is None or w is None or w.ndim != 4 or w.dtype != np.float32 or not _plain_epilogue(node):
        return False
    if node.input(2) and graph.const(node.input(2)) is None:
        return False
    group, c = int(node.attrs.get("group", 1)), x[1]
    return (group == 1 and w.shape[1] == c) or (group == c == w.shape[0] and w.shape[1] == 1) \
        or (group > 1 and w.shape[1] * group == c and w.shape[0] % group == 0
            and w.shape[1] % GROUPED_CHANNELS == 0 and w.shape[0] // group % GROUPED_CHANNELS == 0)


def applies_dense_conv(node: Any, graph: Any) -> bool:
    """A one-group conv: the one blocked kernel that also reads a plain input (a region's stem)."""
    return int(node.attrs.get("group", 1)) == 1 and applies_conv(node, graph)


def applies_window(node: Any, graph: Any) -> bool:
    """Pools: a 2-D window over an image, Y only."""
    ks = node.attrs.get("kernel_shape") or []
    return (_image(graph, node.input(0)) is not None and len(ks) == 2 and _plain_epilogue(node)
            and not any(node.outputs[1:]))


def applies_unary(node: Any, graph: Any) -> bool:
    return _image(graph, node.input(0)) is not None and _plain_epilogue(node) and \
        all(not name or name in graph.initializers for name in node.inputs[1:])


def applies_binary(node: Any, graph: Any) -> bool:
    """Two images of the same channels whose blocked arrays broadcast as the plain ones do: equal
    shapes, or one of them [N, C, 1, 1] (a squeeze-excitation scale)."""
    a, b = _image(graph, node.input(0)), _image(graph, node.input(1))
    if a is None or b is None or a[1] != b[1] or a[0] != b[0] or not _plain_epilogue(node):
        return False
    return a[2:] == b[2:] or (1, 1) in (a[2:], b[2:])


def applies_prelu(node: Any, graph: Any) -> bool:
    x, slope = _image(graph, node.input(0)), graph.const(node.input(1))
    if x is None or slope is None:
        return False
    return slope.size == 1 or (slope.size == x[1] and tuple(slope.shape) in ((x[1], 1, 1), (1, x[1], 1, 1)))


# --------------------------------------------------------------------------------------- convs
def _packed(attrs: dict[str, Any], tag: str, w: np.ndarray, block: int, make: Any) -> np.ndarray:
    """``make(w, block)`` once per bound step and weight (its memo); every call for other callers."""
    if type(attrs) is not StepAttrs:
        return make(w, block)
    hit = attrs.memo.get(tag)
    if hit is None or hit[0] is not w or hit[1] != block:
        hit = attrs.memo[tag] = (w, block, make(w, block))
    return hit[2]


def _conv_plain(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The plain (NCHW) conv variant that fits this conv's attributes."""
    w, group = inputs[1], int(attrs.get("group", 1))
    if group == 1 and w.shape[2:] == (1, 1):  # conv_1x1 hands strided or padded ones on itself
        return conv_1x1(inputs, attrs)
    if group > 1 and w.shape[1] == 1:
        return conv_depthwise(inputs, attrs)
    return conv_im2col(inputs, attrs)


def conv_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A 2-D conv (one group, depthwise, or grouped with whole blocks a group) in the blocked layout,
    bias and activation fused.
    Its input is blocked, or plain NCHW where the conv starts a region (the stems)."""
    x, w, bias = inputs[0], inputs[1], _bias(inputs)
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is not None:  # the step's native call, worked out on its first run
        hit = memo.get("nchwc call")
        if hit is not None and hit[0] is w and hit[1] is bias and hit[2] == x.shape and x.flags.c_contiguous \
                and x.dtype == np.float32 and native.available():
            return [hit[3](x)]
    plain = x.ndim == 4
    if not plain:
        _check_blocked(x, "a blocked Conv")
    group = int(attrs.get("group", 1))
    channels = w.shape[1] * group
    block = block_width() if plain else x.shape[-1]
    mods = _native_blocked()
    act = act_ops.epilogue(attrs)
    if (mods is not None and block > 1 and x.dtype == w.dtype == np.float32 and w.ndim == 4
            and output_quant(attrs) is None and (bias is None or bias.dtype == np.float32)
            and act[0] in native.ACTIVATION_CODES):
        n, h, wd = x.shape[0], x.shape[2], x.shape[3]
        if (x.shape[1] != channels) if plain else (x.shape[1] != -(-channels // block)):
            raise ValueError(f"a blocked Conv's input {x.shape} does not hold the {channels} channels of its "
                             f"weights {w.shape}")
        win = _window_of(attrs, (n, channels, h, wd), w.shape)
        geometry = (win.kernel, win.strides, win.dilations, win.pad_begin, win.out, *act)
        x = np.ascontiguousarray(x)
        b = None if bias is None else np.ascontiguousarray(bias)
        call = None
        if plain and group == 1 and channels <= STEM_MAX_CHANNELS \
                and native.stem_fits(channels, win.kernel, win.strides, win.out):
            call = _stem_then_blocked(w, b, geometry, block)
        elif group == 1 and block in DENSE_THROUGH_NCHW and tuple(w.shape[2:]) != (1, 1) \
                and (plain or win.out[1] < DIRECT_MIN_COLUMNS):
            pass  # the NCHW kernels between conversions, below
        elif group == 1 and (h, wd) == tuple(win.out) == (1, 1) and tuple(w.shape[2:]) == (1, 1) and not plain:
            call = _pointwise_gemv(w, b, x.shape, block, act)
        elif group == 1:
            packed = _packed(attrs, "nchwc conv", w, block, mods[0].pack_conv_weights)
            call = mods[0].prepared_conv2d_blocked(x.shape, packed, b, w.shape[0], *geometry)
        elif w.shape[1] == 1 and w.shape[0] == group and not plain:
            packed = _packed(attrs, "nchwc depthwise", w, block, mods[1].pack_depthwise_weights)
            call = mods[1].prepared_depthwise_conv2d_blocked(x.shape, packed, b, *geometry)
        elif mods[0].grouped_fits(w.shape[1], w.shape[0] // group, block) and w.shape[0] % group == 0:
            packed = _packed(attrs, "nchwc grouped", w, block,
                             lambda wt, blk: mods[0].pack_conv_weights(wt, blk, group))
            call = mods[0].prepared_conv2d_blocked(x.shape, packed, b, w.shape[0], *geometry, group)
        if call is not None:
            if memo is not None:
                memo["nchwc call"] = (w, bias, x.shape, call)
            return [call(x)]
    xs = x if plain else from_blocked(x, channels)
    y = _conv_plain([xs, *inputs[1:]], attrs)[0]
    return [to_blocked(y, block)]


def _pointwise_gemv(w: np.ndarray, bias: np.ndarray | None, xshape: tuple[int, ...], block: int, act: tuple):
    """A 1x1 conv of a 1x1 image (a classifier's head after the global pool: MobileNetV3's 576 ->
    1024) as the GEMM's matrix-vector product.  Such an image blocked, [N, Cb, 1, 1, B], is the
    plain [N, Cb * B] vector; W [M, C] padded with zero rows and columns to [Mb * B, Cb * B] makes
    the pad lanes of x count for nothing (they hold finite values) and writes act(0) into the
    output's.  The blocked dense tile takes one pixel there against one weight vector at a time,
    one accumulator chain: 151 us where the GEMM's dot products (gemm.c, N < NARROW_COLS) take
    ~45 (MobileNetV3-small's head, 1 thread)."""
    m, c = w.shape[:2]
    n, cb = xshape[0], xshape[1]
    mb = -(-m // block)
    wp = np.zeros((mb * block, cb * block), np.float32)
    wp[:m, :c] = w.reshape(m, c)
    bp = None
    if bias is not None:
        bp = np.zeros(mb * block, np.float32)
        bp[:m] = bias
    return native.prepared_gemm_conv(wp, bp, *act, None, n, 1, (n, mb, 1, 1, block))


def _stem_then_blocked(w: np.ndarray, bias: np.ndarray | None, geometry: tuple, block: int):
    """A region's stem (1-4 input channels, plain input): the NCHW stem conv, then the conversion.
    The blocked dense tile broadcasts each of the few inputs to only K = C * KH * KW multiply-adds
    and checks its taps at every row's edges: MobileNetV2's 3 -> 32 3x3/2 stem at 224 took 803 us
    that way, the stem conv (stem.c, 429 us) plus an in-register transposing conversion (60 us)
    about 490."""
    kernel_, strides, dilations, pad_begin, out, act, alpha, beta = geometry
    wc = np.ascontiguousarray(w, dtype=np.float32)

    def call(x: np.ndarray) -> np.ndarray:
        y = native.stem_conv2d(x, wc, bias, strides, dilations, pad_begin, out, act, alpha, beta)
        return to_blocked(y, block)

    return call


kernel("Conv", variant=LAYOUT, applies=applies_conv, priority=10, blocked_inputs=(0,),
       blocked_outputs=True)(conv_blocked)
kernel("Conv", variant=LAYOUT + "_from_nchw", applies=applies_dense_conv, priority=5,  # the stems: a plain input
       blocked_outputs=True)(conv_blocked)


# --------------------------------------------------------------------------------------- pools
def _pool_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any], op: str, plain_fn: Any) -> list[np.ndarray]:
    x = inputs[0]
    _check_blocked(x, f"a blocked {'MaxPool' if op == 'max' else 'AveragePool'}")
    mods = _native_blocked()
    n, cb, h, w, b = x.shape
    if mods is not None and b > 1 and x.dtype == np.float32 and output_quant(attrs) is None:
        win = pool._window(np.empty((0, 0, h, w), np.float32), attrs)
        if native.depthwise_fits(win.kernel, win.strides) and x.size:
            rrow = rcol = None
            if op == "avg":
                counts = pool._axis_counts(win, (h, w), bool(attrs.get("count_include_pad", 0)))
                rrow, rcol = 1.0 / counts[0], 1.0 / counts[1]
            return [mods[1].pool2d_blocked(x, op, win.kernel, win.strides, win.dilations, win.pad_begin, win.out,
                                           rrow, rcol)]
    y = plain_fn([_all_lanes(x)], attrs)[0]
    return [to_blocked(y, b)]


@kernel("MaxPool", variant=LAYOUT, applies=applies_window, blocked_inputs=(0,), blocked_outputs=True, max_outputs=1)
def max_pool_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """MaxPool in the blocked layout (Y only)."""
    return _pool_blocked(inputs, attrs, "max", pool.max_pool)


@kernel("AveragePool", variant=LAYOUT, applies=applies_window, blocked_inputs=(0,), blocked_outputs=True)
def average_pool_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """AveragePool in the blocked layout."""
    return _pool_blocked(inputs, attrs, "avg", pool.average_pool)


@kernel("GlobalAveragePool", variant=LAYOUT, applies=applies_unary, blocked_inputs=(0,), blocked_outputs=True)
def global_average_pool_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """GlobalAveragePool in the blocked layout: [N, Cb, 1, 1, B]."""
    x = inputs[0]
    _check_blocked(x, "a blocked GlobalAveragePool")
    mods = _native_blocked()
    if mods is not None and x.shape[-1] > 1 and x.dtype == np.float32 and x.size and output_quant(attrs) is None:
        return [mods[1].global_average_pool_blocked(np.ascontiguousarray(x))]
    y = pool.global_average_pool([_all_lanes(x)], attrs)[0]
    return [to_blocked(y, x.shape[-1])]


# ------------------------------------------------------------------------------ element-wise
# Lane for lane, element-wise ops do not care about the layout: their plain kernels run on the
# blocked arrays as they are.  The layout pass gives them blocked inputs only where that keeps
# the meaning: equal logical shapes, or a per-channel [N, C, 1, 1] operand (squeeze-excitation).
def _elementwise(fn: Any, blocked: tuple[int, ...]) -> Any:
    def run(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
        for k in blocked:
            _check_blocked(inputs[k], "a blocked element-wise op")
        if len(blocked) == 2:
            _check_lane_for_lane(inputs[0], inputs[1])
        return fn(inputs, attrs)

    run.__doc__ = f"{(fn.__doc__ or fn.__name__).strip().splitlines()[0]} (blocked layout: lane for lane)"
    return run


for _op, _fn in (("Add", elementwise.add), ("Mul", elementwise.mul)):
    kernel(_op, variant=LAYOUT, applies=applies_binary, blocked_inputs=(0, 1),
           blocked_outputs=True)(_elementwise(_fn, (0, 1)))
for _op, _fn in (("Relu", act_ops.relu), ("Sigmoid", act_ops.sigmoid), ("Tanh", act_ops.tanh),
                 ("LeakyRelu", act_ops.leaky_relu), ("HardSigmoid", act_ops.hard_sigmoid),
                 ("HardSwish", act_ops.hard_swish), ("Clip", act_ops.clip)):
    kernel(_op, variant=LAYOUT, applies=applies_unary, blocked_inputs=(0,),
           blocked_outputs=True)(_elementwise(_fn, (0,)))


def _check_lane_for_lane(a: np.ndarray, b: np.ndarray) -> None:
    """Two blocked operands combine lane for lane only as ``applies_binary`` allows: equal shapes, or
    one of them [N, Cb, 1, 1, B].  Anything else (a [1, 1, H, W] operand blocked: channel 0 in lane 0,
    zeros in the others) would silently give a wrong answer: refused (issue 23)."""
    if a.shape == b.shape or (a.shape[:2] == b.shape[:2] and a.shape[4] == b.shape[4]
                              and (a.shape[2:4] == (1, 1) or b.shape[2:4] == (1, 1))):
        return
    raise InputError(f"a blocked element-wise op got operands {list(a.shape)} and {list(b.shape)}, which do not "
                     "combine lane for lane; the file is corrupted or crafted")


def _blocked_slope(slope: np.ndarray, block: int) -> np.ndarray:
    """A per-channel (or single) PRelu slope as [1, Cb, 1, 1, B] (or as it is when single)."""
    if slope.size == 1:
        return slope.reshape(())
    return to_blocked(slope.reshape(1, slope.size, 1, 1), block)


@kernel("PRelu", variant=LAYOUT, applies=applies_prelu, blocked_inputs=(0,), blocked_outputs=True)
def prelu_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """PRelu with a per-channel slope in the blocked layout (the slope blocked once per step)."""
    x, slope = inputs
    _check_blocked(x, "a blocked PRelu")
    blocks, width = x.shape[1], x.shape[4]
    per_channel = slope.ndim in (3, 4) and slope.shape[-2:] == (1, 1) and (blocks - 1) * width < slope.size <= \
        blocks * width and math.prod(slope.shape[:-3]) == 1
    if slope.size != 1 and not per_channel:  # a slope along W applied per channel was wrong (issue 23)
        raise InputError(f"a blocked PRelu takes one slope or one per channel, got a slope of shape "
                         f"{list(slope.shape)} for {list(x.shape)}; the file is corrupted or crafted")
    s = _packed(attrs, "nchwc slope", slope, x.shape[-1], _blocked_slope)
    return act_ops.prelu([x, s], attrs)


# ------------------------------------------------------------------ channel concat, split, upsample
# YOLO-style nets cut their conv regions at every C2f block (a Split into halves, a Concat of the
# branches), at SPPF's Concat and at the neck's nearest 2x Resizes: nudenet's plan stayed NCHW
# (28 borders for 57 convs), and forced blocked it paid 28 conversions.  Where every channel count
# but the last is a whole number of blocks (a multiple of 16, so of every B), joining or cutting
# along the channel axis is joining or cutting whole blocks: the pad lanes stay at the end.
WHOLE_BLOCKS = 16  # channel counts the ops below need (but the last): a multiple of every block width
MAX_CONCAT_INPUTS = 256  # inputs a blocked Concat reads (blocked_inputs names each position)


def _channel_axis(node: Any, rank: int = 4) -> bool:
    axis = int(node.attrs.get("axis", 0))  # Split's default (ONNX); Concat names its axis
    return axis in (1, 1 - rank)


def applies_concat(node: Any, graph: Any) -> bool:
    """A Concat of images along channels, every input but the last a whole number of blocks (N, H and
    W must be equal for any Concat: the kernel checks them on the arrays it gets, where a dynamic
    size's symbols may be written two ways for one value)."""
    shapes = [_image(graph, name) for name in node.inputs]
    if not shapes or len(shapes) > MAX_CONCAT_INPUTS or any(s is None for s in shapes) or not _channel_axis(node):
        return False
    return all(fixed(s[1]) % WHOLE_BLOCKS == 0 for s in shapes[:-1])


@kernel("Concat", variant=LAYOUT, applies=applies_concat, blocked_inputs=tuple(range(MAX_CONCAT_INPUTS)),
        blocked_outputs=True)
def concat_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Channel Concat in the blocked layout: the inputs' blocks one after the other (the load
    checks hold ``applies_concat`` for the derived shapes: whole blocks but the last)."""
    for x in inputs:
        _check_blocked(x, "a blocked Concat")
    first = inputs[0].shape
    if any(x.shape[0] != first[0] or x.shape[2:] != first[2:] for x in inputs):
        raise InputError(f"a blocked Concat got operands {[list(x.shape) for x in inputs]}, which do not join along "
                         "channels; the file is corrupted or crafted")
    return [np.concatenate(inputs, axis=1)]


def _split_sizes(node: Any, graph: Any) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        sizes = graph.const(node.inputs[1])
        return None if sizes is None else [int(v) for v in np.asarray(sizes).reshape(-1)]
    split = node.attrs.get("split")
    return None if split is None else [int(v) for v in split]


def applies_split(node: Any, graph: Any) -> bool:
    """A Split of an image along channels into sizes it names (a constant or the attribute), each
    but the last a whole number of blocks."""
    x = _image(graph, node.input(0))
    sizes = _split_sizes(node, graph)
    if x is None or not sizes or not _channel_axis(node) or len(sizes) != len(node.outputs) \
            or not _plain_epilogue(node):
        return False
    return sum(sizes) == fixed(x[1]) and all(s > 0 for s in sizes) and all(s % WHOLE_BLOCKS == 0 for s in sizes[:-1])


@kernel("Split", variant=LAYOUT, applies=applies_split, blocked_inputs=(0,), blocked_outputs=True)
def split_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Channel Split in the blocked layout: whole blocks to each output, the last taking the rest
    (its pad lanes the input's)."""
    x = inputs[0]
    _check_blocked(x, "a blocked Split")
    raw = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("split")
    sizes = [] if raw is None else [int(v) for v in np.asarray(raw).reshape(-1)]
    width, blocks = x.shape[4], x.shape[1]
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    if not sizes or any(s <= 0 for s in sizes) or any(s % width for s in sizes[:-1]) \
            or not (blocks - 1) * width < sum(sizes) <= blocks * width:
        raise InputError(f"a blocked Split got sizes {sizes} for {blocks} blocks of {width} lanes; the file is "
                         "corrupted or crafted")
    outs = [x[:, a // width:(a + s) // width] for a, s in zip(starts[:-1], sizes[:-1])]
    outs.append(x[:, starts[-1] // width:])
    return [np.ascontiguousarray(o) for o in outs]


def applies_resize(node: Any, graph: Any) -> bool:
    """A nearest Resize of an image that copies each pixel into a whole block of pixels (an FPN's
    or a YOLO neck's 2x), scales a constant, the channels left alone."""
    from optcli.ops.resize import _repeats

    x = _image(graph, node.input(0))
    if x is None or node.op_type != "Resize" or len(node.inputs) < 3 or not node.inputs[2] \
            or (len(node.inputs) > 3 and node.inputs[3]):
        return False
    scales, roi = graph.const(node.inputs[2]), graph.const(node.inputs[1]) if node.inputs[1] else None
    if scales is None or (node.inputs[1] and roi is None):
        return False
    # a dynamic image size (a detector exported with dynamic H and W) is probed at two sizes; the
    # kernel checks the sizes it runs on and takes the general path where they do not repeat
    probes = [tuple(x)] if all(isinstance(d, int) for d in x) else [(1, 1, 8, 8), (1, 1, 13, 9)]
    try:
        found = [_repeats(p, roi, np.asarray(scales, np.float32), None, node.attrs) for p in probes]
    except Exception:  # noqa: BLE001 - the plain kernel will say what is wrong with the node
        return False
    return all(found) and all(set(r) <= {2, 3} and r == found[0] for r in found)


@kernel("Resize", variant=LAYOUT, applies=applies_resize, blocked_inputs=(0,), blocked_outputs=True)
def resize_blocked(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Nearest upsampling by whole factors in the blocked layout: each pixel's B lanes copied into
    its block of pixels."""
    from optcli.ops.resize import _repeats, resize

    x = inputs[0]
    _check_blocked(x, "a blocked Resize")
    n, cb, h, w, b = x.shape
    memo = attrs.memo if type(attrs) is StepAttrs else {}
    hit = memo.get("blocked repeats")
    if hit is None or hit[0] != x.shape or hit[1] is not inputs[2]:
        roi = inputs[1] if len(inputs) > 1 else None
        scales = inputs[2] if len(inputs) > 2 else None
        repeats = None if scales is None else _repeats((n, cb * b, h, w), roi, np.asarray(scales, np.float32), None,
                                                       attrs)
        hit = memo["blocked repeats"] = (x.shape, inputs[2], repeats)
    if not hit[2] or not set(hit[2]) <= {2, 3}:
        # not whole pixels at this size (a dynamic size the rule's probes did not cover): the plain
        # kernel on every lane, pad lanes as channels
        plain = resize([_all_lanes(x), *inputs[1:]], attrs)[0]
        return [to_blocked(plain, b)]
    rh, rw = hit[2].get(2, 1), hit[2].get(3, 1)
    y = np.broadcast_to(x[:, :, :, None, :, None, :], (n, cb, h, rh, w, rw, b))
    return [np.ascontiguousarray(y).reshape(n, cb, h * rh, w * rw, b)]
