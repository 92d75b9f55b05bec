"""Constant folding: compute at optimization time whatever does not depend on the inputs.

Exported models carry many small subgraphs over constants (shape arithmetic, weight
transposes, ``Constant`` nodes); evaluating them once here shrinks the graph and unlocks the
fusions that want constant weights.  Nodes whose inputs are all initializers are evaluated with
the same numpy kernels the runtime uses; ``Constant`` nodes become initializers; ``Shape`` and
``Size`` of tensors whose shape is fully static are replaced by their value.  Random ops are
never folded, nor are nodes with subgraphs, nor results larger than ``MAX_ELEMENTS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from optcli.ir import Graph, Node
from optcli.passes.util import drop_values, remove_unused_initializers, static_shape

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


def _fold(graph: Graph, node: Node, failed: set[int]) -> list[np.ndarray] | None:
    """The node's outputs as constants, or None when it must stay a node."""
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        value = _constant_value(node)
        return None if value is None else [value]
    if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
        value = _shape_value(graph, node)
        return None if value is None else [value]
    if node.op_type in NONDETERMINISTIC or id(node) in failed:
        return None
    if not all(graph.is_constant(i) for i in node.inputs if i) or _has_subgraph(node):
        return None
    expected = _expected_elements(graph, node)
    if expected is not None and expected > MAX_ELEMENTS:
        return None
    from optcli.runtime.evaluate import evaluate_node

    try:
        results = evaluate_node(node, [graph.const(i) if i else None for i in node.inputs], graph.opsets)
    except Exception:  # noqa: BLE001 - an op we cannot evaluate simply stays in the graph
        failed.add(id(node))
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


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"folded": 0, "constants": 0, "shapes": 0}
    failed: set[int] = set()
    changed = True
    while changed:
        changed = False
        outputs = graph.output_names()
        folded: set[int] = set()
        for node in graph.nodes:
            # A graph output must stay produced by a node: the runtime binds outputs to steps.
            if any(o in outputs for o in node.outputs):
                continue
            results = _fold(graph, node, failed)
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
            key = {"Constant": "constants", "Shape": "shapes", "Size": "shapes"}.get(node.op_type, "folded")
            counts[key] += 1
            changed = True
        graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    remove_unused_initializers(graph)
    return counts
