"""The generic fallback: any standard ONNX op runs through onnx's reference implementation.

This is what keeps the `arm` target from ever rejecting a valid model.  Nodes that use it carry
their serialized NodeProto (which may hold subgraphs, for If/Loop/Scan); the evaluator for each
distinct node is built once and cached.  Protobuf parsing executes no code from the file.

``If``, ``Loop`` and ``Scan`` nodes keep their proto too, but run in optcli's own executor
(``ops/control_flow.py``, whose ``run_fallback`` is what callers use for any such node): their
bodies run optcli's kernels and come back here only for the ops optcli has no kernel for.
"""

from __future__ import annotations

import contextvars
import os
import threading
from functools import lru_cache

import numpy as np

from optcli.ir import Node, subgraph_outer_refs
from optcli.ops.registry import has_native_kernel, kernels_for

_LOCK = threading.Lock()

MAX_LOOP_ITERATIONS = int(os.environ.get("OPTCLI_MAX_LOOP_ITERATIONS", "1000000"))
"""Iterations one ``Loop`` or ``Scan`` may run (``OPTCLI_MAX_LOOP_ITERATIONS``): a file
cannot make a run go on forever (a trip count of 10**12, a condition that stays true).  Real
models iterate thousands of times (a decoder's 501 steps), each iteration a Python-level run of
the body: a million of them is hours."""

RUN_STOP: contextvars.ContextVar = contextvars.ContextVar("optcli_run_stop", default=None)
"""The running call's stop flag (``runtime.run_control.RunStop``: ``check(where)`` raises once it
is cancelled or past its deadline), seen at every iteration of a ``Loop``/``Scan``."""


def attribute_values(proto) -> tuple[dict, bool]:
    """A NodeProto's attributes as optcli's kernels take them (ints, floats, strings, lists, numpy
    arrays for tensors), and whether any was left out because only onnx.reference reads it
    (subgraphs, sparse tensors, type protos)."""
    import onnx
    from onnx import helper, numpy_helper

    attrs, opaque = {}, False
    for a in proto.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", errors="replace") for v in value]
        elif isinstance(value, list) and value and isinstance(value[0], onnx.TensorProto):
            value = [numpy_helper.to_array(v) for v in value]
        elif not isinstance(value, (int, float, str, list)):
            opaque = True
            continue
        attrs[a.name] = value
    return attrs, opaque


def node_from_proto(proto, name: str):
    """An ONNX NodeProto as optcli's IR node named ``name``.  Nodes no kernel describes (no kernel
    for the op or its outputs, or subgraph attributes) keep their serialized proto for the
    fallback; the values their subgraphs read from the enclosing graph become inputs after the
    explicit ones, so dataflow (ordering, liveness, dead-code removal) sees them like any other
    read."""
    attrs, opaque = attribute_values(proto)
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    keep_proto = opaque or not has_native_kernel(proto.op_type, domain, list(proto.output))
    data = proto.SerializeToString(deterministic=True) if keep_proto else None
    inputs = list(proto.input)
    if opaque and data is not None:
        inputs += sorted(subgraph_outer_refs(data) - set(inputs))
    return Node(proto.op_type, inputs, list(proto.output), attrs, name, domain, proto=data)


CONTROL_FLOW = ("If", "Loop", "Scan")


def runs_optcli_kernel(node) -> bool:
    """Whether a node inside an If/Loop/Scan body runs optcli's kernel (``control_flow.Body``), not
    onnx.reference's: its op has a kernel for any node that makes every output it uses, and no
    attribute linked to an enclosing function's."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if node.op_type in CONTROL_FLOW or any(a.ref_attr_name for a in node.attribute):
        return False
    if not any(k.applies is None for k in kernels_for(node.op_type, domain)):
        return False
    return has_native_kernel(node.op_type, domain, list(node.output))


def body_ops(proto: bytes) -> list[tuple[str, str, str]]:
    """The ops inside a node's subgraphs, nested ones included, as (op type, domain, who runs it:
    "optcli kernel", "onnx reference" or "control flow"): what ``opt --print_model_ops`` lists
    under an If/Loop/Scan step."""
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    found: list[tuple[str, str, str]] = []

    def walk(n) -> None:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                      list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                for inner in g.node:
                    runner = ("control flow" if inner.op_type in CONTROL_FLOW else
                              "optcli kernel" if runs_optcli_kernel(inner) else "onnx reference")
                    found.append((inner.op_type, "" if inner.domain == "ai.onnx" else inner.domain, runner))
                    walk(inner)

    walk(node)
    return found


@lru_cache(maxsize=512)
def _evaluator(proto: bytes, opsets: tuple[tuple[str, int], ...],
               typed_names: tuple[tuple[str, int], ...]) -> tuple[object, list[str]]:
    import onnx  # imported on first use: plans without fallback steps never pay for onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    # Graph inputs: the node's explicit inputs plus the outer values its subgraphs read, typed
    # (function-defined ops such as GroupNormalization cast to their input's type).
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in dict(typed_names).items()]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output if n]
    graph = helper.make_graph([node], "fallback", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model), list(node.output)


def run_reference(proto: bytes, opsets: dict[str, int], inputs: list[np.ndarray | None],
                  names: list[str]) -> list[np.ndarray]:
    """Run one node through onnx.reference.  ``names`` are the step's input names (explicit
    inputs, then implicit subgraph reads), ``inputs`` their values (None for absent ones)."""
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    typed = tuple((n, _elem_type(x)) for n, x in feeds.items())
    with _LOCK:
        evaluator, output_names = _evaluator(proto, tuple(sorted(opsets.items())), typed)
    outs = iter(evaluator.run(None, feeds))
    # Positional, like the node's outputs: an absent optional output ("") gets None.
    return [_as_value(next(outs)) if n else None for n in output_names]


def _as_value(out):
    """Tensors as numpy arrays; sequences (lists) and optionals (None) stay as they are."""
    return out if out is None or isinstance(out, list) else np.asarray(out)


def _elem_type(x) -> int:
    import onnx
    from onnx import helper

    if not isinstance(x, np.ndarray):
        return onnx.TensorProto.UNDEFINED  # sequences, optionals: the reference infers them
    try:
        return helper.np_dtype_to_tensor_dtype(x.dtype)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.UNDEFINED  # sequences, optionals: the reference infers them
