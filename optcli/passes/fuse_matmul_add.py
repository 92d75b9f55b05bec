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

from optcli.ir import OPTCLI_DOMAIN, Graph, Node
from optcli.passes.util import (
    EPILOGUE_ATTRS,
    channel_vector,
    drop_values,
    is_float,
    rank_of,
    remove_nodes,
    replace_node,
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


def _fuse_matmul(graph: Graph, mm: Node) -> str | None:
    w = graph.const(mm.input(1))
    if not is_float(w) or w.ndim != 2 or graph.is_constant(mm.input(0)):
        return None
    rank = rank_of(graph, mm.input(0))
    if rank is not None and rank < 2:
        return None  # a vector times a matrix drops an axis; leave it to MatMul
    out = mm.outputs[0]
    inputs = [mm.inputs[0], mm.inputs[1]]
    add = sole_consumer(graph, graph.consumers(), out)
    bias = _bias_of_add(graph, add, out, w.shape[1]) if add is not None else None
    if bias is not None:
        inputs.append(graph.add_initializer(f"{mm.name or 'fc'}_bias", bias.astype(w.dtype)))
        remove_nodes(graph, add)
        drop_values(graph, out)
        out = add.outputs[0]
    replace_node(graph, mm, Node("FullyConnected", inputs, [out], name=mm.name, domain=OPTCLI_DOMAIN))
    return "matmul_add" if bias is not None else "matmul"


def _fuse_gemm(graph: Graph, gemm: Node) -> str | None:
    b = graph.const(gemm.input(1))
    a = gemm.attrs
    if not is_float(b) or b.ndim != 2 or int(a.get("transA", 0)) or graph.is_constant(gemm.input(0)):
        return None
    w = (b.T if int(a.get("transB", 0)) else b).astype(np.float64) * float(a.get("alpha", 1.0))
    inputs = [gemm.inputs[0], graph.add_initializer(f"{gemm.name or 'fc'}_weight", w.astype(b.dtype))]
    if gemm.input(2):
        c = graph.const(gemm.input(2))
        # Gemm broadcasts C to [M, N]; only a per-column C is a bias.
        bias = channel_vector(c, 2, -1, w.shape[1]) if is_float(c) else None
        if bias is None:
            graph.initializers.pop(inputs[1])
            return None
        bias = bias.astype(np.float64) * float(a.get("beta", 1.0))
        inputs.append(graph.add_initializer(f"{gemm.name or 'fc'}_bias", bias.astype(b.dtype)))
    attrs = {k: v for k, v in a.items() if k in EPILOGUE_ATTRS}
    fc = Node("FullyConnected", inputs, list(gemm.outputs), attrs, name=gemm.name, domain=OPTCLI_DOMAIN)
    replace_node(graph, gemm, fc)
    return "gemm"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"matmul_add": 0, "matmul": 0, "gemm": 0}
    for node in list(graph.nodes):
        if node.domain not in ("", "ai.onnx"):
            continue
        kind = None
        if node.op_type == "MatMul":
            kind = _fuse_matmul(graph, node)
        elif node.op_type == "Gemm":
            kind = _fuse_gemm(graph, node)
        if kind:
            counts[kind] += 1
    return counts
