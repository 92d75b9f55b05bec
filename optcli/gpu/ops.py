"""Importing this module registers every GPU kernel (one module per kernel family)."""

from optcli.gpu import (  # noqa: F401
    ops_activation,
    ops_conv,
    ops_elementwise,
    ops_gemm,
    ops_layout,
    ops_lstm,
    ops_matmul,
    ops_norm,
    ops_pool,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_softmax,
    ops_tensor,
)
