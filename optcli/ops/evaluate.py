"""Run one IR node on numpy inputs: the native kernel when there is one, else the fallback.

Used by constant folding at optimize time and by tests; the CPU backend uses the same lookup
through the kernel id recorded in the plan.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Node
from optcli.ops import get_kernel, kernels_for
from optcli.ops.control_flow import run_fallback
from optcli.ops.registry import StepAttrs


def kernel_attrs(attrs: dict, n_outputs: int, opsets: dict[str, int]) -> dict:
    """The attrs a kernel receives: the node's, plus ``_opset`` (the default domain's version,
    for ops whose semantics changed across versions) and ``_n_outputs`` (Split with no sizes
    divides equally across its outputs)."""
    return StepAttrs({**attrs, "_opset": int(opsets.get("", 0) or 0), "_n_outputs": n_outputs})


def evaluate_node(node: Node, inputs: list[np.ndarray | None], opsets: dict[str, int]) -> list[np.ndarray]:
    kern = get_kernel(node.kernel) if node.kernel else None
    if kern is None and node.proto is None:
        # Without a graph we cannot test `applies`; the unconditional variants always fit.
        generic = [k for k in kernels_for(node.op_type, node.domain) if k.applies is None]
        kern = generic[0] if generic else None
    if kern is not None:
        return kern.fn(list(inputs), kernel_attrs(node.attrs, len(node.outputs), opsets))
    if node.proto is None:
        raise NotImplementedError(f"no kernel for {node.describe()} and no ONNX proto to fall back on")
    return run_fallback(node.proto, opsets, list(inputs), list(node.inputs))
