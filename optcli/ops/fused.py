"""Ops that only exist after optimisation: fused patterns with no single ONNX equivalent.

``optcli.Swish`` is what the pattern-fusion pass makes of ``x * Sigmoid(x)`` (SiLU, the
activation of EfficientNet and YOLO): one kernel reading ``x`` once instead of a Sigmoid plus a
Mul with a full-size intermediate.  It shares the sign-split, overflow-free sigmoid of the
fused activation epilogues so the fused and unfused graphs agree to the last bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ops.activation import _sigmoid
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import first_input, shape_fn


@kernel("Swish", domain="optcli")
def swish(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """x * sigmoid(x), in the input's dtype."""
    x = np.asarray(inputs[0])
    return [x * _sigmoid(x)]


shape_fn("Swish", domain="optcli")(first_input)
