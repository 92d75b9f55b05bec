"""GPU kernels for MatMul where both operands are computed at run time (attention's Q·Kᵀ and
P·V), in ``kernels/gpu/matmul.cl``: ranks 2-4, numpy broadcasting of the leading (batch) axes.

Where the operands sit in the packed layout (``layout.dims4``) decides the kernel: rank 4
``[B, H, M, K]`` keeps the heads in the channel slices and the matrix in H, W, so two rank-4
operands with the same head count multiply lane by lane on float4s (``matmul_heads``: every
attention block of the corpus).  Any other pairing (rank 2 or 3, mixed ranks, a broadcast head
axis) runs ``matmul_any``, which reads scalars through the packing of each operand's own rank.

These variants cost more than the constant-weight kernels of ``ops_gemm`` (their weight is re-laid
once at load for the packed reads), so those keep the nodes they apply to; a constant operand
that they refuse (a batched right operand, a constant left one) is uploaded packed and read here.
"""

from __future__ import annotations

import math

from optcli.gpu.layout import c4, packed_elements
from optcli.gpu.ops_conv import packed_input
from optcli.gpu.ops_elementwise import data_check
from optcli.gpu.registry import Launch, gpu_kernel, input_of
from optcli.ir import Graph, Node

SOURCE = "matmul.cl"
_LAUNCH_COST = 2e4


def _aligned4(shape) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def _check(node: Node, graph: Graph) -> str | None:
    names = [input_of(node, 0), input_of(node, 1)]
    if not all(names):
        return "MatMul needs two operands"
    reason = data_check(node, graph, names)
    if reason:
        return reason
    xa, xb = (tuple(graph.shape_of(n)) for n in names)
    for name, shape in zip(names, (xa, xb)):
        if len(shape) < 2:
            return f"operand '{name}' has rank {len(shape)} (the GPU kernel multiplies matrices of rank 2-4)"
    if xa[-1] != xb[-2]:
        return f"left operand {xa} does not match the right operand {xb}"
    for da, db in zip(_aligned4(xa)[:2], _aligned4(xb)[:2]):
        if da != db and 1 not in (da, db):
            return f"batch axes of {xa} and {xb} do not broadcast"
    return None


def _check_heads(node: Node, graph: Graph) -> str | None:
    reason = _check(node, graph)
    if reason:
        return reason
    xa, xb = (tuple(graph.shape_of(input_of(node, i))) for i in (0, 1))
    if len(xa) != 4 or len(xb) != 4:
        return f"operands of rank {len(xa)} and {len(xb)} (this variant takes rank 4 [B, H, M, K] x [B, H, K, N])"
    if xa[1] != xb[1]:
        return f"axis 1 differs ({xa[1]} against {xb[1]}: a broadcast head axis runs on the general variant)"
    return None


def _macs(node: Node, graph: Graph) -> float:
    k = graph.shape_of(input_of(node, 0))[-1]
    return float(math.prod(graph.shape_of(node.outputs[0]))) * k


@gpu_kernel("MatMul", variant="heads", check=_check_heads, cost=lambda n, g: _macs(n, g) / 2.0 + _LAUNCH_COST,
            priority=-10)
def matmul_heads(ctx, node) -> list[Launch]:
    (a0, h, m, k), (b0, _, _, n) = ctx.shape(input_of(node, 0)), ctx.shape(input_of(node, 1))
    out = node.outputs[0]
    count = packed_elements(ctx.shape(out)) // 4
    sa = 0 if a0 == 1 else c4(h) * m * k  # batch strides in float4s; 0 repeats a batch of 1
    sb = 0 if b0 == 1 else c4(h) * k * n
    args = [packed_input(ctx, node, 0), packed_input(ctx, node, 1), ctx.tensor(out), count, h, m, n, k, sa, sb]
    return [Launch(SOURCE, "matmul_heads", args, (count,))]


@gpu_kernel("MatMul", variant="batched", check=_check, cost=lambda n, g: _macs(n, g) + _LAUNCH_COST, priority=-20)
def matmul_batched(ctx, node) -> list[Launch]:
    xa, xb = ctx.shape(input_of(node, 0)), ctx.shape(input_of(node, 1))
    out = node.outputs[0]
    ys = ctx.shape(out)
    _, d1, m, n = _aligned4(ys)
    a0, a1 = _aligned4(xa)[:2]
    b0, b1 = _aligned4(xb)[:2]
    count = packed_elements(ys) // 4
    args = [packed_input(ctx, node, 0), packed_input(ctx, node, 1), ctx.tensor(out), count,
            len(xa), a0, a1, len(xb), b0, b1, d1, m, n, xa[-1]]
    return [Launch(SOURCE, "matmul_any", args, (count,))]
