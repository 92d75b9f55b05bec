"""Draw a plan as a graph (`optcli inspect --graph`): one box per step, coloured by target, and the
copies and layout conversions (Upload, Pack, Unpack, Download) drawn as edges of their own, so
each crossing between the host and the GPU is one visible, labelled arrow.

Graphviz's `dot` renders SVG or PNG when it is installed; without it an SVG is drawn by our own
layered layout (``to_svg``), and a PNG request writes the DOT text.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from optcli.errors import UsageError
from optcli.plan import Plan

COLOURS = {"opencl": "#9fd39f", "metal": "#a7c7e7", "arm": "#f4c99b"}
COPY_OPS = ("Upload", "Pack", "Unpack", "Download")


def _quote(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


@dataclass
class _Box:
    id: str
    lines: list[str]
    colour: str
    shape: str  # "box", "ellipse" (an input or output), "note" (the legend)


def _drawing(plan: Plan) -> tuple[list[_Box], list[tuple[str, str, str]]]:
    """The boxes and the edges (from, to, label: the copies on the way, '' for none) both renderers draw."""
    boxes: list[_Box] = []
    edges: list[tuple[str, str, str]] = []
    source: dict[str, tuple[str, list[str]]] = {}  # value -> (drawn box id, copies on the way)
    for k, v in enumerate(plan.inputs):
        boxes.append(_Box(f"in{k}", [v.name, str(list(v.shape or []))], "#ffffff", "ellipse"))
        source[v.name] = (f"in{k}", [])
    for i, s in enumerate(plan.steps):
        if s.domain == "optcli" and s.op_type in COPY_OPS:
            origin, via = source.get(s.inputs[0], (None, []))
            if origin is not None:
                source[s.outputs[0]] = (origin, [*via, s.op_type])
            continue
        boxes.append(_Box(f"s{i}", [s.name, f"{s.op_type} [{s.kernel.rsplit('.', 1)[-1]}]"],
                          COLOURS.get(s.target, "#dddddd"), "box"))
        for name in s.inputs:
            if name in source:
                origin, via = source[name]
                edges.append((origin, f"s{i}", " + ".join(via)))
        for name in s.outputs:
            if name:
                source[name] = (f"s{i}", [])
    for k, v in enumerate(plan.outputs):
        boxes.append(_Box(f"out{k}", [v.name, str(list(v.shape or []))], "#ffffff", "ellipse"))
        if v.name in source:
            origin, via = source[v.name]
            edges.append((origin, f"out{k}", " + ".join(via)))
    for t in plan.targets:  # legend: one swatch per target
        boxes.append(_Box(f"legend_{t}", [t], COLOURS.get(t, "#dddddd"), "note"))
    return boxes, edges


def to_dot(plan: Plan) -> str:
    boxes, edges = _drawing(plan)
    lines = [f"digraph {_quote(plan.name or 'model')} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for b in boxes:
        label = _quote("\\n".join(b.lines))
        if b.shape == "box":
            lines.append(f"  {b.id} [fillcolor={_quote(b.colour)}, label={label}];")
        elif b.shape == "ellipse":
            lines.append(f"  {b.id} [shape=ellipse, style=filled, fillcolor=white, label={label}];")
        else:
            lines.append(f"  {b.id} [shape=note, fillcolor={_quote(b.colour)}, label={label}];")
    for start, end, via in edges:
        if via:
            lines.append(f"  {start} -> {end} [color=red, style=bold, fontcolor=red, label={_quote(via)}];")
        else:
            lines.append(f"  {start} -> {end};")
    lines.append("}")
    return "\n".join(lines) + "\n"


CHAR_W, LINE_H, PAD, GAP_X, GAP_Y = 6.6, 14, 8, 24, 46


def to_svg(plan: Plan) -> str:
    """The same drawing as an SVG of our own, for machines without graphviz: a layered layout (a
    box one layer below the lowest box it reads from, boxes of a layer side by side, layers
    centred), straight edges, copies in red with their names."""
    boxes, edges = _drawing(plan)
    flow = [b for b in boxes if b.shape != "note"]
    layer: dict[str, int] = {}
    preds: dict[str, list[str]] = {}
    for start, end, _ in edges:
        preds.setdefault(end, []).append(start)
    for b in flow:  # boxes come in plan order: every reader after what it reads
        layer[b.id] = 1 + max((layer.get(p, 0) for p in preds.get(b.id, [])), default=-1)
    rows: dict[int, list[_Box]] = {}
    for b in flow:
        rows.setdefault(layer[b.id], []).append(b)
    size = {b.id: (max(len(line) for line in b.lines) * CHAR_W + 2 * PAD, len(b.lines) * LINE_H + PAD)
            for b in boxes}
    width = max((sum(size[b.id][0] for b in row) + GAP_X * (len(row) - 1) for row in rows.values()), default=0)
    legend = [b for b in boxes if b.shape == "note"]
    width = max(width, sum(size[b.id][0] + GAP_X for b in legend)) + 2 * GAP_X
    pos: dict[str, tuple[float, float]] = {}  # top-left corners
    y = GAP_X
    for k in sorted(rows):
        row = rows[k]
        x = (width - (sum(size[b.id][0] for b in row) + GAP_X * (len(row) - 1))) / 2
        for b in row:
            pos[b.id] = (x, y)
            x += size[b.id][0] + GAP_X
        y += max(size[b.id][1] for b in row) + GAP_Y
    x = GAP_X
    for b in legend:
        pos[b.id] = (x, y)
        x += size[b.id][0] + GAP_X
    height = y + (LINE_H + PAD + GAP_X if legend else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="11">',
           f"<title>{escape(plan.name or 'model')}</title>",
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="context-stroke"/></marker></defs>']
    for start, end, via in edges:
        (x0, y0), (w0, h0) = pos[start], size[start]
        (x1, y1), (w1, _) = pos[end], size[end]
        a, b = (x0 + w0 / 2, y0 + h0), (x1 + w1 / 2, y1)
        colour = "#cc0000" if via else "#555555"
        out.append(f'<line x1="{a[0]:.1f}" y1="{a[1]:.1f}" x2="{b[0]:.1f}" y2="{b[1]:.1f}" stroke="{colour}" '
                   f'stroke-width="{2 if via else 1}" marker-end="url(#arrow)"/>')
        if via:
            out.append(f'<text x="{(a[0] + b[0]) / 2 + 4:.1f}" y="{(a[1] + b[1]) / 2:.1f}" fill="#cc0000">'
                       f"{escape(via)}</text>")
    for b in boxes:
        (x, y), (w, h) = pos[b.id], size[b.id]
        if b.shape == "ellipse":
            out.append(f'<ellipse cx="{x + w / 2:.1f}" cy="{y + h / 2:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" '
                       f'fill="{b.colour}" stroke="#333333"/>')
        else:
            rounded = 6 if b.shape == "box" else 0
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rounded}" '
                       f'fill="{b.colour}" stroke="#333333"/>')
        for k, line in enumerate(b.lines):
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + PAD / 2 + (k + 0.8) * LINE_H:.1f}" text-anchor="middle">'
                       f"{escape(line)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
    if dot is None and fmt == "svg":  # our own layout: a picture without graphviz
        _write(out, to_svg(plan).encode())
        return str(out), None
    if dot is None:
        dot_path = out.with_suffix(".dot")
        _write(dot_path, text.encode())
        return str(dot_path), (f"graphviz's `dot` is not installed, so {out.name} was not drawn; wrote the graph as "
                               f"DOT text to {dot_path} (render it with `dot -T{fmt} {dot_path} -o {out}`, or "
                               "install graphviz: apt install graphviz / brew install graphviz; --graph=FILE.svg "
                               "draws without it)")
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
