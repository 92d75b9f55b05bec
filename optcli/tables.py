"""Plain-text tables for the `opt --print_*` flags, readable on an 80-column terminal."""

from __future__ import annotations

import onnx

from optcli.passes import pipeline
from optcli.targets import TARGETS
from optcli.targets.base import Target


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _op_label(domain: str, op: str) -> str:
    return op if not domain else f"{domain}.{op}"


def passes_table() -> str:
    rows = [[str(i + 1), name, desc] for i, (name, desc) in enumerate(pipeline.describe_passes())]
    return _table(["#", "pass", "what it does"], rows)


def supported_ops_table(targets: list[Target]) -> str:
    """Ops with a native kernel on at least one target: x = native; f = generic fallback."""
    ops = sorted({op for t in targets for op in t.supported_ops()}, key=lambda d: (d[0], d[1]))
    rows = [[_op_label(*op), *("x" if op in t.supported_ops() else _fallback_mark(t, op) for t in targets)]
            for op in ops]
    legend = "\nx = native kernel, f = generic fallback (onnx reference), - = not supported"
    return _table(["op", *(t.name for t in targets)], rows) + legend


def _fallback_mark(target: Target, op: tuple[str, str]) -> str:
    return "f" if target.device == "cpu" and onnx.defs.has(op[1], op[0]) else "-"


def all_ops_table(targets: list[Target]) -> str:
    standard = {("", s.name) for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx")}
    ops = sorted(standard | {op for t in targets for op in t.supported_ops()})
    rows = [[_op_label(*op), *("x" if op in t.supported_ops() else _fallback_mark(t, op) for t in targets)]
            for op in ops]
    legend = "\nx = native kernel, f = generic fallback (onnx reference), - = not supported"
    return _table(["op", *(t.name for t in targets)], rows) + legend


def model_ops_table(report: dict) -> str:
    """The optimized model's ops: count per target, kernels, and whether the fallback runs them."""
    by_op: dict[tuple[str, str], dict] = {}
    for s in report["steps"]:
        entry = by_op.setdefault((s["op"], s["target"]), {"count": 0, "kernels": set(), "fallback": False})
        entry["count"] += 1
        variant = s["kernel"].rsplit(".", 1)[-1]
        # If/Loop/Scan keep the reference kernel id in the .nb, but optcli's executor runs them.
        entry["kernels"].add("optcli executor" if "body_ops" in s and not s["fallback"] else variant)
        entry["fallback"] |= s["fallback"]
    rows = [[op, str(e["count"]), target, ",".join(sorted(e["kernels"])), "fallback" if e["fallback"] else ""]
            for (op, target), e in sorted(by_op.items())]
    # The ops inside If/Loop/Scan bodies: each runs optcli's kernel or onnx.reference's, on the host.
    inside: dict[tuple[str, str, str], int] = {}
    for s in report["steps"]:
        for b in s.get("body_ops", ()):
            key = (b["op"], s["op"], b["runs"])
            inside[key] = inside.get(key, 0) + 1
    rows += [[f"  {op} (in {parent} body)", str(n), "arm", runs, "fallback" if runs == "onnx reference" else ""]
             for (op, parent, runs), n in sorted(inside.items())]
    head = (f"model ops after optimization ({report['nodes_before']} nodes -> {report['nodes_after']} steps; "
            f"targets {', '.join(report['targets'])})\n")
    return head + _table(["op", "count", "runs on", "variants", "note"], rows)


def kernels_table(report: dict) -> str:
    rows = [[str(s["index"]), s["name"][:32], s["op"], s["target"], s["kernel"]] for s in report["steps"]]
    return _table(["step", "node", "op", "target", "kernel"], rows)


__all__ = ["passes_table", "supported_ops_table", "all_ops_table", "model_ops_table", "kernels_table", "TARGETS"]


def coverage_markdown() -> str:
    """The op coverage table of docs/targets.md, generated from the kernel registries."""
    from optcli.targets import TARGETS

    targets = [TARGETS["arm"], TARGETS["opencl"]]
    ops = sorted({op for t in targets for op in t.supported_ops()})
    lines = ["| op | arm | opencl / metal (GPU kernel library) |", "| --- | :---: | :---: |"]
    for op in ops:
        marks = ["native" if op in t.supported_ops() else ("fallback" if _fallback_mark(t, op) == "f" else "-")
                 for t in targets]
        lines.append(f"| {_op_label(*op)} | {marks[0]} | {marks[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m optcli.tables > coverage.md
    print(coverage_markdown())
