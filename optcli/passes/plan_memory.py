"""Memory planning: give every activation a lifetime and, when shapes are static, an offset in
one arena so tensors whose lifetimes do not overlap share memory.

The planning itself lives in ``optcli/plan_memory_core.py``, below both the compiler and the
runtime (the `.nb` reader derives lifetimes again, and the runtime plans offsets per input shape
for dynamic dims); this pass runs it over the graph and hands the plan to lowering.
"""

from __future__ import annotations

from optcli.ir import Graph
from optcli.passes.base import PassContext
from optcli.plan_memory_core import ALIGN, MemoryPlan, _align, lifetimes_of, plan_graph, plan_offsets

NAME = "plan_memory"
DESCRIPTION = "compute activation lifetimes and a shared arena (buffer reuse by liveness)"

__all__ = ["ALIGN", "MemoryPlan", "_align", "lifetimes_of", "plan_graph", "plan_offsets", "run"]


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    plan = plan_graph(graph)
    ctx.results.memory = plan
    if plan.arena_bytes is None:
        return {"values": len(plan.lifetimes)}
    return {"values": len(plan.lifetimes), "arena_bytes": plan.arena_bytes, "naive_bytes": plan.naive_bytes}
