"""optcli.QLookup: a "float island" of a quantized model run as one byte table lookup.

Between the integer convs of a QDQ MobileNetV3 (issue 26) sit float subgraphs whose only dynamic input is one
u8 / s8 tensor and whose output is quantized again: hard-swish (DequantizeLinear -> HardSigmoid -> Q/DQ ->
Mul -> QuantizeLinear), torch's hard-swish (DQ -> Add 3 -> Mul -> Div 6 -> Q), the hard-sigmoid gate of a
squeeze-excite block.  Each is an element-wise function of the input byte, so ``passes/fuse_qdq_lookup.py``
runs the island's own ops on all 256 byte values at compile time and keeps the 256 results: the step is
exact by construction (the float island gives these bytes), and costs one load per element instead of five
float passes.

Inputs: x (uint8 or int8), table (uint8 or int8 [256], a constant: the output's dtype), indexed by x's raw
byte (an int8 value v at entry v & 255).  No attributes.  The table's shape and dtype are checked at load
(runtime/step_checks.py) and again here; kernels/host/qelementwise.c is the fast path, numpy's ``take`` the
reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import NbFormatError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qelementwise
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, shape_fn

BYTES = (np.dtype(np.uint8), np.dtype(np.int8))


def check_table(table: Any) -> str:
    """Why ``table`` cannot be a QLookup's table ('' when it can): 256 entries of uint8 or int8."""
    if not isinstance(table, np.ndarray) or table.dtype not in BYTES or table.shape != (256,):
        have = f"{table.dtype} {list(table.shape)}" if isinstance(table, np.ndarray) else type(table).__name__
        return f"a QLookup's table must be a constant uint8 or int8 tensor of 256 values, got {have}"
    return ""


def reference(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.take(table, x.view(np.uint8))


@kernel("QLookup", domain=OPTCLI_DOMAIN)
def qlookup(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """table[x] for a u8 / s8 tensor x: a quantized element-wise island tabulated at compile time."""
    x, table = inputs[0], inputs[1]
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("qlookup") if memo is not None else None
    if hit is not None and hit[0] is table and hit[1] == x.shape and hit[2] == x.dtype and x.flags.c_contiguous:
        return [hit[3](x)]
    problem = check_table(table)
    if problem or x.dtype not in BYTES:
        raise NbFormatError((problem or f"QLookup reads a uint8 or int8 tensor, got {x.dtype}") +
                            ": the plan is corrupted or crafted (only optcli's passes make QLookup)")
    if not native.available():
        native.note_unavailable()
        return [reference(x, table)]
    call = qelementwise.prepared_lookup(x.shape, x.dtype, table)  # (the checks and conversions, once per step)
    if memo is not None:
        memo["qlookup"] = (table, x.shape, x.dtype, call)
    return [call(np.require(x, requirements="C"))]  # (ascontiguousarray makes 0-d 1-d)


@shape_fn("QLookup", domain=OPTCLI_DOMAIN)
def _qlookup_shape(args: ShapeArgs) -> list[Shape]:
    return [args.shape(0)]
