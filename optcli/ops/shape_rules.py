"""Value shapes derived from input shapes, for graphs and plans with dynamic dims.

The compiler needs sizes for a graph whose inputs have symbolic dims (GPU kernel checks and the
cost model judge nominal sizes, ``optcli.targets.nominal``), and the runtime needs every GPU
value's shape for the concrete input shapes of a ``run`` before it sizes a buffer or a launch
grid (``optcli.runtime.bind_shapes``).  Both come from here: the nodes are written out as an
in-memory ONNX graph with the inputs pinned and *no* recorded shapes of intermediate values
(a file's recorded shapes are checked against the derivation, never used as its source), and
onnx's shape inference (with data propagation, so Shape -> Gather -> Concat -> Reshape chains
resolve) derives the rest.

Our fused ops are given to onnx as the standard op with the same shape rule: elementwise ones
(activations, ``FakeQuant``, ``ChannelAffine``, the layout copies) as ``Identity``,
``FullyConnected`` and ``DynamicQuantizeMatMul`` as ``MatMul`` of their first two inputs.  Ops
fusion creates in the default domain above the model's opset (``Gelu`` is opset 20,
``LayerNormalization`` 17, ``HardSwish`` 14) are mapped the same way, so a model exported at
opset 13 still derives through them.

This is the single place a later per-op shape function (issue 12) replaces: callers only see
``derive_shapes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from optcli.ir import Dim, Node

SMALL_CONSTANT = 4096  # elements: shape-like constants go in whole (data propagation), weights by type only

# (domain, op) -> how onnx sees its shape: "identity" (output 0 has input 0's shape) or "matmul".
SHAPE_AS: dict[tuple[str, str], str] = {
    **{("optcli", op): "identity" for op in ("Upload", "Download", "Pack", "Unpack", "Swish", "FakeQuant",
                                            "ChannelAffine")},
    **{("", op): "identity" for op in ("Gelu", "HardSwish")},
    ("optcli", "FullyConnected"): "matmul",
    ("optcli", "DynamicQuantizeMatMul"): "matmul",
}


class ShapeDerivationError(ValueError):
    """onnx's inference found the shapes inconsistent (strict mode): the message names the node."""


def _mapped(node: Node) -> str | None:
    kind = SHAPE_AS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
    if kind is None and node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") \
            and len([o for o in node.outputs if o]) == 1 and node.outputs[0]:
        kind = "identity"
    return kind


def onnx_node(node: Node):
    """The node as ONNX for shape inference: fused ops as their shape twin, epilogue attributes
    left out, subgraph attributes taken from the kept proto."""
    import onnx
    from onnx import helper, numpy_helper

    kind = _mapped(node)
    if kind == "identity":
        return helper.make_node("Identity", node.inputs[:1], node.outputs[:1], name=node.name)
    if kind == "matmul":
        return helper.make_node("MatMul", node.inputs[:2], node.outputs[:1], name=node.name)
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


def value_info(name: str, dtype: str | None, shape: Iterable[Dim] | None):
    from onnx import helper

    try:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype and dtype != "unknown" else 0
    except TypeError:
        elem = 0
    dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
    return helper.make_tensor_value_info(name, elem, dims)


def derive_shapes(nodes: list[Node], inputs: dict[str, tuple[str, tuple[Dim, ...]]],
                  constants: dict[str, np.ndarray], opsets: dict[str, int], outputs: list[str],
                  strict: bool = False, rounds: int = 8) -> dict[str, tuple[Dim, ...]]:
    """name -> shape of every value ``nodes`` compute, from the ``inputs`` ({name: (dtype, shape)})
    and the constants' own shapes (small integer constants by value).  Dims onnx cannot derive are
    symbols or None; with ``strict`` an inconsistency raises ``ShapeDerivationError``.

    Shape arithmetic is evaluated between rounds of inference: a ``Shape`` whose input's shape is
    now known, and then any small computation on known values (Gather, Unsqueeze, Concat, Range,
    Slice of a position-id table...), becomes a constant for the next round.  onnx's own data
    propagation covers Reshape and Expand targets but not, e.g., a Slice whose ends come from a
    Shape, which a transformer's position embedding uses.

    Nothing large is ever computed: a node is evaluated only when onnx's inference already gave
    each of its outputs a known shape of at most ``SMALL_CONSTANT`` elements (its inputs are such
    constants too), so the work is bounded per node and the whole derivation by the number of
    nodes times ``rounds`` (the runtime derives at load, where no plan may be executed).
    Subgraph ops (the fallback's protos) and random ops are never evaluated."""
    known = {k: np.asarray(a) for k, a in constants.items() if a.size <= SMALL_CONSTANT and a.dtype != object}
    pending = list(nodes)
    shapes: dict[str, tuple[Dim, ...]] = {}
    for _ in range(max(1, rounds)):
        shapes.update(_infer(pending, inputs, constants, known, opsets, outputs, strict))  # later rounds know more
        shapes.update((name, tuple(array.shape)) for name, array in known.items())
        folded = _fold(pending, inputs, shapes, known, opsets)
        if not folded:
            break
        pending = [n for n in pending if not all(o in known for o in n.outputs if o)]
    if strict:
        problem = inconsistency(nodes, shapes, inputs, constants)
        if problem:
            raise ShapeDerivationError(problem)
    return shapes


def inconsistency(nodes: list[Node], shapes: dict[str, tuple[Dim, ...]], inputs: dict,
                  constants: dict[str, np.ndarray]) -> str:
    """What onnx's inference does not check and a kernel relies on: a Conv's input channels against
    its weight and group, a ConvTranspose's likewise, the length of a bias or a per-channel
    parameter.  Only dims known on both sides are compared; '' when nothing disagrees.  The
    message names the node as onnx's do: ``(op_type:Conv, node name: conv1): ...``."""
    def shape(name: str):
        if not name:
            return None
        if name in constants:
            return tuple(np.shape(constants[name]))
        return inputs[name][1] if name in inputs else shapes.get(name)

    for node in nodes:
        if node.domain not in ("", "ai.onnx", "optcli") or node.proto is not None:
            continue
        problem = _node_inconsistency(node, [shape(i) for i in node.inputs])
        if problem:
            return f"(op_type:{node.op_type}, node name: {node.name}): {problem}"
    return ""


def _node_inconsistency(node: Node, shapes: list) -> str:
    def dim(k: int, axis: int):
        s = shapes[k] if k < len(shapes) else None
        if s is None or not -len(s) <= axis < len(s):
            return None
        d = s[axis]
        return d if isinstance(d, int) and not isinstance(d, bool) else None

    def length(k: int):
        s = shapes[k] if k < len(shapes) else None
        return int(np.prod(s)) if is_concrete(s) else None

    op, group = node.op_type, node.attrs.get("group", 1)
    group = group if isinstance(group, int) and group > 0 else 1
    if op in ("Conv", "ConvTranspose") and len(shapes) >= 2:
        x, w = shapes[0], shapes[1]
        if x is not None and w is not None and len(x) != len(w):
            return f"input rank {len(x)} differs from the weight's {len(w)}"
        c, w0, w1 = dim(0, 1), dim(1, 0), dim(1, 1)
        per_group_in = w1 if op == "Conv" else w0
        expected = None if per_group_in is None else (per_group_in * group if op == "Conv" else per_group_in)
        if c is not None and expected is not None and c != expected:
            return f"the input has {c} channels, the weight takes {expected} (group {group})"
        if op == "Conv" and w0 is not None and w0 % group:
            return f"{w0} output channels do not split into {group} groups"
        if op == "ConvTranspose" and w0 is not None and w0 % group:
            return f"{w0} input channels do not split into {group} groups"
        outs = (w0 if op == "Conv" else (None if w1 is None else w1 * group))
        bias = length(2)
        if bias is not None and outs is not None and bias != outs:
            return f"the bias has {bias} values for {outs} output channels"
    elif op == "ChannelAffine" and node.domain == "optcli":
        c = dim(0, 1)
        for k in (1, 2):
            n = length(k)
            if c is not None and n is not None and n not in (1, c):
                return f"input {k} has {n} values for {c} channels"
    elif op == "FullyConnected" and node.domain == "optcli":
        n_out, bias = dim(1, -1), length(2)
        if n_out is not None and bias is not None and bias not in (1, n_out):
            return f"the bias has {bias} values for {n_out} outputs"
    return ""


_NOT_FOLDED = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
               "Bernoulli")


def _fold(nodes: list[Node], inputs: dict, shapes: dict, known: dict[str, np.ndarray], opsets: dict) -> int:
    """Evaluate what has become computable (see ``derive_shapes``); returns how many nodes folded."""
    from optcli.ops.registry import kernels_for

    folded = 0
    for node in nodes:
        if node.proto is not None or not node.outputs or all(o in known for o in node.outputs if o):
            continue
        try:
            if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
                shape = inputs[node.inputs[0]][1] if node.inputs[0] in inputs else shapes.get(node.inputs[0])
                if not is_concrete(shape):
                    continue
                rank = len(shape)
                start, end = int(node.attrs.get("start", 0)), int(node.attrs.get("end", rank))
                results = [np.array(shape[slice(start, end)], np.int64)]
            elif node.op_type in _NOT_FOLDED or not node.inputs or not all(i in known for i in node.inputs if i):
                continue
            elif not all(_small(shapes.get(o)) for o in node.outputs if o):
                # Sized before it is evaluated: a small constant can ask for terabytes (Expand,
                # Range, ConstantOfShape, Tile...), and deriving shapes must never compute them.
                continue
            else:
                generic = [k for k in kernels_for(node.op_type, node.domain) if k.applies is None]
                if not generic:
                    continue
                attrs = {**node.attrs, "_opset": int(opsets.get("", 0) or 0), "_n_outputs": len(node.outputs)}
                results = generic[0].fn([known[i] if i else None for i in node.inputs], attrs)
        except Exception:  # noqa: BLE001 - what does not evaluate stays for onnx's inference (or the run) to judge
            continue
        arrays = [np.asarray(r) for r in results[:len(node.outputs)]]
        if len(arrays) < len([o for o in node.outputs if o]) or any(a.size > SMALL_CONSTANT or a.dtype == object
                                                                    for a in arrays):
            continue
        for name, array in zip(node.outputs, arrays):
            if name:
                known[name] = array
        folded += 1
    return folded


def _infer(nodes: list[Node], inputs: dict, constants: dict[str, np.ndarray], known: dict[str, np.ndarray],
           opsets: dict[str, int], outputs: list[str], strict: bool) -> dict[str, tuple[Dim, ...]]:
    import onnx
    from onnx import helper, numpy_helper

    graph_inputs = [value_info(k, dtype, shape) for k, (dtype, shape) in inputs.items()]
    graph_inputs += [value_info(k, a.dtype.name, a.shape) for k, a in constants.items() if k not in known]
    inits = [numpy_helper.from_array(np.asarray(a), k) for k, a in known.items()]
    graph_outputs = [helper.make_value_info(k, onnx.TypeProto()) for k in outputs if k not in known]
    proto = helper.make_graph([onnx_node(n) for n in nodes], "derive", graph_inputs, graph_outputs, inits)
    opset_ids = {"": 17, **{d: v for d, v in opsets.items() if d != "ai.onnx"}, "optcli": 1}
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid(d, int(v)) for d, v in opset_ids.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=strict, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise ShapeDerivationError(_short(exc)) from None
    shapes: dict[str, tuple[Dim, ...]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                    for d in t.shape.dim)
    return shapes


def _short(exc: Exception) -> str:
    text = str(exc).replace("[ShapeInferenceError] Inference error(s): ", "").strip()
    return " ".join(text.split())[:300]


def _small(shape: Any) -> bool:
    """A shape onnx's inference knows, of at most ``SMALL_CONSTANT`` elements."""
    if not is_concrete(shape):
        return False
    count = 1
    for d in shape:
        count *= d
    return count <= SMALL_CONSTANT


def is_concrete(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
