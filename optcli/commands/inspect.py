"""`optcli inspect MODEL.nb`: what a `.nb` holds, read from the file alone (no device needed).

Header and versions, file size by part, inputs and outputs, ops per target, the kernel and launch
grid of every step, the copies and layout conversions, peak activation memory; ``--advise`` adds
the performance advice, ``--graph`` draws the placed graph, ``--json`` prints it all as JSON.
"""

from __future__ import annotations

import json

import click
import numpy as np

from optcli.commands.common import CONTEXT, clip, human_bytes, table
from optcli.nb.layout import CHECKSUM_SIZE, HEADER_SIZE
from optcli.plan import Plan
from optcli.targets import TARGETS

COPY_OPS = ("Upload", "Pack", "Unpack", "Download")


class _DryLaunchContext:
    """A ``LaunchContext`` that only answers shapes: enough to compute each launch's grid."""

    def __init__(self, plan: Plan, precision: str):
        self.plan, self.precision = plan, precision

    def shape(self, name):
        if name in self.plan.weights:
            return tuple(self.plan.weights[name].shape)
        return tuple(self.plan.values[name].shape)

    def const(self, name):
        return self.plan.weights.get(name) if name else None

    def tensor(self, name):
        from optcli.gpu.registry import TensorRef

        return TensorRef(name)

    def weight(self, key, array):
        from optcli.gpu.registry import WeightRef

        return WeightRef(key)

    def temp(self, key, elements):
        from optcli.gpu.registry import TempRef

        return TempRef(key)


def launches(plan: Plan) -> dict[int, list[dict]]:
    """GPU steps' launches: kernel entry, global and local size (from the plan's shapes)."""
    from optcli.gpu.registry import get_gpu_kernel

    ctx = _DryLaunchContext(plan, plan.metadata.get("precision", "fp32"))
    out: dict[int, list[dict]] = {}
    for i, s in enumerate(plan.steps):
        if TARGETS[s.target].device != "gpu" or s.op_type in ("Upload", "Download"):
            continue
        kern = get_gpu_kernel(s.kernel)
        try:
            out[i] = [{"entry": la.entry, "source": la.source, "global_size": list(la.global_size),
                       "local_size": list(la.local_size) if la.local_size else None}
                      for la in kern.launch(ctx, s)]
        except Exception:  # dynamic shapes: the grid is known only at run time
            out[i] = []
    return out


def _nbytes(plan: Plan, name: str) -> int | None:
    v = plan.values.get(name)
    return v.nbytes() if v is not None else None


def describe(plan: Plan, header: dict, path: str) -> dict:
    """Everything `inspect` shows, as a JSON-ready dict."""
    grids = launches(plan)
    by_dtype: dict[str, int] = {}
    for w in plan.weights.values():
        by_dtype[w.dtype.name] = by_dtype.get(w.dtype.name, 0) + int(w.nbytes)
    weights = sum(by_dtype.values())
    ops: dict[str, dict[str, int]] = {}
    steps, copies = [], []
    for i, s in enumerate(plan.steps):
        if s.domain == "optcli" and s.op_type in COPY_OPS:
            copies.append({"index": i, "name": s.name, "op": s.op_type, "target": s.target,
                           "value": s.inputs[0], "bytes": _nbytes(plan, s.inputs[0])})
        else:
            ops.setdefault(s.op_type, {}).setdefault(s.target, 0)
            ops[s.op_type][s.target] += 1
        steps.append({"index": i, "name": s.name, "op": s.op_type, "target": s.target, "kernel": s.kernel,
                      "fallback": TARGETS[s.target].uses_fallback(s.kernel), "launches": grids.get(i, [])})
    return {
        "file": path,
        "format_version": header["format_version"],
        "tool_version": header["tool_version"],
        "name": plan.name,
        "source": plan.metadata.get("source", ""),
        "precision": plan.metadata.get("precision", "fp32"),
        "targets": plan.targets,
        "sizes": {"file_bytes": header["size"], "header_bytes": HEADER_SIZE, "body_bytes": header["body_length"],
                  "padding_bytes": header["blob_length"] - weights + header["blob_offset"] - HEADER_SIZE
                  - header["body_length"],
                  "weights_bytes": weights, "weights_by_dtype": dict(sorted(by_dtype.items())),
                  "checksum_bytes": CHECKSUM_SIZE},
        "inputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape or [])} for v in plan.inputs],
        "outputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape or [])} for v in plan.outputs],
        "ops": {op: dict(sorted(t.items())) for op, t in sorted(ops.items())},
        "steps": steps,
        "copies": copies,
        "memory": {"peak_activation_bytes": plan.memory.arena_bytes,
                   "naive_activation_bytes": plan.memory.naive_bytes, "dynamic": plan.memory.arena_bytes is None},
        "metadata": dict(plan.metadata),
    }


def _grid(launch_list: list[dict]) -> str:
    if not launch_list:
        return ""
    return " + ".join("x".join(map(str, la["global_size"])) + (f"/{'x'.join(map(str, la['local_size']))}"
                                                                  if la["local_size"] else "")
                      for la in launch_list)


def _kernel(step: dict) -> str:
    if step["launches"]:
        return "+".join(dict.fromkeys(la["entry"] for la in step["launches"]))
    variant = step["kernel"].rsplit(".", 1)[-1]
    return "fallback" if step["fallback"] else variant


def format_text(info: dict) -> str:
    sz = info["sizes"]
    out = [info["file"], f"optcli .nb format v{info['format_version']}, written by optcli {info['tool_version']}",
           f"model '{info['name']}' from {info['source'] or '?'}; targets {', '.join(info['targets'])}; "
           f"precision {info['precision']}", "",
           "size by part:"]
    parts = [["header", human_bytes(sz["header_bytes"])], ["body (plan, msgpack)", human_bytes(sz["body_bytes"])]]
    parts += [[f"weights {dt}", human_bytes(n)] for dt, n in sz["weights_by_dtype"].items()]
    parts += [["alignment padding", human_bytes(sz["padding_bytes"])], ["checksum", human_bytes(sz["checksum_bytes"])],
              ["total", human_bytes(sz["file_bytes"])]]
    out += [table(["part", "size"], parts, right={1}), ""]
    io_rows = [[kind, clip(v["name"], 30), v["dtype"], str(v["shape"])]
               for kind, vs in (("input", info["inputs"]), ("output", info["outputs"])) for v in vs]
    out += [table(["", "name", "dtype", "shape"], io_rows), ""]
    targets = info["targets"]
    op_rows = [[op, *(str(t.get(name, "")) for name in targets)] for op, t in info["ops"].items()]
    out += ["ops per target:", table(["op", *targets], op_rows, right=set(range(1, len(targets) + 1))), ""]
    # Names in full: the blocks of a timm model differ only at the end (/blocks/blocks.0/...)
    step_rows = [[str(s["index"]), s["name"], s["op"], s["target"], clip(_kernel(s), 20),
                  clip(_grid(s["launches"]), 16)] for s in info["steps"]]
    out += ["steps (kernel: GPU function or CPU variant; grid: global[/local] size):",
            table(["#", "node", "op", "target", "kernel", "grid"], step_rows, right={0}), ""]
    if info["copies"]:
        copy_rows = [[str(c["index"]), c["op"], clip(c["value"], 30), human_bytes(c["bytes"])] for c in info["copies"]]
        n_copies = sum(c["op"] in ("Upload", "Download") for c in info["copies"])
        n_layout = len(info["copies"]) - n_copies
        out += [f"copies and layout conversions: {n_copies} host<->device copies, {n_layout} layout conversions",
                table(["#", "step", "value", "size"], copy_rows, right={0, 3}), ""]
    else:
        out += ["copies and layout conversions: none", ""]
    mem = info["memory"]
    if mem["dynamic"]:
        out.append("peak activation memory: depends on the input shapes (dynamic dims; planned per shape at run time)")
    else:
        out.append(f"peak activation memory: {human_bytes(mem['peak_activation_bytes'])} (without reuse "
                   f"{human_bytes(mem['naive_activation_bytes'])})")
    return "\n".join(out)


@click.command(name="inspect", context_settings=CONTEXT)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object (for scripts).")
@click.option("--advise", is_flag=True, help="Add performance advice: what will be slow on the GPU target, why, "
              "at what estimated cost, and which nodes.")
@click.option("--graph", "graph_path", metavar="FILE.svg|.png|.dot", help="Draw the placed graph: nodes coloured "
              "by target, copies as edges of their own. graphviz's `dot` lays it out when installed; without "
              "it an SVG is drawn by optcli's own layout, and for a PNG the .dot text is written beside FILE.")
def inspect_command(model, as_json, advise, graph_path):
    """Show what a .nb file holds: header and versions, size by part, inputs and outputs, ops per
    target, the kernel and launch grid of every step, copies and layout conversions, and peak
    activation memory. Reads the file only: no device is needed.

    \b
    Examples:
      optcli inspect model.nb
      optcli inspect model.nb --advise --graph=model.svg
      optcli inspect model.nb --json > model.json
    """
    from optcli.nb.reader import load_file
    from optcli.runtime.load_checks import check_at_load

    plan, header = load_file(model)
    check_at_load(plan, str(model))  # what load refuses, inspect does not describe (unknown kernels...)
    info = describe(plan, header, model)
    if advise:
        from optcli.advice import advise as advise_plan

        info["advice"] = advise_plan(plan)
    if graph_path:
        from optcli.commands.graph import write_graph

        written, note = write_graph(plan, graph_path)
        info["graph"] = written
        if note:
            click.echo(f"optcli inspect: {note}", err=True)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=_json_default))
        return
    click.echo(format_text(info))
    if advise:
        from optcli.advice import format_advice

        click.echo("\n" + format_advice(info["advice"]))
    if graph_path:
        click.echo(f"\ngraph: {info['graph']}")


def _json_default(x):
    if isinstance(x, np.integer):
        return int(x)
    raise TypeError(type(x).__name__)
