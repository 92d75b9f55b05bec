"""The host-CPU target (`arm`; also `host` and `x86`): numpy kernels, BLAS-backed.

It runs every registered numpy kernel, and every other standard ONNX op through onnx's
reference implementation, so a valid model is never rejected here.  It is also where GPU
targets send what they cannot run.
"""

from __future__ import annotations

from optcli.ir import Graph, Node
from optcli.ops import kernels_for, registered_ops
from optcli.targets.base import Target

FALLBACK_VARIANT = "reference"


def fallback_kernel_id(op_type: str, domain: str = "") -> str:
    return f"{domain or 'onnx'}.{op_type}.{FALLBACK_VARIANT}"


class HostTarget(Target):
    def can_run(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if kernels_for(node.op_type, node.domain) and not _needs_proto(node):
            return True, "native numpy kernel"
        import onnx

        if node.proto is not None and onnx.defs.has(node.op_type, node.domain):
            return True, "generic fallback (onnx reference implementation)"
        return False, f"no kernel for op '{node.op_type}' in domain '{node.domain or 'ai.onnx'}'"

    def select_kernel(self, node: Node, graph: Graph) -> str:
        if _needs_proto(node) or not kernels_for(node.op_type, node.domain):
            return fallback_kernel_id(node.op_type, node.domain)
        for k in kernels_for(node.op_type, node.domain):
            if k.applies is None or k.applies(node, graph):
                return k.id
        return fallback_kernel_id(node.op_type, node.domain)

    def blocked_kernel(self, node: Node, graph: Graph, plain: frozenset[int] = frozenset()) -> str | None:
        if _needs_proto(node):
            return None
        for k in kernels_for(node.op_type, node.domain, blocked=True):
            if not plain & set(k.blocked_inputs) and (k.applies is None or k.applies(node, graph)):
                return k.id
        return None

    def uses_fallback(self, kernel_id: str) -> bool:
        """onnx.reference runs it.  Not If/Loop/Scan: their steps keep the reference kernel id (the
        `.nb` names no other), but run in optcli's executor (ops/control_flow.py)."""
        return kernel_id.endswith("." + FALLBACK_VARIANT) and kernel_id not in _OWN_CONTROL_FLOW

    def supported_ops(self) -> list[tuple[str, str]]:
        return registered_ops()


_OWN_CONTROL_FLOW = frozenset(fallback_kernel_id(op) for op in ("If", "Loop", "Scan"))


def _needs_proto(node: Node) -> bool:
    """The frontend keeps a proto only for nodes no native kernel describes (no kernel for the
    op, or subgraph attributes): those always run through the reference implementation."""
    return node.proto is not None


HOST = HostTarget(
    name="arm",
    aliases=("host", "x86", "cpu"),
    device="cpu",
    description="host CPU: vectorised numpy kernels (BLAS), onnx reference fallback for the rest",
)
