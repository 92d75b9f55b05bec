"""GPU kernels for matrix products with a constant right operand (Gemm, MatMul, the fused
FullyConnected) and per-channel affine maps (BatchNormalization, the fused ChannelAffine), in
``kernels/gpu/gemm.cl``.

The packed layout decides the kernel: a left operand of rank <= 2 (``[M, K]`` -> N=M, C=K) has
the reduction along the channel slices, so ``gemm_rows`` puts output columns in the float4
lanes (weight ``[N4][K4][4 k lanes]`` float4s of 4 columns); a rank-3/4 left operand keeps its
last axis in W, so ``gemm_lanes`` puts 4 rows (channels) in the lanes and reads a plain
``[K][N4*4]`` weight.  Gemm's ``alpha``, ``transB`` and ``beta * C`` are folded into the weight
and bias on the host; BatchNormalization is folded into one scale and shift.
"""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import c4, dims4, packed_elements
from optcli.gpu.ops_conv import packed_input
from optcli.gpu.registry import Launch, common_check, epilogue_arg, epilogue_defines, gpu_kernel, input_of
from optcli.ir import OPTCLI_DOMAIN, Graph, Node

SOURCE = "gemm.cl"
_LAUNCH_COST = 2e4


def _pad(v: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(c4(n) * 4, np.float32)
    out[:n] = np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (n,))
    return out


def _matmul_launches(ctx, node, w: np.ndarray, bias: np.ndarray) -> list[Launch]:
    """``x @ w + bias`` then the node's epilogue; ``w`` is [K, N] float, ``bias`` [N]."""
    x, out = input_of(node, 0), node.outputs[0]
    xs = ctx.shape(x)
    k, n = w.shape
    defines = epilogue_defines(node.attrs)
    b = ctx.weight(f"{node.name}/b", _pad(bias, n))
    if len(xs) <= 2:
        m = dims4(xs)[0]
        wp = np.zeros((c4(k) * 4, c4(n) * 4), np.float32)
        wp[:k, :n] = w
        wb = wp.reshape(c4(k), 4, c4(n), 4).transpose(2, 0, 1, 3)  # [N4][K4][4 k][4 n]
        args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wb), b, ctx.tensor(out), m, c4(k), n,
                epilogue_arg(node.attrs)]
        return [Launch(SOURCE, "gemm_rows", args, (-(-m // 4), c4(n)), defines)]
    bn, c, h, _ = dims4(xs)
    wp = np.zeros((k, c4(n) * 4), np.float32)
    wp[:, :n] = w
    rows = bn * c4(c) * h
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/w", wp), b, ctx.tensor(out), k, n, c, h, rows,
            epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "gemm_lanes", args, (-(-n // 4), rows), defines)]


def _right_check(node: Node, graph: Graph) -> str | None:
    """A constant 2-D right operand matching the left operand's last axis (rank 1-4)."""
    reason = common_check(node, graph)
    if reason:
        return reason
    w = graph.const(node.input(1))
    if w is None:
        return f"right operand '{node.input(1)}' is not a constant"
    if w.ndim != 2:
        return f"right operand '{node.input(1)}' has rank {w.ndim} (the GPU kernel takes a 2-D matrix)"
    xs = graph.shape_of(node.input(0))
    if len(xs) < 1:
        return "left operand is a scalar"
    return None


def _cost(node: Node, graph: Graph) -> float:
    xs = graph.shape_of(node.input(0))
    w = graph.const(node.input(1))
    rows = int(np.prod(xs[:-1])) if len(xs) > 1 else 1
    return rows * float(w.size) / 3.0 + _LAUNCH_COST


# --------------------------------------------------------------------------- MatMul, FullyConnected
def _check_matmul(node: Node, graph: Graph) -> str | None:
    reason = _right_check(node, graph)
    if reason:
        return reason
    xs, w = graph.shape_of(node.input(0)), graph.const(node.input(1))
    if xs[-1] != w.shape[0]:
        return f"left operand's last axis {xs[-1]} does not match the right operand {tuple(w.shape)}"
    return None


@gpu_kernel("MatMul", check=_check_matmul, cost=_cost)
def matmul(ctx, node) -> list[Launch]:
    w = ctx.const(input_of(node, 1)).astype(np.float32)
    return _matmul_launches(ctx, node, w, np.zeros(w.shape[1], np.float32))


def _check_fc(node: Node, graph: Graph) -> str | None:
    reason = _check_matmul(node, graph)
    if reason:
        return reason
    bname = node.input(2)
    if bname:
        b = graph.const(bname)
        n = graph.const(node.input(1)).shape[1]
        if b is None:
            return f"bias '{bname}' is not a constant"
        if b.size not in (1, n) or (b.ndim and b.shape[-1] != b.size) or b.ndim > len(graph.shape_of(node.input(0))):
            return f"bias '{bname}' of shape {tuple(b.shape)} is not a per-column vector of {n}"
    return None


@gpu_kernel("FullyConnected", domain=OPTCLI_DOMAIN, check=_check_fc, cost=_cost)
def fully_connected(ctx, node) -> list[Launch]:
    w = ctx.const(input_of(node, 1)).astype(np.float32)
    b = ctx.const(input_of(node, 2))
    return _matmul_launches(ctx, node, w, np.zeros(w.shape[1], np.float32) if b is None else b)


# --------------------------------------------------------------------------- Gemm
def _check_gemm(node: Node, graph: Graph) -> str | None:
    reason = _right_check(node, graph)
    if reason:
        return reason
    xs, w = graph.shape_of(node.input(0)), graph.const(node.input(1))
    if len(xs) != 2:
        return f"Gemm's A has rank {len(xs)}"
    if int(node.attrs.get("transA", 0)):
        return "transA=1 is not supported on the GPU (transpose A first)"
    k, n = w.shape[::-1] if int(node.attrs.get("transB", 0)) else w.shape
    if xs[1] != k:
        return f"A {tuple(xs)} does not match B {tuple(w.shape)}"
    cname = node.input(2)
    if cname:
        c = graph.const(cname)
        if c is None:
            return f"C '{cname}' is not a constant"
        if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
            return f"C '{cname}' of shape {tuple(c.shape)} is not a row vector of {n} (or a scalar)"
    return None


@gpu_kernel("Gemm", check=_check_gemm, cost=_cost)
def gemm(ctx, node) -> list[Launch]:
    w = ctx.const(input_of(node, 1)).astype(np.float32)
    if int(node.attrs.get("transB", 0)):
        w = w.T
    w = w * np.float32(node.attrs.get("alpha", 1.0))
    c = ctx.const(input_of(node, 2))
    bias = np.zeros(w.shape[1], np.float32)
    if c is not None:
        bias = bias + np.float32(node.attrs.get("beta", 1.0)) * c.astype(np.float32).reshape(-1)
    return _matmul_launches(ctx, node, np.ascontiguousarray(w), bias)


# --------------------------------------------------------------------------- per-channel affine
def _affine_launch(ctx, node, scale: np.ndarray, shift: np.ndarray) -> list[Launch]:
    x, out = input_of(node, 0), node.outputs[0]
    _, c, h, w = dims4(ctx.shape(x))
    count = packed_elements(ctx.shape(x)) // 4
    args = [packed_input(ctx, node, 0), ctx.weight(f"{node.name}/scale", _pad(scale, c)),
            ctx.weight(f"{node.name}/shift", _pad(shift, c)), ctx.tensor(out), count, h * w, c,
            epilogue_arg(node.attrs)]
    return [Launch(SOURCE, "channel_affine", args, (count,), epilogue_defines(node.attrs))]


def _check_params(node: Node, graph: Graph, indices: range) -> str | None:
    reason = common_check(node, graph)
    if reason:
        return reason
    xs = graph.shape_of(node.input(0))
    if len(xs) < 2:
        return f"input has rank {len(xs)} (a channel axis 1 is needed)"
    for i in indices:
        name = node.input(i)
        if not name:
            continue
        p = graph.const(name)
        if p is None:
            return f"'{name}' is not a constant"
        if p.size not in (1, xs[1]) or p.ndim > 1:
            return f"'{name}' of shape {tuple(p.shape)} is not a per-channel vector of {xs[1]}"
    return None


def _check_batchnorm(node: Node, graph: Graph) -> str | None:
    if int(node.attrs.get("training_mode", 0)) or any(node.outputs[1:]):
        return "training-mode BatchNormalization does not run on the GPU"
    if len(node.inputs) < 5 or not all(node.inputs[:5]):
        return "BatchNormalization needs scale, B, mean and var"
    return _check_params(node, graph, range(1, 5))


def _cost_affine(node: Node, graph: Graph) -> float:
    return packed_elements(graph.shape_of(node.input(0))) / 2.0 + _LAUNCH_COST


@gpu_kernel("BatchNormalization", check=_check_batchnorm, cost=_cost_affine)
def batch_normalization(ctx, node) -> list[Launch]:
    scale, b, mean, var = (ctx.const(input_of(node, i)).astype(np.float64) for i in range(1, 5))
    a = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    return _affine_launch(ctx, node, a, b - mean * a)


@gpu_kernel("ChannelAffine", domain=OPTCLI_DOMAIN, check=lambda n, g: _check_params(n, g, range(1, 3)),
            cost=_cost_affine)
def channel_affine(ctx, node) -> list[Launch]:
    scale = ctx.const(input_of(node, 1))
    shift = ctx.const(input_of(node, 2))
    return _affine_launch(ctx, node, scale, np.zeros(1, np.float32) if shift is None else shift)
