"""Nominal sizes for symbolic dims: how the compiler judges a graph whose shapes are dynamic.

A GPU kernel's ``check`` and ``cost`` and the cost model of ``keep_small_islands_on_host`` read
sizes.  With a symbolic dim (a dynamic batch, a dynamic image size, a sequence length) there is
none, so the compiler derives the graph's shapes at *nominal* input sizes and judges those:

* ``NOMINAL[0]`` (what the cost model uses): a symbol first seen as an input's dim 0 (a batch) is
  ``NOMINAL_BATCH[0]`` = 1, any other symbol ``NOMINAL_SIZE[0]`` = 64;
* ``NOMINAL[1]``: 2 and 96, a second assignment: a GPU node with dynamic dims is placed on the
  GPU only when its kernel accepts *both*, so a check that passes for one size by coincidence
  (a dim that happens to equal another, a 1 that broadcasts) does not decide placement.

64 and 96 are multiples of 32, so models whose image sizes must divide by their total stride
(detectors, U-Nets) derive at both.  A symbol shared by several inputs gets one value.  With
``--input_shapes`` the frontend pins every dim and nothing here is used.

The runtime does not trust this judgment: it derives the real shapes at each new input shape,
runs every GPU step's ``check`` on them again, and runs that call on the host when one refuses
(``optcli.runtime.gpu_common.bind_shapes``).
"""

from __future__ import annotations

import dataclasses
import weakref

from optcli.ir import Dim, Graph, Value
from optcli.ops.shape_derivation import derive_shapes, is_concrete

NOMINAL_BATCH = (1, 2)
NOMINAL_SIZE = (64, 96)
NOMINAL_COUNT = len(NOMINAL_SIZE)

# id(graph) -> (weak reference, fingerprint, views): placement, the cost model and kernel selection
# ask about the same graph node after node (graphs compare by value, so they are not dict keys)
_CACHE: dict[int, tuple] = {}


def nominal_input_shapes(graph: Graph, which: int = 0) -> dict[str, tuple[int, ...]]:
    """Each graph input's shape with its symbolic dims at nominal assignment ``which``."""
    symbols: dict[Dim, int] = {}
    shapes = {}
    for v in graph.inputs:
        if v.shape is None:
            continue
        dims = []
        for axis, d in enumerate(v.shape):
            if isinstance(d, int):
                dims.append(d)
                continue
            size = (NOMINAL_BATCH if axis == 0 else NOMINAL_SIZE)[which]
            if d is None:  # unnamed: a symbol of its own
                dims.append(size)
            else:
                dims.append(symbols.setdefault(d, size))
        shapes[v.name] = tuple(dims)
    return shapes


def _fingerprint(graph: Graph) -> tuple:
    return (len(graph.nodes), len(graph.values), len(graph.initializers),
            tuple((v.name, v.shape) for v in graph.inputs))


def nominal_views(graph: Graph) -> list[Graph] | None:
    """The graph at each nominal assignment (the same nodes and constants, values with concrete
    shapes where the derivation gives them; a value it cannot derive keeps its symbolic shape), or None
    when the graph's shapes are all static or cannot be derived at all."""
    cached = _CACHE.get(id(graph))
    key = _fingerprint(graph)
    if cached is not None and cached[0]() is graph and cached[1] == key:
        return cached[2]
    views = _derive_views(graph)
    for stale in [k for k, (ref, _, _) in _CACHE.items() if ref() is None]:
        del _CACHE[stale]
    _CACHE[id(graph)] = (weakref.ref(graph), key, views)
    return views


def _derive_views(graph: Graph) -> list[Graph] | None:
    if all(v.is_static for v in graph.inputs) and not any(
            v.shape is not None and not is_concrete(v.shape) for v in graph.values.values()):
        return None
    views = []
    for which in range(NOMINAL_COUNT):
        pinned = nominal_input_shapes(graph, which)
        try:
            derived = _derive_with_data_points(graph, pinned, which)
        except Exception:  # noqa: BLE001 - no nominal sizes: dynamic nodes stay where static checks put them
            return None
        values = {}
        for name, value in graph.values.items():
            shape = pinned.get(name) or derived.get(name)
            if is_concrete(shape) and _agrees(value.shape, shape):
                values[name] = Value(name, value.dtype, tuple(shape))
            else:
                values[name] = value
        inputs = [values.get(v.name, v) for v in graph.inputs]
        outputs = [values.get(v.name, v) for v in graph.outputs]
        views.append(dataclasses.replace(graph, values=values, inputs=inputs, outputs=outputs))
    return views


def _derive_with_data_points(graph: Graph, pinned: dict[str, tuple[int, ...]], which: int) -> dict:
    """Shapes at nominal input sizes, with data-dependent sizes nominal too.

    A node whose inputs all have sizes but whose output's size does not follow from them (a
    Slice or Range whose bounds are run-time values, NonZero, a Reshape to a computed shape) is a
    *data point*: the runtime learns that size when the node has run, and binds the GPU steps
    after it then (``runtime.opencl.steps``).  Here its unknown dims are given the nominal size
    (``NOMINAL_SIZE[which]``) and the derivation goes on from there, so the GPU nodes downstream
    are judged like those of any dynamic graph.  At most ``MAX_DATA_POINTS`` are pinned."""
    inputs = {v.name: (v.dtype, pinned.get(v.name, v.shape)) for v in graph.inputs}
    nodes = list(graph.nodes)
    outputs = [v.name for v in graph.outputs]
    derived = derive_shapes(nodes, inputs, graph.initializers, graph.opsets, outputs)
    for _ in range(MAX_DATA_POINTS):
        point = _first_data_point(nodes, graph, inputs, derived, NOMINAL_SIZE[which])
        if point is None:
            break
        node, shapes = point
        for name, shape in shapes.items():
            inputs[name] = (graph.dtype_of(name), shape)
        nodes.remove(node)
        derived = derive_shapes(nodes, inputs, graph.initializers, graph.opsets, outputs)
    return {**derived, **{k: v for k, (_, v) in inputs.items() if v is not None}}


MAX_DATA_POINTS = 8


def _first_data_point(nodes, graph: Graph, inputs: dict, derived: dict, size: int):
    """(node, {output: shape with its unknown dims at ``size``}) of the first node whose inputs
    all have sizes and one of whose outputs has a known rank but no derived size; None if none."""
    def sized(name: str) -> bool:
        if not name or name in graph.initializers:
            return True
        return is_concrete(inputs[name][1] if name in inputs else derived.get(name))

    for node in nodes:
        if node.proto is not None or not all(sized(i) for i in node.inputs):
            continue
        shapes = {}
        for name in node.outputs:
            shape = (derived.get(name) or graph.shape_of(name)) if name else None
            if not name or is_concrete(shape):
                continue
            if shape is None:
                return None  # its rank is unknown too: nothing after it can be judged
            shapes[name] = tuple(d if isinstance(d, int) and d > 0 else size for d in shape)
        if shapes:
            return node, shapes
    return None


def _agrees(declared: tuple[Dim, ...] | None, derived: tuple[int, ...]) -> bool:
    """Derived sizes replace symbols only: a rank or fixed dim the graph declares otherwise, or a
    size below 1, means the derivation is wrong for this value (the value stays dynamic)."""
    if any(d < 1 for d in derived):
        return False
    if declared is None:
        return True
    return len(declared) == len(derived) and all(not isinstance(a, int) or a == b for a, b in zip(declared, derived))


def has_symbolic(graph: Graph, names) -> bool:
    """Whether any of the (non-constant) values ``names`` has a dim that is not a fixed size."""
    for name in names:
        if name and name not in graph.initializers:
            shape = graph.shape_of(name)
            if shape is not None and not is_concrete(shape):
                return True
    return False
