"""Constant folding for quantized models before their QDQ chains become integer steps, the
DequantizeLinear nodes kept.

Exporters that compute padding at run time (timm's TF-"same" convs, tf2onnx) leave Shape -> Cast ->
Mul/Add chains in front of each Pad, and onnxruntime's quantizer wraps those in Q/DQ pairs as well.
Until they fold, the Pads' outputs and everything after them have no static shape, so the passes that
make integer steps (``fuse_qdq_add`` wants operands of one static shape) and move Pads onto bytes
(``fuse_qdq_movement`` wants its constant value) leave them float: a quantized MobileNetV3 of timm ran
six residual Adds and five Pads in float, each between a DequantizeLinear and a QuantizeLinear.  The
usual ``fold_constants`` runs after those passes (a DequantizeLinear of an int8 weight folded first
would be a float weight, no longer the integer weight ``fuse_qdq_conv`` takes), so this one runs
before them and folds everything except the DequantizeLinear nodes of integer weights and biases.
Models with no QuantizeLinear or DequantizeLinear are left alone (the usual folding serves them).
"""

from __future__ import annotations

from optcli.ir import Graph
from optcli.passes import fold_constants
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import is_std
from optcli.passes.base import PassContext

NAME = "fold_constants_before_qdq"
DESCRIPTION = ("quantized models: fold constants and static shapes (integer weights' DequantizeLinear kept) before "
               "the QDQ passes")


_TAKES_INTEGER_WEIGHTS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def _integer_weights(graph: Graph) -> set[int]:
    """The DequantizeLinear nodes of constants that a Conv / Gemm / MatMul reads (its integer weight or
    bias, which the integer steps take as such).  The others' constants fold: onnxruntime's quantizer
    also wraps the float pad arithmetic (a [4] vector of pads) and scalars in Q/DQ pairs."""
    readers = graph_queries.consumers(graph)
    return {id(n) for n in graph.nodes if is_std(n, "DequantizeLinear") and graph.const(n.input(0)) is not None
            and any(is_std(r, r.op_type) and r.op_type in _TAKES_INTEGER_WEIGHTS
                    for r in readers.get(n.outputs[0], []))}


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if not any(is_std(n, "DequantizeLinear") or is_std(n, "QuantizeLinear") for n in graph.nodes):
        return {}
    kept = _integer_weights(graph)
    return fold_constants.run(graph, ctx, keep=lambda node: id(node) in kept)
