"""Shape inference on the IR, again, after folding made more of the graph constant.

The frontend infers shapes once, on the model as exported.  Models ported from TensorFlow (and
many others) compute 'same' padding at run time: Shape -> Gather -> Cast -> Div -> Ceil -> Sub ->
Mul -> Max -> Concat -> Pad.  Once folding has turned that arithmetic into a constant, the Pad's
output shape is known, but only a new round of inference can say so, and only then can the next
Shape node fold.  ``fold_constants`` alternates the two until neither changes anything, which is
what onnxsim and onnxruntime's basic level do.

This module is a helper of that pass, not a pass of its own, and the one place left that derives
shapes with onnx's inference (compiler side only: the runtime, and the nominal sizes of
``optcli.targets.nominal``, use our own per-op shape functions, ``optcli.ops.shape_derivation``).
onnx's inference is kept here because it also refines dtypes and reads the model's own
``value_info``, which the frontend keeps in the IR.  It writes the IR out as an in-memory ONNX
graph (small constants as initializers so data propagation can read them, big
weights only as typed inputs), runs onnx's shape inference, and takes back only what is *more*
known than before: a dim that becomes a number, a rank that becomes known.  A fixed dim is
never replaced, so a wrong inference can refine but never contradict what the frontend computed
(the model's own declarations are hints it has already checked, ``frontend/declared_shapes.py``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optcli.ir import Dim, Graph, Node, Value
from optcli.ops.shape_derivation import SMALL_CONSTANT

_DOMAIN_OPSET = {"optcli": 1}

# (domain, op) -> how onnx sees its shape: "identity" (output 0 has input 0's shape) or "matmul".
# Our fused ops are given to onnx as the standard op with the same shape rule; ops fusion creates
# in the default domain above the model's opset (Gelu 20, LayerNormalization 17, HardSwish 14) too,
# so a model exported at opset 13 still infers through them.
SHAPE_AS: dict[tuple[str, str], str] = {
    **{("optcli", op): "identity" for op in ("Upload", "Download", "Pack", "Unpack", "Swish", "FakeQuant",
                                            "ChannelAffine", "QAdd", "QLookup", "QMul")},
    **{("", op): "identity" for op in ("Gelu", "HardSwish")},
    ("optcli", "FullyConnected"): "matmul",
    ("optcli", "DynamicQuantizeMatMul"): "matmul",
    ("optcli", "QMatMul"): "matmul",  # an integer MatMul: x [..., K] by w [K, M]
    ("optcli", "QConv"): "conv",  # an integer Conv: the window attributes of Conv, its x and w
    ("optcli", "QGlobalAveragePool"): "global_pool",
}
_CONV_ATTRS = ("strides", "pads", "dilations", "group", "kernel_shape", "auto_pad")


def reinfer_shapes(graph: Graph) -> int:
    """Refine ``graph.values`` from onnx shape inference; returns how many values got more static."""
    model = _to_onnx(graph)  # a failure here is our bug: it must surface, not pass as "nothing inferred"
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return 0  # onnx cannot infer this graph: the shapes we have stay valid, nothing gets more static
    changed = 0
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        if vi.name in graph.initializers:
            continue
        new_shape = _shape(vi)
        if new_shape is None:
            continue
        value = graph.values.get(vi.name)
        if value is None:
            graph.values[vi.name] = Value(vi.name, _dtype(vi) or "float32", new_shape)
            changed += any(isinstance(d, int) for d in new_shape)
            continue
        merged = _merge(value.shape, new_shape)
        if merged != value.shape:
            value.shape = merged  # in place: graph.inputs/outputs share these Value objects
            changed += 1
        if value.dtype == "unknown" and _dtype(vi):
            value.dtype = _dtype(vi)
    return changed


def _merge(old: tuple[Dim, ...] | None, new: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """``old`` with its unknown dims filled from ``new``; ``old`` itself when they disagree."""
    if old is None:
        return new
    if len(old) != len(new):
        return old
    out = []
    for a, b in zip(old, new):
        if isinstance(a, int):
            if isinstance(b, int) and a != b:
                return old  # a contradiction: keep what we had, the runtime checks real shapes
            out.append(a)
        else:
            out.append(b if isinstance(b, int) else a)
    return tuple(out)


def _shape(vi: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                 for d in t.shape.dim)


def _dtype(vi: onnx.ValueInfoProto) -> str | None:
    elem = vi.type.tensor_type.elem_type
    if not elem:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
    except Exception:  # noqa: BLE001 - bfloat16, float8...: leave the dtype as it is
        return None


def _to_onnx(graph: Graph) -> onnx.ModelProto:
    small, big = {}, {}
    for name, array in graph.initializers.items():
        (small if array.size <= SMALL_CONSTANT and array.dtype != object else big)[name] = array
    inputs = [value_info(v.name, v.dtype, v.shape) for v in graph.inputs]
    inputs += [value_info(name, a.dtype.name, a.shape) for name, a in big.items()]
    inits = [numpy_helper.from_array(a, name) for name, a in small.items()]
    outputs = [value_info(v.name, v.dtype, v.shape) for v in graph.outputs]
    declared = {v.name for v in [*graph.inputs, *graph.outputs]} | set(graph.initializers)
    recorded = [value_info(v.name, v.dtype, v.shape) for name, v in graph.values.items() if name not in declared]
    nodes = [onnx_node(n) for n in graph.nodes]
    opsets = {"": 17, **graph.opsets, **_DOMAIN_OPSET}
    proto = helper.make_graph(nodes, graph.name or "g", inputs, outputs, inits, value_info=recorded)
    return helper.make_model(proto, opset_imports=[helper.make_opsetid(d, int(v)) for d, v in opsets.items()])


def _mapped(node: Node) -> str | None:
    kind = SHAPE_AS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
    if kind is None and node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") \
            and len([o for o in node.outputs if o]) == 1 and node.outputs[0]:
        kind = "identity"
    return kind


def onnx_node(node: Node) -> onnx.NodeProto:
    """The node as ONNX for shape inference: fused ops as their shape twin, epilogue attributes
    left out, subgraph attributes taken from the kept proto."""
    kind = _mapped(node)
    if kind == "identity":
        return helper.make_node("Identity", node.inputs[:1], node.outputs[:1], name=node.name)
    if kind == "matmul":
        return helper.make_node("MatMul", node.inputs[:2], node.outputs[:1], name=node.name)
    if kind == "global_pool":
        return helper.make_node("GlobalAveragePool", node.inputs[:1], node.outputs[:1], name=node.name)
    if kind == "conv":
        window = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
        return helper.make_node("Conv", node.inputs[:2], node.outputs[:1], name=node.name, **window)
    attrs = {}
    for key, value in node.attrs.items():
        if key.startswith("_") or (key.startswith("activation") and node.domain in ("", "ai.onnx")):
            continue
        if isinstance(value, np.ndarray):
            value = numpy_helper.from_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            value = [numpy_helper.from_array(v) for v in value]
        attrs[key] = value
    explicit = list(node.inputs)
    extra = []
    if node.proto is not None:
        old = onnx.NodeProto()
        old.ParseFromString(node.proto)
        explicit = explicit[:len(old.input)]  # the rest are subgraph reads the IR made explicit
        extra = [a for a in old.attribute if a.name not in attrs]
    proto = helper.make_node(node.op_type, explicit, node.outputs, name=node.name, domain=node.domain)
    for key, value in attrs.items():
        try:
            proto.attribute.append(helper.make_attribute(key, value))
        except (TypeError, ValueError):  # e.g. an empty list, whose type make_attribute cannot tell
            continue
    proto.attribute.extend(extra)
    return proto


def value_info(name: str, dtype: str | None, shape) -> onnx.ValueInfoProto:
    try:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype and dtype != "unknown" else 0
    except TypeError:
        elem = 0
    dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
    return helper.make_tensor_value_info(name, elem, dims)
