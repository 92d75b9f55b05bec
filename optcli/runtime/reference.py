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
def _evaluator(proto: bytes, opsets: tuple[tuple[str, int], ...]) -> tuple[ReferenceEvaluator, list[str]]:
    node = onnx.NodeProto()
    node.ParseFromString(proto)
    # Give every input a graph-level name (absent optional inputs stay "").
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.input if n]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output if n]
    graph = helper.make_graph([node], "fallback", list({v.name: v for v in inputs}.values()), outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model), [n for n in node.input]


def run_reference(proto: bytes, opsets: dict[str, int], inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node through onnx.reference; ``inputs`` are positional, None for absent ones."""
    with _LOCK:
        evaluator, names = _evaluator(proto, tuple(sorted(opsets.items())))
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    outs = evaluator.run(None, feeds)
    return [np.asarray(o) for o in outs]
