"""Placement: each node goes to the first target, in ``--valid_targets`` order (GPU targets as
listed, the host CPU last), that can run it.

Every decision keeps its reason (for the report and ``--print_model_ops``).  A node no target
can run is a user error naming the node and op.  ``ctx.placement_overrides`` maps
node names or op types to a target name for people who know better.

A GPU target's refusals are warned about grouped: one line per (target, op type, kind of
reason), with the count and one example node, not one line per node.  A node's reason reads
``"<why it runs where it runs> (<target>: <why not>; <target>: <why not>)"``;
``placement_report`` reads the refusals back from the report's steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from optcli.errors import ModelError
from optcli.ir import Graph
from optcli.passes.base import PassContext
from optcli.targets.base import Target

NAME = "place_nodes"
DESCRIPTION = "assign each node to the first valid target that has a kernel for it"


@dataclass(frozen=True)
class Refusal:
    target: str  # the target that refused
    op: str
    kind: str  # short label from the target's explain_refusal: "dynamic shape", "no kernel"...
    detail: str
    node: str
    runs_on: str  # where the node went instead


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    overrides = ctx.placement_overrides
    decisions = ctx.results.placement
    counts: dict[str, int] = {}
    refusals: list[Refusal] = []
    for node in graph.nodes:
        wanted = overrides.get(node.name) or overrides.get(node.op_type)
        candidates = [t for t in ctx.targets if t.name == wanted] + [t for t in ctx.targets if t.name != wanted]
        rejected: list[tuple[Target, str]] = []
        for target in candidates:
            ok, reason = target.can_run(node, graph)
            if ok:
                node.target = target.name
                if rejected:
                    reason = f"{reason} ({_refused(rejected)})"
                refusals += [Refusal(t.name, node.op_type, *t.explain_refusal(why), node.name, target.name)
                             for t, why in rejected if t.device == "gpu"]
                decisions[node.name] = {"target": target.name, "reason": reason}
                break
            rejected.append((target, reason))
        else:
            raise ModelError(f"{node.describe()}: no target can run it ({_refused(rejected)}); "
                             "the op is not a standard ONNX op, or its domain is unsupported")
        counts[node.target] = counts.get(node.target, 0) + 1
    for group in group_refusals(refusals):
        ctx.warn(refusal_warning(group))
    return counts


def _refused(rejected: list[tuple[Target, str]]) -> str:
    return "; ".join(f"{t.name}: {why}" for t, why in rejected)


def group_refusals(refusals: list[Refusal]) -> list[dict]:
    """One entry per (target, op, kind) in order of first appearance: ``{"target", "op",
    "reason", "count", "example", "detail", "runs_on"}`` (``detail``: the example's reason)."""
    groups: dict[tuple[str, str, str], dict] = {}
    for r in refusals:
        g = groups.setdefault((r.target, r.op, r.kind), {
            "target": r.target, "op": r.op, "reason": r.kind, "count": 0, "example": r.node, "detail": r.detail,
            "runs_on": []})
        g["count"] += 1
        if r.runs_on not in g["runs_on"]:
            g["runs_on"].append(r.runs_on)
    return list(groups.values())


def refusal_warning(group: dict) -> str:
    where = " or ".join(group["runs_on"])
    if group["count"] == 1:
        return (f"{group['op']} node '{group['example']}' cannot run on {group['target']}: {group['reason']} "
                f"({group['detail']}); it runs on {where}")
    return (f"{group['count']} {group['op']} nodes cannot run on {group['target']}: {group['reason']} "
            f"(e.g. '{group['example']}': {group['detail']}); they run on {where}")


def parse_refusals(step: dict, gpu_targets: dict) -> list[Refusal]:
    """The GPU refusals a report step's reason quotes (see the module docstring for its form);
    ``gpu_targets`` maps the plan's GPU target names to their ``Target``."""
    reason = step.get("reason") or ""
    if not gpu_targets or not reason.endswith(")"):
        return []
    names = "|".join(re.escape(n) for n in gpu_targets)
    start = re.search(rf" \((?=(?:{names}): )", reason)
    if start is None:
        return []
    out = []
    for part in re.split(rf"; (?=(?:{names}): )", reason[start.end():-1]):
        name, why = part.split(": ", 1)
        out.append(Refusal(name, step["op"], *gpu_targets[name].explain_refusal(why), step["name"], step["target"]))
    return out


def placement_report(report: dict) -> dict:
    """What ``opt --report`` adds about placement: steps per target (every plan step, copies
    included, in plan target order) and the GPU refusals grouped as in the warnings."""
    from optcli.targets import TARGETS

    per_target = {t: 0 for t in report["targets"]}
    for s in report["steps"]:
        per_target[s["target"]] = per_target.get(s["target"], 0) + 1
    gpu = {t: TARGETS[t] for t in report["targets"] if t in TARGETS and TARGETS[t].device == "gpu"}
    refusals = [r for s in report["steps"] for r in parse_refusals(s, gpu)]
    return {"steps_per_target": per_target, "placement_reasons": group_refusals(refusals)}
