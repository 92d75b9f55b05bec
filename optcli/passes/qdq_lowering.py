"""The passes that lower QDQ chains (QuantizeLinear -> DequantizeLinear around quantized tensors), in order:
integer steps on host-only plans, then the float view of what is left.  The pipeline runs them on models
quantized elsewhere (onnxruntime's quantize_static, QOperator models after qoperator_to_qdq) and
``quantize_int8`` runs them again on the chains its own PTQ writes; one list, so both lower alike.
(Not a pass itself: a list of them.)"""

from __future__ import annotations

from types import ModuleType

from optcli.passes import (
    fold_qdq,
    fuse_qdq_add,
    fuse_qdq_conv,
    fuse_qdq_lookup,
    fuse_qdq_matmul,
    fuse_qdq_movement,
    fuse_qdq_se,
)

PASSES: list[ModuleType] = [
    fuse_qdq_conv,  # host-only plans: quantized convs become integer steps, before fold_qdq makes FakeQuants
    fuse_qdq_matmul,  # and the quantized MatMul / Gemm (classifier heads, dense layers)
    fuse_qdq_add,  # and the residual Adds between them
    fuse_qdq_movement,  # and the pools, pads and reshapes that only move their bytes
    fuse_qdq_lookup,  # float islands of one quantized tensor (hard-swish, gates): byte tables
    fuse_qdq_se,  # then the squeeze-excite pool and per-channel Mul
    fold_qdq,  # what is left: FakeQuant steps, dequantized weights stored as integers
]
