"""Ops: one module per op family, each registering numpy kernels (reference + `arm` kernels) and
shape functions; ``evaluate`` runs one IR node on numpy inputs (constant folding, tests), and
``reference`` is the generic fallback through onnx's reference implementation.

The registries fill themselves on their first lookup (``registry.FAMILIES``): importing this
package registers nothing, and nobody needs to.
"""

from __future__ import annotations

from optcli.ops.registry import Kernel, get_kernel, kernel, kernels_for, registered_ops

__all__ = ["Kernel", "get_kernel", "kernel", "kernels_for", "registered_ops"]
