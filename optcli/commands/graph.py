"""Draw a plan as a graph (`optcli inspect --graph`): one box per step, coloured by target, and the
copies and layout conversions (Upload, Pack, Unpack, Download) drawn as edges of their own, so
each crossing between the host and the GPU is one visible, labelled arrow.

Graphviz's `dot` renders SVG or PNG when it is installed; otherwise the DOT text is written.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from optcli.errors import UsageError
from optcli.plan import Plan

COLOURS = {"opencl": "#9fd39f", "metal": "#a7c7e7", "arm": "#f4c99b"}
COPY_OPS = ("Upload", "Pack", "Unpack", "Download")


def _quote(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def to_dot(plan: Plan) -> str:
    lines = [f"digraph {_quote(plan.name or 'model')} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    source: dict[str, tuple[str, list[str]]] = {}  # value -> (drawn node id, copies on the way)
    for k, v in enumerate(plan.inputs):
        node = f"in{k}"
        lines.append(_io_node(node, v))
        source[v.name] = (node, [])
    for i, s in enumerate(plan.steps):
        if s.domain == "optcli" and s.op_type in COPY_OPS:
            origin, via = source.get(s.inputs[0], (None, []))
            if origin is not None:
                source[s.outputs[0]] = (origin, [*via, s.op_type])
            continue
        node = f"s{i}"
        colour = COLOURS.get(s.target, "#dddddd")
        label = f"{s.name}\\n{s.op_type} [{s.kernel.rsplit('.', 1)[-1]}]"
        lines.append(f"  {node} [fillcolor={_quote(colour)}, label={_quote(label)}];")
        for name in s.inputs:
            if name in source:
                lines.append(_edge(source[name], node))
        for name in s.outputs:
            if name:
                source[name] = (node, [])
    for k, v in enumerate(plan.outputs):
        node = f"out{k}"
        lines.append(_io_node(node, v))
        if v.name in source:
            lines.append(_edge(source[v.name], node))
    for t in plan.targets:  # legend: one swatch per target
        lines.append(f"  legend_{t} [shape=note, fillcolor={_quote(COLOURS.get(t, '#dddddd'))}, label={_quote(t)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _io_node(node: str, v) -> str:
    label = _quote(v.name + "\\n" + str(list(v.shape or [])))
    return f"  {node} [shape=ellipse, style=filled, fillcolor=white, label={label}];"


def _edge(origin: tuple[str, list[str]], node: str) -> str:
    start, via = origin
    if not via:
        return f"  {start} -> {node};"
    return f"  {start} -> {node} [color=red, style=bold, fontcolor=red, label={_quote(' + '.join(via))}];"


def write_graph(plan: Plan, path: str) -> tuple[str, str | None]:
    """Write the graph to ``path`` (.dot, .svg or .png); returns (file written, note or None)."""
    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("dot", "gv", "svg", "png"):
        raise UsageError(f"--graph: {path} must end in .svg, .png or .dot")
    text = to_dot(plan)
    if fmt in ("dot", "gv"):
        _write(out, text.encode())
        return str(out), None
    dot = shutil.which("dot")
    if dot is None:
        dot_path = out.with_suffix(".dot")
        _write(dot_path, text.encode())
        return str(dot_path), (f"graphviz's `dot` is not installed, so {out.name} was not drawn; wrote the graph as "
                               f"DOT text to {dot_path} (render it with `dot -T{fmt} {dot_path} -o {out}`, or "
                               "install graphviz: apt install graphviz / brew install graphviz)")
    result = subprocess.run([dot, f"-T{fmt}"], input=text.encode(), capture_output=True, timeout=120)
    if result.returncode != 0:
        raise UsageError(f"--graph: graphviz failed: {result.stderr.decode(errors='replace').strip()[:200]}")
    _write(out, result.stdout)
    return str(out), None


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise UsageError(f"--graph: cannot write {path}: {exc.strerror}") from None
