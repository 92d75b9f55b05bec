"""Value shapes derived from input shapes, for graphs and plans with dynamic dims.

The compiler needs sizes for a graph whose inputs have symbolic dims (GPU kernel checks and the
cost model judge nominal sizes, ``optcli.targets.nominal``), and the runtime needs every value's
shape: at ``load`` symbolically, to compare with what the file records
(``optcli.runtime.plan_shapes``), and at ``run`` from the concrete input shapes before it sizes a
buffer or a launch grid (``optcli.runtime.gpu_common.bind_shapes``).  Both come from ``derive_shapes``: one
pass over the nodes in order, each node's outputs from its op's shape function
(``optcli.ops.shape_functions``, registered beside each op), with the inputs pinned and *nothing*
recorded about intermediate values used (a file's recorded shapes are checked against the
derivation, never its source).  No onnx here: the derivation is ours, bounded, and the same on
the compiler and the runtime side.

Shape arithmetic (Shape -> Gather -> Concat -> Reshape, a Slice whose end is a sequence length)
is followed two ways: small integer values that become known are evaluated with the ops' own
numpy kernels (never a large or random one), and 1-D shape values whose elements are only partly
known (``Shape`` of ``[N, 3, 224, 224]``) are carried as dims, so a Reshape to ``[N, -1]`` keeps
its ``N``.  A node with subgraphs (Loop, If, Scan run by the reference fallback) or with no shape
function leaves its outputs unknown (rank too): the run computes them, and the runtime treats
them as data-dependent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Dim, Node
from optcli.ops.shape_functions import ShapeArgs, ShapeDerivationError, is_int, shape_fn_for

__all__ = ["SMALL_CONSTANT", "ShapeDerivationError", "derive_shapes", "is_concrete"]

SMALL_CONSTANT = 4096  # elements: values up to this size are evaluated (shape arithmetic), larger ones never
NEWEST_OPSET = 21  # a plan that names no default-domain opset: the shape functions read current semantics

# Ops whose outputs' sizes follow from data, at most a small multiple of their (small, known)
# inputs' sizes: evaluated although their shape function cannot size them.
_BOUNDED_BY_INPUTS = ("NonZero",)
_NOT_FOLDED = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
               "Bernoulli")
# A shape function that trips over attributes it cannot read (a crafted file): the outputs stay
# unknown and the kernel judges them at run; inconsistent shapes are ShapeDerivationError instead.
_UNREADABLE = (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, AttributeError)


def derive_shapes(nodes: list[Node], inputs: dict[str, tuple[str, tuple[Dim, ...] | None]],
                  constants: dict[str, np.ndarray], opsets: dict[str, int], outputs: list[str],
                  strict: bool = False, problems: list[str] | None = None) -> dict[str, tuple[Dim, ...]]:
    """name -> shape of every value ``nodes`` compute (and of the inputs and constants), from the
    ``inputs`` ({name: (dtype, shape)}) and the constants (small integer ones by value).  Dims
    that do not follow from them are symbols or None; a value whose rank is unknown is left out.

    A node whose input shapes do not fit its op raises ``ShapeDerivationError`` with ``strict``,
    its message naming the node as ``(op_type:Conv, node name: conv1): ...``; else its outputs
    stay unknown and the message is appended to ``problems`` (when given).  ``outputs`` is kept
    for the callers' sake: every value is derived anyway.

    The work is bounded by the number of nodes: each is visited once, and a node is evaluated
    only when its inputs are known small values and its outputs' derived shapes hold at most
    ``SMALL_CONSTANT`` elements (a small constant can ask for terabytes: Expand, Range, Tile)."""
    del outputs
    opset = int(opsets.get("", 0) or opsets.get("ai.onnx", 0) or NEWEST_OPSET)
    shapes: dict[str, tuple[Dim, ...] | None] = {}
    known: dict[str, np.ndarray] = {}
    dims: dict[str, tuple[Dim, ...]] = {}
    for name, array in constants.items():
        shapes[name] = tuple(int(d) for d in np.shape(array))
        if np.size(array) <= SMALL_CONSTANT and np.asarray(array).dtype != object:
            known[name] = np.asarray(array)
    for name, (_, shape) in inputs.items():
        if shape is not None or name not in shapes:
            # A negative dim (paddle2onnx's -1) is a dynamic one, unnamed.
            shapes[name] = None if shape is None else tuple(None if is_int(d) and d < 0 else _dim(d) for d in shape)
    for node in nodes:
        outs = _node_shapes(node, shapes, known, dims, opset, strict, problems)
        for name, shape in zip(node.outputs, outs):
            if name:
                shapes[name] = shape
        _evaluate(node, shapes, known, dims, opset)
    return {name: shape for name, shape in shapes.items() if shape is not None}


def _dim(d: Any) -> Dim:
    if type(d) is int or type(d) is str:
        return d
    return int(d) if is_int(d) else None


def _node_shapes(node: Node, shapes: dict, known: dict, dims: dict, opset: int, strict: bool,
                 problems: list[str] | None) -> list:
    """The node's output shapes from its shape function ([] when it has none or they are unknown)."""
    fn = shape_fn_for(node.op_type, node.domain)  # no op with graph attributes (Loop, If, Scan) has one
    if fn is None:
        return []
    present = [bool(i) for i in node.inputs]
    args = ShapeArgs([shapes.get(i) if i else None for i in node.inputs],
                     [known.get(i) if i else None for i in node.inputs],
                     {k: v for k, v in node.attrs.items() if not k.startswith("_")}, opset, present,
                     [dims.get(i) if i else None for i in node.inputs], len(node.outputs), node.op_type)
    try:
        result = fn(args)
    except ShapeDerivationError as exc:
        message = f"(op_type:{node.op_type}, node name: {node.name}): {exc}"
        if strict:
            raise ShapeDerivationError(message) from None
        if problems is not None:
            problems.append(message)
        return []
    except _UNREADABLE:
        return []
    return [None if s is None else tuple(_dim(d) for d in s) for s in result]


def _evaluate(node: Node, shapes: dict, known: dict, dims: dict, opset: int) -> None:
    """Record the node's outputs as known values when they are small and computable (see the module
    docstring), else as partly known dims where shape arithmetic allows."""
    if node.proto is not None or not node.outputs or node.op_type in _NOT_FOLDED:
        return
    if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
        shape = shapes.get(node.inputs[0]) if node.inputs else None
        if shape is not None:
            end = node.attrs.get("end")
            part = shape[int(node.attrs.get("start", 0)):None if end is None else int(end)]
            _record_dims(node.outputs[0], part, shapes, known, dims)
        return
    if (node.inputs or node.op_type == "Constant") and all(i in known for i in node.inputs if i) and (
            all(_small(shapes.get(o)) for o in node.outputs if o) or node.op_type in _BOUNDED_BY_INPUTS):
        if _fold(node, shapes, known, opset):
            return
    _propagate_dims(node, shapes, known, dims)


def _fold(node: Node, shapes: dict, known: dict, opset: int) -> bool:
    from optcli.ops.registry import kernels_for

    generic = [k for k in kernels_for(node.op_type, node.domain) if k.applies is None]
    if not generic:
        return False
    attrs = {**node.attrs, "_opset": opset, "_n_outputs": len(node.outputs)}
    try:
        results = generic[0].fn([known[i] if i else None for i in node.inputs], attrs)
        arrays = [np.asarray(r) for r in results[:len(node.outputs)]]
    except Exception:  # noqa: BLE001 - what does not evaluate is left to the run to judge
        return False
    if len(arrays) < len([o for o in node.outputs if o]) or any(a.size > SMALL_CONSTANT or a.dtype == object
                                                                for a in arrays):
        return False
    for name, array in zip(node.outputs, arrays):
        if name:
            known[name] = array
            shapes[name] = tuple(int(d) for d in array.shape)  # data-dependent sizes too, now known
    return True


def _record_dims(name: str, values: tuple, shapes: dict, known: dict, dims: dict) -> None:
    """A 1-D (or 0-D) integer value whose elements are dims: known when they are all fixed."""
    if all(is_int(d) for d in values) and shapes.get(name) is not None:
        shape = shapes[name]
        if all(is_int(d) for d in shape) and int(np.prod(shape, dtype=np.int64)) == len(values):
            known[name] = np.array([int(d) for d in values], np.int64).reshape(shape)
            return
    dims[name] = tuple(values)


def _elements(name: str, known: dict, dims: dict) -> tuple[Dim, ...] | None:
    if not name:
        return None
    if name in known:
        a = known[name]
        return tuple(int(v) for v in a.reshape(-1)) if a.dtype.kind in "iu" and a.ndim <= 1 else None
    return dims.get(name)


_ARITH = {"Add": (lambda a, b: a + b, 0), "Sub": (lambda a, b: a - b, None), "Mul": (lambda a, b: a * b, 1),
          "Div": (lambda a, b: a // b if b else None, None)}


def _propagate_dims(node: Node, shapes: dict, known: dict, dims: dict) -> None:
    """Shape arithmetic on partly known shape values (what onnx calls data propagation)."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or not node.outputs or not node.outputs[0]:
        return
    op, out = node.op_type, node.outputs[0]
    first = _elements(node.inputs[0], known, dims)
    if op in ("Identity", "Squeeze", "Unsqueeze", "Cast") and first is not None:
        if op != "Cast" or int(node.attrs.get("to", 0)) in (6, 7):  # int32, int64
            _record_dims(out, first, shapes, known, dims)
    elif op == "Concat" and all(_elements(i, known, dims) is not None for i in node.inputs if i):
        _record_dims(out, sum((_elements(i, known, dims) for i in node.inputs if i), ()), shapes, known, dims)
    elif op == "Gather" and first is not None and node.input(1) in known:
        index = known[node.input(1)]
        picked = []
        for i in index.reshape(-1).tolist():
            if not -len(first) <= int(i) < len(first):
                return
            picked.append(first[int(i)])
        _record_dims(out, tuple(picked), shapes, known, dims)
    elif op == "Slice" and first is not None and all(i in known for i in node.inputs[1:] if i) \
            and len(node.inputs) >= 3:
        start, end = (int(known[node.inputs[k]].reshape(-1)[0]) for k in (1, 2))
        step = int(known[node.input(4)].reshape(-1)[0]) if node.input(4) else 1
        if step:
            _record_dims(out, first[start:end:step], shapes, known, dims)
    elif op in _ARITH and len(node.inputs) == 2:
        second = _elements(node.inputs[1], known, dims)
        if first is None or second is None or (len(first) != len(second) and 1 not in (len(first), len(second))):
            return
        n = max(len(first), len(second))
        a, b = (first * n if len(first) == 1 else first), (second * n if len(second) == 1 else second)
        _record_dims(out, tuple(_arith(op, x, y) for x, y in zip(a, b)), shapes, known, dims)


def _arith(op: str, a: Dim, b: Dim) -> Dim:
    fn, unit = _ARITH[op]
    if is_int(a) and is_int(b):
        return fn(int(a), int(b))
    if is_int(b) and (b == unit or (op in ("Sub", "Div") and b == (0 if op == "Sub" else 1))):
        return a
    if is_int(a) and a == unit and op in ("Add", "Mul"):
        return b
    return None


def _small(shape: Any) -> bool:
    """A known shape of at most ``SMALL_CONSTANT`` elements."""
    if not is_concrete(shape):
        return False
    count = 1
    for d in shape:
        count *= d
    return count <= SMALL_CONSTANT


def is_concrete(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
