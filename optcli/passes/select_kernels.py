"""Kernel selection: the target of each node picks its best kernel variant (by the variant's
cost or priority and whether it applies to this node's attributes and constant shapes).

GPU-placed nodes also get the host kernel that runs them when the app's machine has no usable
GPU (``optcli.load`` then falls back to the CPU with a warning instead of failing)."""

from __future__ import annotations

from optcli.ir import Graph
from optcli.passes.base import PassContext

NAME = "select_kernels"
DESCRIPTION = "choose a kernel variant per node (e.g. Conv: 1x1, depthwise, im2col)"


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    targets = {t.name: t for t in ctx.targets}
    counts = {"fallback": 0, "native": 0}
    host = next(t for t in ctx.targets if t.device == "cpu")
    for node in graph.nodes:
        target = targets[node.target]
        node.kernel = target.select_kernel(node, graph)
        counts["fallback" if target.uses_fallback(node.kernel) else "native"] += 1
        if target.device == "gpu":
            node.cpu_kernel = host.select_kernel(node, graph)
    return counts
