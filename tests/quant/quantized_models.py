"""Small float models built with onnx.helper and quantized by onnxruntime's own quantizer (QDQ,
QOperator, dynamic), for the pass tests of tests/quant; plus the onnxruntime reference runs."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

RNG = np.random.default_rng(3)


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def residual_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Conv -> Relu -> Conv + (MaxPool) -> Relu -> GlobalAveragePool ->
    Flatten -> Gemm(transB): the ops a quantized vision model is made of."""
    n = helper.make_node
    inits = {"w1": _w(8, 3, 3, 3), "b1": _w(8), "w2": _w(8, 8, 3, 3, scale=0.2), "b2": _w(8),
             "w3": _w(8, 8, 1, 1), "b3": _w(8), "wf": _w(10, 8), "bf": _w(10)}
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "w3", "b3"], ["c3"]), n("Add", ["c3", "p1"], ["s"]), n("Relu", ["s"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["g"]), n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def dense_net() -> onnx.ModelProto:
    """x [2, 5, 16] -> (MatMul + Add) twice from the same x (one shared quantization), GELU-free
    Relu, then a MatMul without bias: the shapes of a transformer's dense layers."""
    n = helper.make_node
    inits = {"wq": _w(16, 12), "bq": _w(12), "wk": _w(16, 12), "bk": _w(12), "wo": _w(12, 6)}
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]),
        n("MatMul", ["x", "wk"], ["k0"]), n("Add", ["bk", "k0"], ["k"]),
        n("Mul", ["q", "k"], ["qk"]), n("Relu", ["qk"], ["r"]), n("MatMul", ["r", "wo"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 5, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5, 6])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


class _Reader(CalibrationDataReader):
    def __init__(self, model: onnx.ModelProto, n: int = 8):
        self.samples = iter([feeds(model, seed=100 + i) for i in range(n)])

    def get_next(self):
        return next(self.samples, None)


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in i.type.tensor_type.shape.dim]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def quantized(model: onnx.ModelProto, kind: str, folder: Path, per_channel: bool = True) -> onnx.ModelProto:
    """``kind``: "qdq" or "qoperator" (quantize_static, u8 activations, s8 weights) or "dynamic"."""
    src, dst = folder / "float.onnx", folder / f"{kind}_{int(per_channel)}.onnx"
    onnx.save(model, src)
    with quiet_quantizer():
        if kind == "dynamic":
            quantize_dynamic(str(src), str(dst), per_channel=per_channel)
        else:
            fmt = QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator
            quantize_static(str(src), str(dst), _Reader(model), quant_format=fmt, per_channel=per_channel)
    return onnx.load(str(dst))


@contextmanager
def quiet_quantizer():
    """The quantizer's advice to pre-process goes to the root logger: silence it while it runs
    only (a root level left at ERROR would hide the warnings other tests' caplog looks for)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def ort_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime on the graph as written (no fusions): the reference every rewrite must keep."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, inputs)


def ort_extended_nodes(model: onnx.ModelProto, folder: Path) -> int:
    """Nodes onnxruntime keeps after its extended optimizations (its quantization fusions)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(folder / "ort_extended.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(str(folder / "ort_extended.onnx")).graph.node)
