"""GPU kernels for 1-D and 2-D Conv and ConvTranspose (``kernels/gpu/conv.cl``, ``kernels/gpu/winograd.cl``).

A 1-D convolution (``[N, C, L]`` input, ``[M, C/group, K]`` weight) is the 2-D one with a
one-row window: the packed layout stores rank 3 as ``N, C, H=1, W=L`` (``layout.dims4``), and
``_lift`` turns the node's geometry into kernel height 1, stride / dilation 1 and no padding
along H, so every kernel and every weight re-layout below sees 4-D shapes only (ConvTranspose
alike).  The 1x1, depthwise and generic variants fit 1-D convolutions; 3x3 and winograd need a
3x3 window.

Conv has five variants, each registered on its own so kernel selection can rank the ones that
fit a node by ``cost`` (MACs over an efficiency factor, plus a per-launch overhead):

* ``1x1``: pointwise, one group, no padding, stride 1 or 2; 4 channels x 4 pixels per item.
* ``depthwise``: group == C_in, any channel multiplier, any kernel / stride / pad / dilation.
* ``3x3``: direct 3x3, one group, any stride / pad / dilation, taps unrolled.
* ``winograd``: F(2x2, 3x3), stride 1, dilation 1, one group; input transform, 16 batched
  products, output transform (three launches, two scratch buffers); 2.25x fewer MACs, so it
  wins once the channel counts and the plane are large enough to repay the transforms.
* ``generic``: any 2-D conv, grouped included (each output slice reads the input slices its
  channels' groups span; weights outside a group are zero).

Weights are re-laid on the host (``ctx.weight``) into the order the kernels read: for the
direct kernels ``[O4][SPAN][KH*KW][4 input lanes]`` float4s of 4 output lanes, so one input
slice through one output slice is 4 consecutive float4s.  Bias is always bound (zeros when
absent).  Geometry (``auto_pad`` included) is resolved by ``optcli.ops.spatial``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.gpu.layout import c4, dims4, pack
from optcli.gpu.registry import Launch, common_check, epilogue_arg, epilogue_defines, gpu_kernel, input_of
from optcli.ir import Graph, Node
from optcli.ops.spatial import Window, conv_transpose_geometry, window

SOURCE = "conv.cl"
WINOGRAD = "winograd.cl"
_LAUNCH_COST = 2e4  # MAC-equivalents one launch costs (dispatch, a pass over the tiles)
_MEM_COST = 2.0  # MAC-equivalents per float written to or read from a scratch buffer


# --------------------------------------------------------------------------- shared parts
def packed_input(ctx, node, i: int):
    """Input ``i`` as a packed buffer: a runtime tensor, or a constant uploaded packed."""
    name = input_of(node, i)
    value = ctx.const(name)
    return ctx.tensor(name) if value is None else ctx.weight(f"{node.name}/in{i}", pack(value))


def _bias(ctx, node, m: int):
    b = ctx.const(input_of(node, 2))
    full = np.zeros(c4(m) * 4, np.float32)
    if b is not None:
        full[:m] = b.reshape(-1)
    return ctx.weight(f"{node.name}/b", full)


def _lift(attrs: dict, rank: int) -> dict:
    """A 1-D conv's attributes as a 2-D one's with a one-row window (H: kernel 1, stride 1,
    dilation 1, no padding, no output padding); 2-D attributes are returned unchanged."""
    if rank != 3:
        return attrs
    lifted = dict(attrs)
    for key, first in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0)):
        if attrs.get(key) is not None and len(attrs[key]):
            lifted[key] = [first, *attrs[key]]
    if attrs.get("output_shape") is not None and len(attrs["output_shape"]):
        lifted["output_shape"] = [1, attrs["output_shape"][-1]]  # ConvTranspose: its last entry is L
    if attrs.get("pads") is not None and len(attrs["pads"]):
        begin, end = list(attrs["pads"][: len(attrs["pads"]) // 2]), list(attrs["pads"][len(attrs["pads"]) // 2:])
        lifted["pads"] = [0, *begin, 0, *end]
    return lifted


def _wshape4(wshape) -> tuple[int, ...]:
    """A conv weight's shape as 4-D: [M, Cg, K] (1-D) -> [M, Cg, 1, K]."""
    ws = tuple(int(d) for d in wshape)
    return (*ws[:2], 1, ws[2]) if len(ws) == 3 else ws


def _spatial_check(node: Node, graph: Graph, what: str) -> tuple[tuple, np.ndarray] | str:
    """(input shape, constant weight) of a 1-D or 2-D (transposed) convolution, or why not."""
    reason = common_check(node, graph)
    if reason:
        return reason
    xs = tuple(graph.shape_of(node.input(0)))
    if len(xs) not in (3, 4):
        return f"only 1-D and 2-D {what}s run on the GPU (input has rank {len(xs)})"
    wname = node.input(1)
    w = graph.const(wname)
    if w is None:
        return f"weight '{wname}' is not a constant"
    if w.ndim != len(xs):
        return f"weight '{wname}' has rank {w.ndim} (a {len(xs) - 2}-D {what} takes rank {len(xs)})"
    return xs, w


def _conv_check(node: Node, graph: Graph) -> str | None:
    """What every Conv variant needs: 3-D or 4-D input, constant weight of the same rank and
    constant bias, valid groups."""
    checked = _spatial_check(node, graph, "convolution")
    if isinstance(checked, str):
        return checked
    xs, w = checked
    bname = node.input(2)
    if bname:
        b = graph.const(bname)
        if b is None:
            return f"bias '{bname}' is not a constant"
        if b.size != w.shape[0]:
            return f"bias '{bname}' has {b.size} values for {w.shape[0]} output channels"
    group = int(node.attrs.get("group", 1))
    if group < 1 or xs[1] % group or w.shape[0] % group or w.shape[1] * group != xs[1]:
        return f"group {group} does not divide {xs[1]} input / {w.shape[0]} output channels"
    try:
        _window(node.attrs, xs, w.shape)
    except (ValueError, KeyError) as exc:
        return f"bad convolution geometry: {exc}"
    return None


def _window(attrs: dict, xshape, wshape) -> Window:
    """The 2-D window of a conv (a 1-D one lifted: one row, ``_lift``); shapes as in the graph."""
    attrs = _lift(attrs, len(xshape))
    ks = attrs.get("kernel_shape") or _wshape4(wshape)[2:]
    win = window(attrs, tuple(dims4(xshape)[2:]), ks)
    if len(win.kernel) != 2:
        raise ValueError(f"kernel_shape {list(ks)} does not fit a {len(xshape) - 2}-D input")
    return win


def _dims(node, graph):
    """(4-D x shape, 4-D weight shape, window, group) for a node that passed ``_conv_check``."""
    xs = tuple(graph.shape_of(node.input(0)))
    ws = tuple(graph.const(node.input(1)).shape)
    return dims4(xs), _wshape4(ws), _window(node.attrs, xs, ws), int(node.attrs.get("group", 1))


def _launch_dims(ctx, node) -> tuple[tuple[int, ...], np.ndarray, Window, tuple[int, ...]]:
    """At load: (4-D x shape, 4-D weight, window, 4-D output shape) of a Conv step."""
    xs = tuple(ctx.shape(input_of(node, 0)))
    w = ctx.const(input_of(node, 1))
    out = dims4(ctx.shape(node.outputs[0]))
    return dims4(xs), w.reshape(_wshape4(w.shape)), _window(node.attrs, xs, w.shape), out


def _span(m: int, c: int, mg: int, cg: int) -> int:
    """Input slices one output slice reads: the slices covering its channels' groups."""
    span = 0
    for o4 in range(c4(m)):
        g0, g1 = (o4 * 4) // mg, min(o4 * 4 + 3, m - 1) // mg
        span = max(span, c4((g1 + 1) * cg) - (g0 * cg) // 4)
    return span


def _blocked_weight(w_oc_ic: np.ndarray, m: int, c: int, mg: int, cg: int, span: int) -> np.ndarray:
    """[M, C_in-of-group, K] -> [O4][SPAN][K][4 in lanes][4 out lanes], zero outside groups."""
    o4 = np.arange(c4(m))[:, None, None, None]
    s = np.arange(span)[None, :, None, None]
    il = np.arange(4)[None, None, :, None]
    lane = np.arange(4)[None, None, None, :]
    oc = o4 * 4 + lane
    g = np.minimum(oc, m - 1) // mg
    ic = ((o4 * 4) // mg * cg // 4 + s) * 4 + il - g * cg  # channel within oc's group
    valid = (oc < m) & (ic >= 0) & (ic < cg)
    out = np.where(valid[..., None], w_oc_ic[np.minimum(oc, m - 1), np.clip(ic, 0, cg - 1)], 0.0)
    return np.ascontiguousarray(out.transpose(0, 1, 4, 2, 3), dtype=np.float32)


def _padded_macs(node, graph, span: int | None = None) -> float:
    """MACs the blocked kernels really do (channels padded to 4, slices a group spans)."""
    xs, ws, win, group = _dims(node, graph)
    if span is None:
        span = _span(ws[0], xs[1], ws[0] // group, ws[1])
    return float(xs[0] * c4(ws[0]) * 4 * win.out[0] * win.out[1] * span * 4 * ws[2] * ws[3])


def _geometry_args(win: Window) -> list[int]:
    (sh, sw), (ph, pw), (dh, dw) = win.strides, win.pad_begin, win.dilations
    return [sh, sw, ph, pw, dh, dw]


# --------------------------------------------------------------------------- 1x1
def _check_1x1(node: Node, graph: Graph) -> str | None:
    reason = _conv_check(node, graph)
    if reason:
        return reason
    xs, ws, win, group = _dims(node, graph)
    if ws[2:] != (1, 1):
        return "the 1x1 kernel needs a 1x1 kernel"
    if group != 1:
        return "the 1x1 kernel needs one group"
    if any(win.pad_begin) or any(win.pad_end):
        return "the 1x1 kernel takes no padding"
    # one stride for both axes; with a single output row (1-D convs) the row stride is unused
    (sh, sw), single_row = win.strides, win.out[0] == 1
    if (sh != sw and not single_row) or sw not in (1, 2):
        return "the 1x1 kernel takes equal strides of 1 or 2"
    return None


@gpu_kernel("Conv", variant="1x1", check=_check_1x1, cost=lambda n, g: _padded_macs(n, g) / 4.0 + _LAUNCH_COST,
            priority=40)
def conv_1x1(ctx, node) -> list[Launch]:
    xs, w, win, (on, _, oh, ow) = _launch_dims(ctx, node)
    m, c = w.shape[:2]
    wb = _blocked_weight(w.reshape(m, c, 1), m, c, m, c, c4(c))
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), _bias(ctx, node, m),
            ctx.tensor(node.outputs[0]), c4(c), xs[2], xs[3], m, oh, ow, win.strides[1], epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "conv2d_1x1", args, (-(-(oh * ow) // 4), c4(m), on), epilogue_defines(node.attrs))]


# --------------------------------------------------------------------------- direct 3x3 / generic
def _check_3x3(node: Node, graph: Graph) -> str | None:
    reason = _conv_check(node, graph)
    if reason:
        return reason
    xs, ws, win, group = _dims(node, graph)
    if ws[2:] != (3, 3):
        return "the 3x3 kernel needs a 3x3 kernel"
    if group != 1:
        return "the 3x3 kernel needs one group"
    return None


@gpu_kernel("Conv", variant="3x3", check=_check_3x3, cost=lambda n, g: _padded_macs(n, g) / 3.0 + _LAUNCH_COST,
            priority=30)
def conv_3x3(ctx, node) -> list[Launch]:
    xs, w, win, (on, _, oh, ow) = _launch_dims(ctx, node)
    m, c = w.shape[:2]
    wb = _blocked_weight(w.reshape(m, c, 9), m, c, m, c, c4(c))
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), _bias(ctx, node, m),
            ctx.tensor(node.outputs[0]), c4(c), xs[2], xs[3], m, oh, ow, *_geometry_args(win), epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "conv2d_3x3", args, (-(-ow // 4), c4(m), on * oh), epilogue_defines(node.attrs))]


@gpu_kernel("Conv", variant="generic", check=_conv_check,
            cost=lambda n, g: _padded_macs(n, g) / 1.5 + _LAUNCH_COST, priority=0)
def conv_generic(ctx, node) -> list[Launch]:
    xs, w, win, (on, _, oh, ow) = _launch_dims(ctx, node)
    m, cg, kh, kw = w.shape
    group = int(node.attrs.get("group", 1))
    c, mg = xs[1], m // group
    span = _span(m, c, mg, cg)
    wb = _blocked_weight(w.reshape(m, cg, kh * kw), m, c, mg, cg, span)
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), _bias(ctx, node, m),
            ctx.tensor(node.outputs[0]), c4(c), xs[2], xs[3], m, oh, ow, kh, kw, *_geometry_args(win), span, cg, mg,
            epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "conv2d_direct", args, (-(-ow // 4), c4(m), on * oh), epilogue_defines(node.attrs))]


# --------------------------------------------------------------------------- depthwise
def _check_depthwise(node: Node, graph: Graph) -> str | None:
    reason = _conv_check(node, graph)
    if reason:
        return reason
    xs, ws, win, group = _dims(node, graph)
    if group != xs[1] or ws[1] != 1:
        return "the depthwise kernel needs group == input channels"
    return None


# MACs per cost unit of the depthwise kernel: one input float4 per tap and pixel where each output
# channel has its own input channel; with a channel multiplier (MULT > 1) four, each picked apart lane
# by lane.  An STFT front end's [402, 1, 400] conv (one input channel: "depthwise" with MULT 402)
# took 0.98 ms there against the generic kernel's 0.22 ms on an H100 (7.6 against ~3.7 ms on PoCL),
# where this cost had ranked it four times cheaper (generic: its padded MACs / 1.5).
_DEPTHWISE_RATE = {True: 2.0, False: 1.0 / 6.0}  # keyed by MULT == 1


def _cost_depthwise(node, graph) -> float:
    xs, ws, win, group = _dims(node, graph)
    macs = xs[0] * c4(ws[0]) * 4 * win.out[0] * win.out[1] * ws[2] * ws[3]
    return macs / _DEPTHWISE_RATE[ws[0] == xs[1]] + _LAUNCH_COST


@gpu_kernel("Conv", variant="depthwise", check=_check_depthwise, cost=_cost_depthwise, priority=40)
def conv_depthwise(ctx, node) -> list[Launch]:
    xs, w, win, (on, _, oh, ow) = _launch_dims(ctx, node)
    m, _, kh, kw = w.shape
    wb = np.zeros((c4(m) * 4, kh * kw), np.float32)
    wb[:m] = w.reshape(m, kh * kw)
    wb = wb.reshape(c4(m), 4, kh * kw).transpose(0, 2, 1)  # [O4][taps][4 out lanes]
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), _bias(ctx, node, m),
            ctx.tensor(node.outputs[0]), c4(xs[1]), xs[2], xs[3], m, oh, ow, kh, kw, *_geometry_args(win), m // xs[1],
            epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "conv2d_depthwise", args, (-(-ow // 4), c4(m), on * oh), epilogue_defines(node.attrs))]


# --------------------------------------------------------------------------- winograd
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def _check_winograd(node: Node, graph: Graph) -> str | None:
    reason = _check_3x3(node, graph)
    if reason:
        return reason.replace("3x3 kernel needs", "winograd kernel needs")
    xs, ws, win, group = _dims(node, graph)
    if win.strides != (1, 1) or win.dilations != (1, 1):
        return "the winograd kernel needs stride 1 and dilation 1"
    return None


def _wino_tiles(node, graph) -> tuple[int, int, int]:
    xs, ws, win, group = _dims(node, graph)
    th, tw = -(-win.out[0] // 2), -(-win.out[1] // 2)
    return th, tw, xs[0] * th * tw


def _cost_winograd(node, graph) -> float:
    xs, ws, win, group = _dims(node, graph)
    _, _, t = _wino_tiles(node, graph)
    ci, co = c4(xs[1]), c4(ws[0])
    product = 16.0 * t * co * ci * 16
    moved = 16.0 * 4 * t * (ci + co) * 2  # each scratch buffer written once and read once
    return product / 3.0 + moved * _MEM_COST + 3 * _LAUNCH_COST


@gpu_kernel("Conv", variant="winograd", check=_check_winograd, cost=_cost_winograd, priority=20)
def conv_winograd(ctx, node) -> list[Launch]:
    out = node.outputs[0]
    xs, w, win, (on, _, oh, ow) = _launch_dims(ctx, node)
    w = w.astype(np.float32)
    m, c = w.shape[:2]
    th, tw = -(-oh // 2), -(-ow // 2)
    t = on * th * tw
    ci, co = c4(c), c4(m)
    # G g G^T per (m, c) as two tensordots (one BLAS call each; a batched matmul over m*c tiny
    # matrices or an einsum costs ~10x more): it runs at every load, so it is on the warm path.
    g32 = _G.astype(np.float32)
    u = np.tensordot(np.tensordot(g32, w, axes=([1], [2])), g32, axes=([3], [1]))  # [i, m, c, j]
    u = u.transpose(0, 3, 1, 2).reshape(16, m, c)
    ub = np.zeros((16, co * 4, ci * 4), np.float32)
    ub[:, :m, :c] = u
    ub = ub.reshape(16, co, 4, ci, 4).transpose(0, 1, 3, 4, 2)  # [16][O4][C4][4 in][4 out]
    v = ctx.temp(f"{node.name}/wino_v", 16 * ci * t * 4)
    mm = ctx.temp(f"{node.name}/wino_m", 16 * co * t * 4)
    ph, pw = win.pad_begin
    defines = epilogue_defines(node.attrs)
    return [
        Launch(WINOGRAD, "winograd_input", [packed_input(ctx, node, 0), v, ci, xs[2], xs[3], ph, pw, th, tw, t],
               (t, ci),
               defines),
        Launch(WINOGRAD, "winograd_product", [v, ctx.weight(f"{node.name}/u", ub), mm, ci, co, t],
               (-(-t // 4), co, 16), defines),
        Launch(WINOGRAD, "winograd_output", [mm, _bias(ctx, node, m), ctx.tensor(out), m, oh, ow, th, tw, t,
                                             epilogue_arg(node.attrs)],
               (t, co), defines),
    ]


# --------------------------------------------------------------------------- ConvTranspose
def _check_transpose(node: Node, graph: Graph) -> str | None:
    checked = _spatial_check(node, graph, "transposed convolution")
    if isinstance(checked, str):
        return checked
    xs, w = checked
    group = int(node.attrs.get("group", 1))
    if group < 1 or xs[1] % group or w.shape[0] != xs[1]:
        return f"group {group} does not fit {xs[1]} input channels and weight {tuple(w.shape)}"
    bname = node.input(2)
    if bname and (graph.const(bname) is None or graph.const(bname).size != w.shape[1] * group):
        return f"bias '{bname}' must be a constant of {w.shape[1] * group} values"
    return None


def _cost_transpose(node, graph) -> float:
    n, c, h, w = dims4(graph.shape_of(node.input(0)))
    ws = _wshape4(graph.const(node.input(1)).shape)
    return float(n * c * h * w * ws[1] * ws[2] * ws[3]) + _LAUNCH_COST


@gpu_kernel("ConvTranspose", variant="gather", check=_check_transpose, cost=_cost_transpose)
def conv_transpose(ctx, node) -> list[Launch]:
    x, out = input_of(node, 0), node.outputs[0]
    rank = len(ctx.shape(x))
    xs = dims4(ctx.shape(x))
    w = ctx.const(input_of(node, 1))
    w = w.reshape(_wshape4(w.shape))
    c, mg, kh, kw = w.shape
    group = int(node.attrs.get("group", 1))
    cg, m = c // group, mg * group
    strides, dil, begin, _end, _out = conv_transpose_geometry(_lift(node.attrs, rank), xs[2:], (kh, kw))
    on, _, oh, ow = dims4(ctx.shape(out))
    span = _span(m, c, mg, cg)
    # ONNX [C, Mg, kh, kw] -> [M, Cg, taps], then blocked like a grouped conv's weight.
    wm = w.reshape(group, cg, mg, kh * kw).transpose(0, 2, 1, 3).reshape(m, cg, kh * kw)
    wb = _blocked_weight(wm, m, c, mg, cg, span)
    args: list[Any] = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), _bias(ctx, node, m),
                       ctx.tensor(out),
                       c4(c), xs[2], xs[3], m, oh, ow, kh, kw, strides[0], strides[1], begin[0], begin[1],
                       dil[0], dil[1], span, cg, mg, epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "conv_transpose2d", args, (ow, c4(m), on * oh), epilogue_defines(node.attrs))]
