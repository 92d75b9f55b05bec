"""GPU kernels for element-wise arithmetic: binary ops with broadcasting (and a fused epilogue),
PRelu, and unary maths (one ``map4`` kernel, the function picked by the ``UNARY_OP`` define).

Broadcasting happens in the packed 4-D view (``layout.dims4``): an operand whose shape, aligned
to the output's rank, maps onto 4-D dims that are each 1 or the output's, is read with those
dims (size-1 dims repeat; a size-1 channel dim repeats lane 0).  Constant operands are aligned
and packed on the host, so any numpy-broadcastable constant fits; a runtime operand must keep
the packing its own shape gives it (same rank as the output, or leading 1s that do not move
its channel axis: ``[C]`` against ``[N, C]``, a scalar against anything).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from optcli.gpu.layout import dims4, pack, packed_elements
from optcli.gpu.registry import Launch, common_check, epilogue_arg, epilogue_defines, gpu_kernel
from optcli.ir import Graph, Node

BINARY_CODES = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Max": 4, "Min": 5, "PRelu": 6, "And": 7}
UNARY_CODES = {"Exp": 1, "Neg": 2, "Abs": 3, "Sqrt": 4, "Log": 5, "Reciprocal": 6, "Erf": 7, "Softplus": 8,
               "Floor": 9, "Ceil": 10, "Gelu": 11}
_EPILOGUE_OPS = ("Add", "Sub", "Mul")


def data_check(node: Any, graph: Graph, inputs: list[str] | None = None,
               dtypes: tuple[str, ...] = ("float32",)) -> str | None:
    """``common_check`` on the data inputs only (shape/axes inputs are int64 and often constant)."""
    picked = [node.inputs[0]] if inputs is None else inputs
    reason = common_check(SimpleNamespace(inputs=picked, outputs=node.outputs), graph, dtypes=dtypes)
    if reason is None:
        for name in [*picked, *node.outputs]:
            if name and 0 in graph.shape_of(name):
                return f"'{name}' is empty (shape {tuple(graph.shape_of(name))})"
    return reason


def logical_axis_to4(rank: int, axis: int) -> int:
    """Index in (N, C, H, W) of logical axis ``axis`` of a rank-``rank`` tensor (see dims4)."""
    return {0: [], 1: [1], 2: [0, 1], 3: [0, 1, 3], 4: [0, 1, 2, 3]}[rank][axis]


def plane(shape) -> int:
    _, _, h, w = dims4(shape)
    return h * w


# --------------------------------------------------------------------------- binary
def _aligned(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _operand_reason(name: str, graph: Graph, out_shape: tuple[int, ...]) -> str | None:
    shape = tuple(graph.shape_of(name))
    rank = len(out_shape)
    if len(shape) > rank:
        return f"broadcast pattern {shape} -> {out_shape} not supported (operand of higher rank)"
    if graph.const(name) is not None:
        return None
    if dims4(shape) != dims4(_aligned(shape, rank)):
        return (f"broadcast pattern {shape} -> {out_shape} not supported (a runtime operand of lower rank "
                f"is packed along other axes; make it a constant or reshape it to rank {rank})")
    return None


def _binary_check(node: Node, graph: Graph) -> str | None:
    inputs = [i for i in node.inputs if i]
    if len(inputs) != 2:
        return f"{node.op_type} with {len(inputs)} inputs (the GPU kernel takes 2)"
    if "activation" in node.attrs and node.op_type not in _EPILOGUE_OPS:
        return f"{node.op_type} with a fused activation"
    reason = data_check(node, graph, inputs, ("bool",) if node.op_type == "And" else ("float32",))
    if reason:
        return reason
    out = tuple(graph.shape_of(node.outputs[0]))
    for name in inputs:
        reason = _operand_reason(name, graph, out)
        if reason:
            return reason
    return None


def _operand(ctx, node, index: int, out_shape: tuple[int, ...]) -> tuple[Any, tuple[int, int, int, int]]:
    name = node.inputs[index]
    value = ctx.const(name)
    rank = len(out_shape)
    if value is not None:
        value = np.asarray(value, np.float32).reshape(_aligned(value.shape, rank))
        d = dims4(value.shape)
        return ctx.weight(f"{node.name}/in{index}", pack(value.reshape(d))), d
    return ctx.tensor(name), dims4(_aligned(ctx.shape(name), rank))


@gpu_kernel(list(BINARY_CODES), check=_binary_check)
def binary(ctx, node) -> list[Launch]:
    out = node.outputs[0]
    out_shape = tuple(ctx.shape(out))
    n, c, h, w = dims4(out_shape)
    count = packed_elements(out_shape) // 4
    defines = {"BINARY_OP": BINARY_CODES[node.op_type]}
    if node.op_type in _EPILOGUE_OPS:
        defines.update(epilogue_defines(node.attrs))
    epi = epilogue_arg(node.attrs if node.op_type in _EPILOGUE_OPS else {})
    (a, da), (b, db) = _operand(ctx, node, 0, out_shape), _operand(ctx, node, 1, out_shape)
    if da == db == (n, c, h, w):
        return [Launch("elementwise.cl", "binary4_same", [a, b, ctx.tensor(out), count, c, h * w, epi], (count,),
                       defines)]
    return [Launch("elementwise.cl", "binary4", [a, b, ctx.tensor(out), count, c, h, w, *da, *db, epi], (count,),
                   defines)]


# --------------------------------------------------------------------------- unary
def _unary_check(node: Node, graph: Graph) -> str | None:
    if node.op_type == "Gelu" and node.attrs.get("approximate", "none") != "none":
        return f"Gelu approximate='{node.attrs.get('approximate')}' (only the exact form runs on the GPU)"
    return data_check(node, graph)


@gpu_kernel(list(UNARY_CODES), check=_unary_check)
def unary(ctx, node) -> list[Launch]:
    shape = ctx.shape(node.outputs[0])
    count = packed_elements(shape) // 4
    return [Launch("elementwise.cl", "map4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]), count,
                                              dims4(shape)[1], plane(shape), epilogue_arg({})], (count,),
                   {"UNARY_OP": UNARY_CODES[node.op_type]})]


# And runs on bool tensors stored as 0/1 in the float storage (uploads convert bool to 0/1,
# downloads convert back); Or/Xor/Not have no GPU kernel (not in the GPU op set we cover).


__all__ = ["BINARY_CODES", "UNARY_CODES", "data_check", "logical_axis_to4", "plane"]
