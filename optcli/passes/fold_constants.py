"""Constant folding: compute at optimization time whatever does not depend on the inputs.

Exported models carry many small subgraphs over constants (shape arithmetic, weight
transposes, ``Constant`` nodes); evaluating them once here shrinks the graph and unlocks the
fusions that want constant weights.  Nodes whose inputs are all initializers are evaluated with
the same numpy kernels the runtime uses; ``Constant`` nodes become initializers; ``Shape`` and
``Size`` of tensors whose shape is fully static are replaced by their value, and so are
``Gather``/``Slice`` over a dynamic ``Shape`` that pick only its fixed dims (``partial_shapes.py``).  Random ops are
never folded, nor are nodes with subgraphs, nor results larger than ``MAX_ELEMENTS``.

Folding runs to a fixpoint: when a sweep folds nothing more, shapes are inferred again
(``passes/_helpers/shape_inference.py``), and if that made any shape more static, the next sweep can fold
the ``Shape`` nodes that read it (run-time 'same' padding arithmetic folds away this way).

A node that cannot be evaluated is never dropped silently: the kernel raised on constant inputs,
so either the model's constants are wrong for the op or our kernel is.  Either way the node stays,
a warning names it, and ``ctx.results.fold_failures`` (the report's ``fold_failures``) lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from optcli.errors import OptError
from optcli.ir import Graph, Node
from optcli.ops.registry import has_native_kernel
from optcli.passes._helpers.graph_queries import drop_values, remove_unused_initializers, static_shape
from optcli.passes._helpers.partial_shapes import static_part
from optcli.passes._helpers.shape_inference import reinfer_shapes

NAME = "fold_constants"
DESCRIPTION = "evaluate nodes over constants, Constant nodes and static Shape/Size into initializers"

MAX_ELEMENTS = 16 * 1024 * 1024
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)

# Ops whose output size follows input *values* (a small constant can ask for terabytes): folded
# only when shape inference gives their output a static shape, so folding never allocates more
# than MAX_ELEMENTS per result.
SIZED_BY_VALUES = frozenset({"OneHot", "Pad", "Resize", "Upsample", "CenterCropPad", "Col2Im"})


def _has_subgraph(node: Node) -> bool:
    if node.proto is None:
        return False
    proto = onnx.NodeProto()
    proto.ParseFromString(node.proto)
    kinds = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(a.type in kinds for a in proto.attribute)


def _constant_value(node: Node) -> np.ndarray | None:
    """The tensor a ``Constant`` node holds, or None for forms we do not fold (sparse)."""
    a = node.attrs
    if "value" in a:
        v = a["value"]
        return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
    if "value_float" in a:
        return np.array(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], dtype=np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], dtype=np.int64)
    if "value_string" in a:
        return np.array(a["value_string"], dtype=object)
    if "value_strings" in a:
        return np.array(a["value_strings"], dtype=object)
    return None


def _shape_value(graph: Graph, node: Node) -> np.ndarray | None:
    shape = static_shape(graph, node.input(0))
    if shape is None:
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    rank = len(shape)
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", rank))
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _expected_elements(graph: Graph, node: Node) -> int | None:
    """Size of the result before computing it, where it can be known cheaply."""
    sizes = []
    for out in node.outputs:
        shape = static_shape(graph, out) if out else None
        if shape is None:
            break
        sizes.append(int(np.prod(shape, dtype=np.int64)))
    else:
        return max(sizes, default=0)
    if node.op_type == "Range":
        try:
            start, limit, delta = (graph.const(node.input(k)) for k in range(3))
            count = np.ceil((float(limit) - float(start)) / float(delta))
            return int(max(count, 0)) if np.isfinite(count) else MAX_ELEMENTS + 1
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return None  # a malformed Range: evaluating it fails cleanly
    if node.op_type in SIZED_BY_VALUES:
        return MAX_ELEMENTS + 1  # output size set by input values: not folded without a known shape
    if node.op_type in ("ConstantOfShape", "Expand", "Tile"):
        x = graph.const(node.input(0))
        arg = graph.const(node.input(1)) if node.op_type != "ConstantOfShape" else x
        if arg is None or x is None:
            return None
        if node.op_type == "ConstantOfShape":
            return int(np.prod(arg, dtype=np.int64))
        if node.op_type == "Tile":
            return int(x.size * np.prod(arg, dtype=np.int64))
        try:
            return int(np.prod(np.broadcast_shapes(x.shape, tuple(int(d) for d in arg)), dtype=np.int64))
        except ValueError:
            return None
    return None


STANDARD_DOMAINS = ("", "ai.onnx")
MAX_ROUNDS = 50  # each round makes something constant or static, so this bounds only bugs


def _evaluable(node: Node) -> bool:
    """Can the node be run at all here: a native kernel, or a standard op the reference knows."""
    return node.domain in STANDARD_DOMAINS or has_native_kernel(node.op_type, node.domain, list(node.outputs))


def _fold(graph: Graph, node: Node, failed: set[int], failures: list[dict],
          producers: dict[str, Node]) -> list[np.ndarray] | None:
    """The node's outputs as constants, or None when it must stay a node."""
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        value = _constant_value(node)
        return None if value is None else [value]
    if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
        value = _shape_value(graph, node)
        return None if value is None else [value]
    if node.op_type in ("Gather", "Slice"):
        value = static_part(graph, node, producers)  # fixed dims of a dynamic shape
        if value is not None:
            return [value]
    if node.op_type in NONDETERMINISTIC or id(node) in failed:
        return None
    if not all(graph.is_constant(i) for i in node.inputs if i) or _has_subgraph(node) or not _evaluable(node):
        return None
    expected = _expected_elements(graph, node)
    if expected is not None and expected > MAX_ELEMENTS:
        return None
    from optcli.ops.evaluate import evaluate_node

    try:
        results = evaluate_node(node, [graph.const(i) if i else None for i in node.inputs], graph.opsets)
    except Exception as exc:  # noqa: BLE001 - recorded and reported, see _failure
        failed.add(id(node))
        failures.append(_failure(node, exc))
        return None
    results = [np.asarray(r) for r in results]
    if any(r.size > MAX_ELEMENTS for r in results):
        failed.add(id(node))
        return None
    return results


def _as_recorded_type(graph: Graph, name: str, value: np.ndarray) -> np.ndarray:
    """``value`` in the dtype shape inference recorded (a kernel may compute wider)."""
    recorded = graph.values.get(name)
    if recorded is None or value.dtype == object or str(value.dtype) == recorded.dtype:
        return value
    try:
        return value.astype(np.dtype(recorded.dtype))
    except TypeError:
        return value  # a type numpy does not name ("unknown"): keep what the kernel made


def _failure(node: Node, exc: Exception) -> dict:
    """What the report and the warning say about a node that raised while being folded."""
    if isinstance(exc, OptError):
        kind, why = "model", "its constant inputs are invalid for the op; check the model"
    elif isinstance(exc, NotImplementedError):
        kind, why = "unsupported", "optcli cannot evaluate this form of the op yet; it runs at run time instead"
    else:
        kind, why = "bug", "this is a bug in optcli's kernel; please report it with the model"
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return {"node": node.name, "op": node.op_type, "kind": kind,
            "error": f"{type(exc).__name__}: {first}", "advice": why}


def run(graph: Graph, ctx: Any, keep: Callable[[Node], bool] | None = None) -> dict[str, int]:
    """Fold to a fixpoint; nodes for which ``keep`` says True stay nodes (fold_constants_before_qdq)."""
    counts = {"folded": 0, "constants": 0, "shapes": 0, "inferred": 0}
    failed: set[int] = set()
    failures: list[dict] = []
    _sweep(graph, failed, failures, counts, keep)
    for _ in range(MAX_ROUNDS):
        inferred = reinfer_shapes(graph)
        counts["inferred"] += inferred
        if not inferred or not _sweep(graph, failed, failures, counts, keep):
            break
    remove_unused_initializers(graph)
    _report(ctx, failures)
    return counts


def _report(ctx: Any, failures: list[dict]) -> None:
    if ctx is None:
        return
    recorded = ctx.results.fold_failures
    for f in failures:
        if f not in recorded:
            recorded.append(f)
            ctx.warn(f"could not fold node '{f['node']}' ({f['op']}) over constants: {f['error']}; {f['advice']}")


def _sweep(graph: Graph, failed: set[int], failures: list[dict], counts: dict[str, int],
           keep: Callable[[Node], bool] | None = None) -> bool:
    """Fold until a sweep folds nothing; True when anything was folded."""
    any_folded = False
    changed = True
    while changed:
        changed = False
        outputs = graph.output_names()
        producers = graph.producers()
        folded: set[int] = set()
        for node in graph.nodes:
            # A graph output must stay produced by a node: the runtime binds outputs to steps.
            if any(o in outputs for o in node.outputs) or (keep is not None and keep(node)):
                continue
            results = _fold(graph, node, failed, failures, producers)
            if results is None:
                continue
            for name, value in zip(node.outputs, results):
                if not name:
                    continue
                value = _as_recorded_type(graph, name, value)
                # np.ascontiguousarray would turn a 0-d result into shape [1].
                graph.initializers[name] = value if value.flags.c_contiguous else value.copy(order="C")
                drop_values(graph, name)
            folded.add(id(node))
            shape_like = node.op_type in ("Shape", "Size") or not all(graph.is_constant(i) for i in node.inputs if i)
            key = "constants" if node.op_type == "Constant" else "shapes" if shape_like else "folded"
            counts[key] += 1
            changed = any_folded = True
        graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    return any_folded
