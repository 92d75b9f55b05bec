"""Fuse the dense layers of dynamically quantized models into ``optcli.DynamicQuantizeMatMul``.

onnxruntime's ``quantize_dynamic`` writes every ``MatMul(X, W)`` as

    DynamicQuantizeLinear(X) -> (X_q, x_scale, x_zp)
    MatMulInteger(X_q, W_q, x_zp, w_zp) -> Cast(to=float) -> Mul(., Mul(x_scale, w_scale)) [-> Add(bias)]

five or six steps around one product; onnxruntime itself runs it as one DynamicQuantizeMatMul
(or MatMulIntegerToFloat when the quantized X is shared).  This pass makes each chain one
``optcli.DynamicQuantizeMatMul(X, W_q, w_scale, w_zp, bias)`` whose host kernel quantizes X
itself and rounds in float32 exactly where the chain did (``optcli.ops.quant``), so the results
are the chain's bit for bit.  A DynamicQuantizeLinear shared by several products (Q, K and V of
an attention layer) is recomputed by each fused op (a min/max and a rounding: cheap beside the
product) and goes away with the last of its readers.

Matched only when every intermediate value has the chain as its only reader, the weight, its
scale and zero point are constants, and the bias is a constant that only varies along the last
axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import channel_vector, drop_values, is_float, rank_of, sole_consumer

NAME = "fuse_dynamic_quant_matmul"
DESCRIPTION = ("DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scales) (-> Add bias) "
               "-> optcli.DynamicQuantizeMatMul")

_INT8 = ("int8", "uint8")


def _onnx(node: Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") and node.proto is None


def _other(node: Node, name: str) -> str | None:
    """The other input of a two-input node that reads ``name`` once."""
    if len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _weight_scale(graph: Graph, scales_mul: Node | None, x_scale: str, n: int) -> str | None:
    """The constant w_scale of ``Mul(x_scale, w_scale)``, when it is a scalar or one per column."""
    if not _onnx(scales_mul, "Mul"):
        return None
    other = _other(scales_mul, x_scale)
    c = graph.const(other) if other else None
    if not is_float(c) or c.size not in (1, n) or (c.size == n and c.ndim != 1 and c.shape[-1] != n):
        return None
    return other


def _match(graph: Graph, mm: Node, producers: dict, consumers: dict) -> tuple[list[Node], list, str] | None:
    """(chain nodes to remove, inputs of the fused op, its output) for the chain from ``mm``; the
    bias input is an array still to be stored."""
    dq = producers.get(mm.input(0))
    w, w_zp = graph.const(mm.input(1)), graph.const(mm.input(3)) if mm.input(3) else None
    if not _onnx(dq, "DynamicQuantizeLinear") or len(dq.outputs) < 3 or dq.outputs[0] != mm.input(0):
        return None
    if mm.input(2) != dq.outputs[2] or w is None or w.dtype.name not in _INT8 or w.ndim != 2:
        return None
    if mm.input(3) and (w_zp is None or (w_zp.size != 1 and w_zp.shape != (w.shape[1],))):
        return None
    n = w.shape[1]
    cast = sole_consumer(graph, consumers, mm.outputs[0])
    if not _onnx(cast, "Cast") or int(cast.attrs.get("to", 0)) != 1:  # 1: FLOAT
        return None
    mul = sole_consumer(graph, consumers, cast.outputs[0])
    scale_name = _other(mul, cast.outputs[0]) if _onnx(mul, "Mul") else None
    scales_mul = producers.get(scale_name) if scale_name else None
    w_scale = _weight_scale(graph, scales_mul, dq.outputs[1], n)
    if w_scale is None:
        return None
    chain, out, bias = [mm, cast, mul], mul.outputs[0], None
    if sole_consumer(graph, consumers, scale_name) is mul:
        chain.append(scales_mul)
    add = sole_consumer(graph, consumers, out)
    if _onnx(add, "Add") and _other(add, out):
        c = graph.const(_other(add, out))
        bias = channel_vector(c, rank_of(graph, out), -1, n) if is_float(c) and c.dtype == np.float32 else None
        if bias is not None:
            chain.append(add)
            out = add.outputs[0]
    return chain, [dq.input(0), mm.input(1), w_scale, mm.input(3), bias], out


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    if not any(_onnx(n, "MatMulInteger") for n in graph.nodes):
        return {"fused": 0}
    consumers, producers, names = graph_queries.consumers(graph), graph.producers(), Names(graph)
    gone: set[int] = set()
    replace: dict[int, Node] = {}  # last node of a chain -> the fused op, in its place
    for mm in graph.nodes:
        if not _onnx(mm, "MatMulInteger"):
            continue
        found = _match(graph, mm, producers, consumers)
        if found is None:
            continue
        chain, inputs, out = found
        if inputs[4] is not None:
            inputs[4] = names.initializer(f"{mm.name}_bias", inputs[4].astype(np.float32))
        while not inputs[-1]:
            inputs.pop()
        last = next(c for c in chain if out in c.outputs)
        replace[id(last)] = Node("DynamicQuantizeMatMul", inputs, [out], {}, names.fresh(f"{mm.name}_fused"),
                                 OPTCLI_DOMAIN)
        gone.update(id(c) for c in chain)
        drop_values(graph, *(o for c in chain for o in c.outputs if o != out))
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in gone or id(n) in replace]
    return {"fused": len(replace)}
