"""The generic fallback: any standard ONNX op runs through onnx's reference implementation.

This is what keeps the `arm` target from ever rejecting a valid model.  Nodes that use it carry
their serialized NodeProto (which may hold subgraphs, for If/Loop/Scan); the evaluator for each
distinct node is built once and cached.  Protobuf parsing executes no code from the file.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

_LOCK = threading.Lock()


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
