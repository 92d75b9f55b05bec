"""The generic fallback: any standard ONNX op runs through onnx's reference implementation.

This is what keeps the `arm` target from ever rejecting a valid model.  Nodes that use it carry
their serialized NodeProto (which may hold subgraphs, for If/Loop/Scan); the evaluator for each
distinct node is built once and cached.  Protobuf parsing executes no code from the file.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

_LOCK = threading.Lock()


@lru_cache(maxsize=512)
def _evaluator(proto: bytes, opsets: tuple[tuple[str, int], ...], names: tuple[str, ...]) -> ReferenceEvaluator:
    node = onnx.NodeProto()
    node.ParseFromString(proto)
    # Graph inputs: the node's explicit inputs plus the outer values its subgraphs read.
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in dict.fromkeys(names) if n]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output if n]
    graph = helper.make_graph([node], "fallback", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model)


def run_reference(proto: bytes, opsets: dict[str, int], inputs: list[np.ndarray | None],
                  names: list[str]) -> list[np.ndarray]:
    """Run one node through onnx.reference.  ``names`` are the step's input names (explicit
    inputs, then implicit subgraph reads), ``inputs`` their values (None for absent ones)."""
    with _LOCK:
        evaluator = _evaluator(proto, tuple(sorted(opsets.items())), tuple(names))
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    outs = evaluator.run(None, feeds)
    return [np.asarray(o) for o in outs]
