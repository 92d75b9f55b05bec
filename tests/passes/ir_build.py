"""Test fixture for pass tests: build a small ONNX model from onnx.helper pieces, convert it to the
IR, run the IR with a tiny interpreter (``evaluate_node`` per node, in order) and compare with
onnxruntime on the original model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optcli.frontend.onnx_reader import read_model
from optcli.ir import Graph
from optcli.ops.evaluate import evaluate_node
from optcli.passes.base import PassContext
from tests.helpers import assert_close, run_ort

OPSET = 17
F32 = onnx.TensorProto.FLOAT


def vi(name: str, shape: Sequence[int | str | None] | None, dtype: int = F32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, Sequence[int | str | None]],
    outputs: Sequence[str] = ("y",),
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A float32 model: ``inputs`` maps names to shapes; output types are left to inference."""
    graph = helper.make_graph(
        nodes,
        "test",
        [vi(k, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    # onnxruntime wants typed outputs: take them from shape inference.
    inferred = onnx.shape_inference.infer_shapes(m)
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in m.graph.output:
        if out.name in known and known[out.name].type.tensor_type.elem_type:
            out.CopyFrom(known[out.name])
    return m


def to_graph(m: onnx.ModelProto) -> Graph:
    return read_model(model=m)


def run_ir(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[str, np.ndarray] = {**graph.initializers, **feeds}
    for node in graph.nodes:
        outs = evaluate_node(node, [env[i] if i else None for i in node.inputs], graph.opsets)
        env.update((name, np.asarray(v)) for name, v in zip(node.outputs, outs) if name)
    return [env[v.name] for v in graph.outputs]


def feeds_for(m: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random float32 inputs; symbolic dims take their size from ``dims`` (default 2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in m.graph.input:
        shape = [
            d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 2)
            for d in i.type.tensor_type.shape.dim
        ]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def run_pass(
    m: onnx.ModelProto,
    pass_module,
    ctx: PassContext | None = None,
    feeds: dict[str, np.ndarray] | None = None,
) -> tuple[Graph, dict[str, int]]:
    """Convert, run one pass, check the IR still matches onnxruntime on the original model."""
    graph = to_graph(m)
    counts = pass_module.run(graph, ctx or PassContext())
    check_same(m, graph, feeds)
    return graph, counts


def check_same(m: onnx.ModelProto, graph: Graph, feeds: dict[str, np.ndarray] | None = None) -> None:
    feeds = feeds if feeds is not None else feeds_for(m)
    expected = run_ort(m, feeds)
    actual = run_ir(graph, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, what=f"output {i}")


def ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


def const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    """A Constant node holding ``value``."""
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype))
    )


node = helper.make_node
