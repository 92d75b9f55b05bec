"""Ops: one module per op family, each registering numpy kernels (reference + `arm` kernels).

Importing this package registers every kernel.  ``evaluate`` runs one IR node on numpy
inputs, used by constant folding and by tests.
"""

from __future__ import annotations

from optcli.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    blocked,
    conv,
    elementwise,
    fused,
    gemm,
    normalization,
    pool,
    quant,
    quant_contrib,
    recurrent,
    reduce,
    resize,
    tensor,
    tensor_shapes,
    transfer,
)
from optcli.ops.registry import Kernel, get_kernel, kernel, kernels_for, registered_ops  # noqa: F401
