"""Turn dense layers into ``optcli.FullyConnected(X, W[K, N], B[N])``: ``X @ W + B`` over the last axis.

Exporters write a linear layer either as ``MatMul(X, W) + b`` or as ``Gemm``.  One op with a
constant 2-D weight in a fixed layout gives kernel selection a single thing to tune and the
bias-add for free:

* ``MatMul(X, W const 2-D)`` then ``Add`` of a constant that only varies along the last axis
  (``[N]``, ``[1, N]``, a scalar...) -> FullyConnected with bias;
* a ``MatMul(X, W const 2-D)`` with no such Add -> FullyConnected without bias;
* ``Gemm(A, B const 2-D, C)`` with ``transA = 0`` and ``C`` absent or a constant ``[N]``/``[1, N]``
  -> FullyConnected, with ``B`` transposed when ``transB = 1`` and ``alpha``/``beta`` folded into
  the weight and bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import (
    EPILOGUE_ATTRS,
    become,
    channel_vector,
    drop_values,
    is_float,
    rank_of,
    sole_consumer,
)

NAME = "fuse_matmul_add"
DESCRIPTION = "MatMul(+Add) with constant 2-D weight, and Gemm with constant weight -> optcli.FullyConnected"


def _bias_of_add(graph: Graph, add: Node, mm_out: str, n: int) -> np.ndarray | None:
    """The ``[N]`` bias an Add of ``mm_out`` and a constant amounts to, or None."""
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    others = [i for i in add.inputs if i != mm_out]
    if len(add.inputs) != 2 or len(others) != 1:
        return None
    c = graph.const(others[0])
    if not is_float(c):
        return None
    return channel_vector(c, rank_of(graph, mm_out), -1, n)


def _fuse_matmul(
    graph: Graph, mm: Node, names: Names, consumers: dict[str, list[Node]], gone: set[int]
) -> str:
    w = graph.const(mm.input(1))
    if not is_float(w) or w.ndim != 2 or graph.is_constant(mm.input(0)):
        return ""
    rank = rank_of(graph, mm.input(0))
    if rank is not None and rank < 2:
        return ""  # a vector times a matrix drops an axis; leave it to MatMul
    inputs = [mm.inputs[0], mm.inputs[1]]
    add = sole_consumer(graph, consumers, mm.outputs[0])
    bias = _bias_of_add(graph, add, mm.outputs[0], w.shape[1]) if add is not None else None
    if bias is not None:
        inputs.append(names.initializer(f"{mm.name or 'fc'}_bias", bias.astype(w.dtype)))
        gone.add(id(add))
        drop_values(graph, mm.outputs[0])
        mm.outputs = [add.outputs[0]]
    become(mm, "FullyConnected", inputs, OPTCLI_DOMAIN)
    return "matmul_add" if bias is not None else "matmul"


def _fuse_gemm(graph: Graph, gemm: Node, names: Names) -> str:
    b = graph.const(gemm.input(1))
    a = gemm.attrs
    if not is_float(b) or b.ndim != 2 or int(a.get("transA", 0)) or graph.is_constant(gemm.input(0)):
        return ""
    bias = None
    if gemm.input(2):
        c = graph.const(gemm.input(2))
        # Gemm broadcasts C to [M, N]; only a per-column C is a bias.
        n = b.shape[0] if int(a.get("transB", 0)) else b.shape[1]
        bias = channel_vector(c, 2, -1, n) if is_float(c) else None
        if bias is None:
            return ""
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if int(a.get("transB", 0)) or alpha != 1.0:
        w = (b.T if int(a.get("transB", 0)) else b).astype(np.float64) * alpha
        inputs = [gemm.inputs[0], names.initializer(f"{gemm.name or 'fc'}_weight", w.astype(b.dtype))]
    else:
        inputs = [gemm.inputs[0], gemm.inputs[1]]
    if bias is not None:
        scaled = (bias.astype(np.float64) * beta).astype(b.dtype)
        inputs.append(names.initializer(f"{gemm.name or 'fc'}_bias", scaled))
    become(gemm, "FullyConnected", inputs, OPTCLI_DOMAIN, {k: v for k, v in a.items() if k in EPILOGUE_ATTRS})
    return "gemm"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"matmul_add": 0, "matmul": 0, "gemm": 0}
    # Absorbing one Add never changes who reads another MatMul's output: one snapshot serves all.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    gone: set[int] = set()
    for node in list(graph.nodes):
        if node.domain not in ("", "ai.onnx") or id(node) in gone:
            continue
        kind = ""
        if node.op_type == "MatMul":
            kind = _fuse_matmul(graph, node, names, consumers, gone)
        elif node.op_type == "Gemm":
            kind = _fuse_gemm(graph, node, names)
        if kind:
            counts[kind] += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return counts
