"""Placement: each node goes to the first target, in ``--valid_targets`` order, that can run it.

Every decision keeps its reason (for the report and ``--print_model_ops``).  A node no target
can run is a user error naming the node and op.  ``ctx.options["placement_overrides"]`` maps
node names or op types to a target name for people who know better.
"""

from __future__ import annotations

from optcli.errors import ModelError
from optcli.ir import Graph
from optcli.passes.base import PassContext

NAME = "place_nodes"
DESCRIPTION = "assign each node to the first valid target that has a kernel for it"


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    overrides: dict[str, str] = ctx.options.get("placement_overrides", {})
    decisions = ctx.options.setdefault("placement", {})
    counts: dict[str, int] = {}
    warned: set[str] = set()
    for index, node in enumerate(graph.nodes):
        wanted = overrides.get(node.name) or overrides.get(node.op_type)
        candidates = [t for t in ctx.targets if t.name == wanted] + [t for t in ctx.targets if t.name != wanted]
        rejected = []
        for target in candidates:
            ok, reason = target.can_run(node, graph)
            if ok:
                node.target = target.name
                if rejected:
                    reason = f"{reason} (" + "; ".join(rejected) + ")"
                    if candidates[0].device == "gpu" and node.op_type not in warned:
                        warned.add(node.op_type)
                        ctx.warn(f"op #{index} {node.op_type} cannot run on {candidates[0].name}; "
                                 f"it runs on {target.name}")
                decisions[node.name] = {"target": target.name, "reason": reason}
                break
            rejected.append(f"{target.name}: {reason}")
        else:
            raise ModelError(f"{node.describe()}: no target can run it ({'; '.join(rejected)}); "
                             "the op is not a standard ONNX op, or its domain is unsupported")
        counts[node.target] = counts.get(node.target, 0) + 1
    return counts
