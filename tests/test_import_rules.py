"""The house rule: every room of ``optcli/`` imports only from its own floor or the floors below.

The floors are the table in docs/design.md ("The floors"), read here, so the documentation and the
rule cannot drift apart.  Every import counts, the ones inside functions too: a deferred import is
still a dependency.  Checked:

- every module is in a room the table names (a new file names its floor to pass);
- no import runs up a floor;
- no circle: neither between rooms nor between modules;
- the peers that never import each other (``passes/`` and ``runtime/``, the runtime's backends);
- no side-effect imports (``noqa: F401``): registries fill themselves.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "optcli"
DESIGN = ROOT / "docs" / "design.md"

# (importer, imported) by path prefix: imports that never happen although the floors allow them.  The
# compiler and the runtime are peers; no runtime backend knows another, the host path knows no GPU, and
# what the GPU backends share knows none of them.
NEVER = [("passes/", "runtime/"), ("runtime/", "passes/"),
         ("runtime/opencl/", "runtime/metal/"), ("runtime/metal/", "runtime/opencl/"),
         ("runtime/host/", "runtime/opencl/"), ("runtime/host/", "runtime/metal/"),
         ("runtime/host/", "runtime/gpu_common/"),
         ("runtime/gpu_common/", "runtime/opencl/"), ("runtime/gpu_common/", "runtime/metal/")]


def floors_table(text: str) -> dict[str, int]:
    """room -> floor from design.md's floors table: ``optcli/`` paths ("ops/" a folder, "ir.py" a module)."""
    start = text.index("<!-- floors:")
    rooms: dict[str, int] = {}
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rooms:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not cells[0].isdigit():
            continue
        for room in re.findall(r"`([^`]+)`", cells[1]):
            rooms[room] = int(cells[0])
    return rooms


ROOMS = floors_table(DESIGN.read_text())


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room_of(module: str) -> str | None:
    """The most specific room of the table holding ``module`` (None: the table does not name it)."""
    rel = MODULES[module].relative_to(PACKAGE).as_posix()
    best = None
    for room in ROOMS:
        if rel == room or (room.endswith("/") and rel.startswith(room)):
            if best is None or len(room) > len(best):
                best = room
    return best


def imports_of(module: str) -> list[tuple[str, int, str]]:
    """(imported optcli module, line, source line) for every import in ``module``, nested ones included;
    ``from package import name`` counts as the submodule ``package.name`` where that is a module."""
    path = MODULES[module]
    text = path.read_text()
    lines = text.splitlines()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        for target in targets:
            entry = (target, node.lineno, lines[node.lineno - 1].strip())
            if target in MODULES and target != module and entry not in found:
                found.append(entry)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_the_table_is_read():
    assert ROOMS.get("ir.py") == 0 and ROOMS.get("runtime/") == 5 and ROOMS.get("cli.py") == 7, ROOMS
    for room in ROOMS:
        assert (PACKAGE / room).exists(), f"docs/design.md's floors table names {room}, which optcli/ does not have"


def test_every_module_names_its_floor():
    homeless = [str(MODULES[m].relative_to(ROOT)) for m in MODULES if room_of(m) is None]
    assert not homeless, (f"{homeless}: not in any room of docs/design.md's floors table; add the file, or "
                          "its folder, to the floor it belongs on")


def test_no_import_runs_up_a_floor():
    climbs = []
    for module, imports in GRAPH.items():
        here = ROOMS[room_of(module)]
        for target, line, source in imports:
            there = ROOMS[room_of(target)]
            if there > here:
                climbs.append(f"{MODULES[module].relative_to(ROOT)}:{line} (floor {here}) imports {target} "
                              f"(floor {there}): {source}")
    assert not climbs, "imports that run up the floors:\n" + "\n".join(climbs)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_between_modules():
    graph = {m: {t for t, _, _ in imports} for m, imports in GRAPH.items()}
    assert not _cycles(graph), f"modules that import each other (a circle): {_cycles(graph)}"


def test_no_import_circle_between_rooms():
    graph: dict[str, set[str]] = {room: set() for room in ROOMS}
    for module, imports in GRAPH.items():
        for target, _, _ in imports:
            if room_of(target) != room_of(module):
                graph[room_of(module)].add(room_of(target))
    assert not _cycles(graph), f"rooms that import each other (a circle): {_cycles(graph)}"


@pytest.mark.parametrize("importer, imported", NEVER)
def test_peers_keep_apart(importer, imported):
    def inside(module: str, room: str) -> bool:
        return MODULES[module].relative_to(PACKAGE).as_posix().startswith(room)

    crossings = [f"{MODULES[m].relative_to(ROOT)}:{line}: {source}" for m, imports in GRAPH.items()
                 for target, line, source in imports if inside(m, importer) and inside(target, imported)]
    assert not crossings, f"{importer} never imports {imported} (peers keep apart):\n" + "\n".join(crossings)


def test_no_import_for_its_side_effect():
    found = []
    for path in MODULES.values():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                segment = text.splitlines()[node.lineno - 1:node.end_lineno]
                if any(re.search(r"noqa:\s*F401", line) for line in segment):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, ("imports kept only for their side effect (registries fill themselves on their first "
                       f"lookup): {found}")


def test_the_rule_catches_a_climb(tmp_path, monkeypatch):
    """The checks above can fail: an ``ops`` module importing the runtime is reported."""
    fake = PACKAGE / "ops" / "conv.py"
    original = GRAPH[module_name(fake)]
    monkeypatch.setitem(GRAPH, module_name(fake), [*original, ("optcli.runtime.predictor", 1, "import (planted)")])
    with pytest.raises(AssertionError, match="run up the floors"):
        test_no_import_runs_up_a_floor()
    monkeypatch.setitem(GRAPH, "optcli.runtime.predictor",
                        [*GRAPH["optcli.runtime.predictor"], ("optcli.passes.pipeline", 1, "import (planted)")])
    with pytest.raises(AssertionError, match="peers keep apart"):
        test_peers_keep_apart("runtime/", "passes/")
    monkeypatch.setitem(GRAPH, "optcli.ops.registry", [("optcli.ops.conv", 1, "import (planted)")])
    with pytest.raises(AssertionError, match="circle"):
        test_no_import_circle_between_modules()
