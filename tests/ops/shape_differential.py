"""Our shape functions against onnx's shape inference and against real outputs (test helper).

``compare_model`` derives a model's shapes both ways, with its small integer inputs given by
value (shape arithmetic on both sides), and lists every disagreement: a dim onnx's inference
(strict, with data propagation) gives as a number that ours gives otherwise, a dim of a real
output (a node test's expected outputs) that ours gives otherwise, or a step ours finds
inconsistent in a valid model.  ``rejections`` does the other direction: an input shape made
wrong, which onnx's strict inference refuses, must be refused by ours too.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optcli.frontend.onnx_reader import to_ir
from optcli.ops.shape_derivation import ShapeDerivationError, derive_shapes
from optcli.ops.shape_functions import shape_fn_for

SMALL_INT = 64  # numeric inputs up to this many elements are given by value (shape-like inputs)


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


def _dims(vi) -> tuple | None:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in t.shape.dim)


def with_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with its small numeric inputs turned into initializers of these values (a
    Reshape target, Resize scales, a Range bound: what both sides evaluate)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name, value in feeds.items():
        if value.dtype.kind in "iuf" and value.size <= SMALL_INT:
            m.graph.initializer.append(numpy_helper.from_array(value, name))
            kept = [i for i in m.graph.input if i.name != name]
            del m.graph.input[:]
            m.graph.input.extend(kept)
    return m


def onnx_shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """onnx's strict inference with data propagation (raises InferenceError when it refuses)."""
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=True, data_prop=True)
    return {vi.name: s for vi in [*inferred.graph.value_info, *inferred.graph.output]
            if (s := _dims(vi)) is not None}


def our_shapes(model: onnx.ModelProto, strict: bool = True) -> tuple[dict[str, tuple], list]:
    graph = to_ir(model, _opsets(model))
    inputs = {v.name: (v.dtype, v.shape) for v in graph.inputs}
    shapes = derive_shapes(graph.nodes, inputs, graph.initializers, graph.opsets, [v.name for v in graph.outputs],
                           strict=strict)
    return shapes, graph.nodes


def compare_model(model: onnx.ModelProto, expected: dict[str, tuple] | None = None) -> list[str]:
    """Disagreements between our derivation and onnx's (and the real output shapes ``expected``)."""
    try:
        theirs = onnx_shapes(undeclared(model))
    except onnx.shape_inference.InferenceError:
        theirs = None  # onnx cannot infer this model: only the real outputs judge ours
    try:
        ours, nodes = our_shapes(model)
    except ShapeDerivationError as exc:
        return [f"refuses a valid model: {exc}"]
    problems = []
    for node in nodes:
        if shape_fn_for(node.op_type, node.domain) is None:
            continue
        inherited = any(i and i not in ours for i in node.inputs)  # an input whose rank we do not know
        for name in node.outputs:
            if not name:
                continue
            mine = ours.get(name)
            real = (expected or {}).get(name)
            if real is not None and mine is not None and (len(mine) != len(real) or any(
                    a is not None and a != b for a, b in zip(mine, real))):
                problems.append(f"{node.op_type} '{name}': ours {mine}, the real output {real}")
            other = (theirs or {}).get(name)
            if other is None or all(d is None for d in other) or (mine is None and inherited):
                continue  # onnx knows nothing, or we lack an input's rank (an op upstream has no shape function)
            if mine is None or len(mine) != len(other) or any(b is not None and a != b for a, b in zip(mine, other)):
                if real is not None and mine is not None and tuple(mine) == tuple(real):
                    continue  # onnx is wrong where the real output agrees with ours
                problems.append(f"{node.op_type} '{name}': ours {mine}, onnx {other}")
    return problems


def undeclared(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the shapes it declares for its outputs and intermediate values, so that
    onnx's inference derives them (and cannot refuse a node for disagreeing with a declaration)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    return m


def perturbed(model: onnx.ModelProto):
    """(description, model) with one float input's last dim, or its dim 1, grown by one."""
    for k, vi in enumerate(model.graph.input):
        t = vi.type.tensor_type
        if t.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) or not t.HasField("shape"):
            continue
        for axis in sorted({len(t.shape.dim) - 1, 1}):
            if not 0 <= axis < len(t.shape.dim) or not t.shape.dim[axis].HasField("dim_value"):
                continue
            m = undeclared(model)  # declared shapes downstream would differ: not a node's inconsistency
            m.graph.input[k].type.tensor_type.shape.dim[axis].dim_value += 1
            yield f"input '{vi.name}' dim {axis} +1", m


def rejections(model: onnx.ModelProto) -> tuple[int, list[str]]:
    """(how many perturbed input shapes both refuse, those onnx's strict inference refuses at an op
    we have a shape function for and ours accepts).  An op with no shape function runs through
    the reference fallback, which judges its inputs at run time."""
    both, missed = 0, []
    for what, m in perturbed(model):
        try:
            onnx_shapes(m)
            continue
        except onnx.shape_inference.InferenceError as exc:
            reason = " ".join(str(exc).split())
        op = re.search(r"\(op_type:([A-Za-z0-9_]+)", reason)
        domain = next((n.domain for n in m.graph.node if op and n.op_type == op.group(1)), "")
        if op is None or shape_fn_for(op.group(1), domain) is None:
            continue
        try:
            our_shapes(m)
        except ShapeDerivationError:
            both += 1
            continue
        missed.append(f"{what}: onnx refuses ({reason[:200]}), ours accepts")
    return both, missed


def value_info(name: str, array: np.ndarray):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
