"""What a target is: a name, its aliases, and what it can run.

Passes and placement ask these questions instead of testing a target's name, so adding a
backend touches only its own files under ``targets/`` and ``runtime/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optcli.activation_codes import ACTIVATIONS
from optcli.ir import Graph, Node


@dataclass(frozen=True)
class Target:
    name: str
    aliases: tuple[str, ...] = ()
    device: str = "cpu"  # "cpu" or "gpu": where its tensors live
    description: str = ""
    fused_activations: frozenset[str] = field(default_factory=lambda: frozenset(ACTIVATIONS))

    def can_run(self, node: Node, graph: Graph) -> tuple[bool, str]:  # pragma: no cover - abstract
        """Whether this target has a kernel for the node, and why (for the report)."""
        raise NotImplementedError

    def explain_refusal(self, reason: str) -> tuple[str, str]:
        """A ``can_run`` refusal as (kind, detail): ``kind`` is a short label ("no kernel",
        "dynamic shape", ...) that placement groups its warnings and report by; ``detail`` is
        the reason without what the label already says."""
        return "unsupported", reason

    def select_kernel(self, node: Node, graph: Graph) -> str:  # pragma: no cover - abstract
        """The id of the best kernel variant for a node this target can run."""
        raise NotImplementedError

    def blocked_kernel(self, node: Node, graph: Graph, plain: frozenset[int] = frozenset()) -> str | None:
        """The id of a kernel of the channel-blocked host layout for the node (``ops/blocked.py``),
        one that reads the input positions in ``plain`` in plain NCHW, or None where this target
        has none (the layout pass leaves such nodes in NCHW)."""
        return None

    def uses_fallback(self, kernel_id: str) -> bool:
        """Whether a kernel id is the generic reference fallback (slow, named in reports)."""
        return False

    def supported_ops(self) -> list[tuple[str, str]]:  # pragma: no cover - abstract
        """(domain, op_type) pairs this target has kernels for."""
        raise NotImplementedError
