"""Declared shapes and types are hints, not facts (issue 24, part 4).

A model declares a type and shape for its graph outputs and, in ``value_info``, for intermediate
values; exporters get them wrong (PyTorch 1.9 declared a CRNN's output ``[1, seqlen]`` where the
graph computes ``[W/8, 1, C]``).  onnxruntime warns and runs what the graph computes; we do the
same.  The graph inputs (pinned by ``--input_shapes``) and the initializers are the facts; every
other shape is computed from them:

1. ``set_aside`` takes the declarations of graph outputs and ``value_info`` off the model before
   onnx's inference runs, so a lying one cannot poison what is inferred downstream of it (a
   ``Shape`` of it folded into a Reshape target, a type merged into the next node's).
2. ``restore_where_silent`` puts a declaration back only where inference says nothing (the
   outputs of an op onnx does not know): there it is the only hint, and ``read_model`` infers
   once more so the values after it are shaped too.  A declared type the graph contradicts is
   reported; the computed one stays.
3. ``reconcile`` derives every value's shape with our own shape functions
   (``ops.shape_derivation``, the derivation the runtime checks a ``.nb`` against at load) and
   lets it win wherever what is recorded contradicts it (another rank, another fixed dim, or a
   fixed dim where the graph computes a dynamic one), so the ``.nb`` records what the runtime will
   derive.  A declaration the computed shape contradicts gets a warning naming the value and both
   shapes.  Dims the derivation knows and inference did not are left to the passes (folding
   re-infers to a fixpoint): the frontend corrects, it does not pre-empt them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from optcli.errors import ModelError
from optcli.ir import Dim, Graph
from optcli.ops.shape_derivation import derive_shapes
from optcli.ops.shape_functions import is_int

MAX_VALUE_WARNINGS = 5  # value_info contradictions warned one by one; the rest are counted


@dataclass
class Declaration:
    """What the model declares for one value: where (``graph output`` or ``value``), type, shape."""

    kind: str
    elem_type: int  # onnx TensorProto element type; 0 when not declared
    shape: tuple[Dim, ...] | None  # None when no shape is declared


def set_aside(model: onnx.ModelProto) -> dict[str, Declaration]:
    """Take the declared types and shapes of the main graph's outputs and ``value_info`` off the
    model (in place) and return them.  An output that is a graph input or an initializer keeps
    its declaration: nothing computes it (``to_ir`` takes the input's, the fact)."""
    g = model.graph
    sources = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    declared: dict[str, Declaration] = {}
    kept = []
    for vi in g.value_info:
        if vi.type.HasField("tensor_type") and vi.name not in sources:
            declared[vi.name] = _declaration("value", vi)
        else:
            kept.append(vi)  # sequences, maps, optionals: ours to neither check nor lose
    del g.value_info[:]
    g.value_info.extend(kept)
    for vi in g.output:
        if not vi.type.HasField("tensor_type"):
            continue
        declared[vi.name] = _declaration("graph output", vi)
        if vi.name not in sources:
            vi.type.tensor_type.Clear()
            vi.type.tensor_type.SetInParent()  # still a tensor, of a type inference fills in
    return declared


def restore_where_silent(model: onnx.ModelProto, declared: dict[str, Declaration],
                         warnings: list[str]) -> bool:
    """After inference: each declaration comes back where inference gave no type or no shape;
    a declared type the inferred one contradicts is a warning (the inferred one stays).  A
    declared symbol names a dim inference leaves anonymous.  Returns whether anything came back
    (then inferring again shapes what follows it)."""
    g = model.graph
    inferred = {vi.name: vi for vi in g.value_info}
    inferred.update({vi.name: vi for vi in g.output})
    restored = False
    for name, dec in declared.items():
        vi = inferred.get(name)
        if vi is None:
            if not dec.elem_type and dec.shape is None:
                continue
            vi = g.value_info.add()
            vi.name = name
            inferred[name] = vi
        t = vi.type.tensor_type
        if not t.elem_type and dec.elem_type:
            t.elem_type = dec.elem_type
            restored = True
        elif t.elem_type and dec.elem_type and t.elem_type != dec.elem_type:
            warnings.append(f"{_where(dec.kind, name)} is declared {_type_name(dec.elem_type)} but the graph computes "
                            f"{_type_name(t.elem_type)}; optcli uses {_type_name(t.elem_type)} (declared types are "
                            "hints, not facts: fix the declaration in the exporter to silence this)")
        if dec.shape is None:
            continue
        if not t.HasField("shape"):
            for d in dec.shape:
                dim = t.shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif d:
                    dim.dim_param = d
            restored = True
        elif len(t.shape.dim) == len(dec.shape):
            for dim, d in zip(t.shape.dim, dec.shape):
                if isinstance(d, str) and not dim.HasField("dim_value") and _anonymous(dim.dim_param):
                    dim.dim_param = d
    return restored


def reconcile(graph: Graph, declared: dict[str, Declaration], warnings: list[str], source: str,
              strict: bool = False) -> None:
    """Every value's shape as the graph computes it from its inputs (see the module docstring),
    in place; a declaration it contradicts is a warning.  With ``strict``, a node that does not fit
    the shapes its inputs have is the model's fault (or the pinned dims'): a ``ModelError`` naming
    it, where the runtime would refuse the ``.nb`` (and ``opt`` used to call that its own bug);
    else its outputs stay as inference left them."""
    inputs = {v.name: (v.dtype, v.shape) for v in graph.inputs}
    problems: list[str] = []
    derived = derive_shapes(graph.nodes, inputs, graph.initializers, graph.opsets, [v.name for v in graph.outputs],
                            problems=problems)
    if problems and strict:
        raise ModelError(f"{source}: the graph does not fit the shapes of its inputs: {problems[0][:300]}; the model "
                         "cannot run as written: check it, and the dims given to --input_shapes")
    lies = []
    for name, value in graph.values.items():
        if name in inputs:
            continue
        computed = computed_shape(value.shape, derived.get(name))
        dec = declared.get(name)
        if dec is not None and dec.shape is not None and computed is not None and contradicts(dec.shape, computed):
            lies.append((dec.kind, name, dec.shape, computed))
        if value.shape is not None and computed is not None and contradicts(value.shape, computed):
            value.shape = computed  # only a contradiction: what is merely more known is the passes' to find
    outputs = [lie for lie in lies if lie[0] == "graph output"]
    values = [lie for lie in lies if lie[0] != "graph output"]
    for kind, name, shape, computed in outputs + values[:MAX_VALUE_WARNINGS]:
        warnings.append(f"{_where(kind, name)} is declared {show(shape)} but the graph computes {show(computed)}; "
                        "optcli uses the computed shape (declared shapes are hints, not facts: fix the "
                        "declaration in the exporter to silence this)")
    if len(values) > MAX_VALUE_WARNINGS:
        warnings.append(f"{len(values) - MAX_VALUE_WARNINGS} more value_info entries are declared with shapes the "
                        "graph does not compute; optcli uses the computed shapes")


def computed_shape(recorded: tuple[Dim, ...] | None, derived: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """Our derivation where it knows (a fixed dim, or an input's symbol passed through); onnx's
    inference (or the declaration where inference said nothing) where it does not."""
    if derived is None:
        return recorded
    if recorded is None or len(recorded) != len(derived):
        return tuple(derived)
    return tuple(d if d is not None else r for r, d in zip(recorded, derived))


def contradicts(declared: tuple[Dim, ...], computed: tuple[Dim, ...]) -> bool:
    """Another rank, or a fixed declared dim the graph computes otherwise (another size, or a size
    that varies with the inputs)."""
    if len(declared) != len(computed):
        return True
    return any(is_int(a) and a != b for a, b in zip(declared, computed))


def show(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("?" if d is None or (isinstance(d, str) and _anonymous(d)) else str(d)
                           for d in shape) + "]"


def _where(kind: str, name: str) -> str:
    return f"graph output '{name:.80}'" if kind == "graph output" else f"value '{name:.80}' (value_info)"


def _anonymous(symbol: str) -> bool:
    """A dim onnx's inference could not name (``unk__3``) or no name at all."""
    return not symbol or symbol.startswith("unk__")


def _declaration(kind: str, vi: onnx.ValueInfoProto) -> Declaration:
    t = vi.type.tensor_type
    shape = None
    if t.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return Declaration(kind, int(t.elem_type), shape)


def _type_name(elem_type: int) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # noqa: BLE001 - bfloat16, float8...: onnx's own name
        return onnx.TensorProto.DataType.Name(elem_type).lower()
