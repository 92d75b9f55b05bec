"""optcli's own full int8 PTQ as integer steps on the host (issue 26): which activations it quantizes
(``passes/_helpers/ptq_tensors.py``), the QDQ chains it writes, and what the lowering makes of them.

The model: a stem Conv -> Relu -> MaxPool, a residual block (Conv -> Relu -> Conv, Add with the pool's
output, Relu), a global pool and a Gemm head, plus a Sigmoid side output straight off the stem."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.frontend.onnx_reader import read_model
from optcli.passes import quantize_int8
from optcli.passes._helpers import ptq_tensors
from optcli.tolerance import RELATIVE, max_error


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w0", 8, 3, 3, 3), w("b0", 8), w("w1", 8, 8, 3, 3), w("w2", 8, 8, 3, 3), w("wf", 5, 8), w("bf", 5)]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p0", "w1"], ["c1"], pads=[1, 1, 1, 1], name="block_a"),
        helper.make_node("Relu", ["c1"], ["r1"], name="block_a_relu"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="block_b"),
        helper.make_node("Add", ["c2", "p0"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="residual_relu"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="head"),
        helper.make_node("Sigmoid", ["r0"], ["side"], name="side"),
    ]
    graph = helper.make_graph(nodes, "ptq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _samples(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib")
    for i, x in enumerate(_samples(16, seed=1)):
        np.save(folder / f"{i:02d}.npy", x)
    return folder


def test_chosen_tensors():
    graph = read_model(model=_model())
    ops = quantize_int8.quantizable(graph)
    tensors, groups = ptq_tensors.choose(graph, ops, [])
    # the convs' and Add's activations after their Relu (the integer step absorbs it), not before
    assert {"r0", "r1", "r2"} <= set(tensors) and not {"c0", "c1", "s"} & set(tensors)
    assert {"x", "p0", "c2", "g", "f"} <= set(tensors)  # the block's Add operands, the pool and head input
    assert "y" not in tensors and "side" not in tensors, "graph outputs stay float"
    assert groups["p0"] == groups["r0"], "MaxPool's input and output share one quantization"
    assert groups["g"] == groups["f"] and groups["g"] != groups["r2"], "Flatten moves bytes; the pool requantizes"
    # an op kept in float keeps its input float (and the chain to it stops there)
    kept = [n for n in ops if n.name == "block_b"]
    tensors, _ = ptq_tensors.choose(graph, [n for n in ops if n.name != "block_b"], kept)
    assert "r1" not in tensors


def test_host_plan_is_integer_and_matches_the_float_view(calib):
    model = _model()
    host = optcli.optimize(model=model, quant_type="INT8", calib_data=calib)
    ops = host.report["ops_after"]
    assert ops.get("QConv") == 3 and ops.get("QAdd") == 1 and ops.get("QGlobalAveragePool") == 1, ops
    assert "FakeQuant" not in ops, ops
    steps = optcli.load(host.data).plan.steps
    pool = next(s for s in steps if s.op_type == "MaxPool")
    producer = next(s for s in steps if pool.inputs[0] in s.outputs)
    assert producer.op_type == "QConv", "the pool reads the stem's bytes"
    # the same quantization as a float view (what a GPU target gets): no integer step, the same answers
    view = optcli.optimize(model=model, quant_type="INT8", calib_data=calib,
                           disabled_passes={"fuse_qdq_conv", "fuse_qdq_add", "fuse_qdq_movement", "fuse_qdq_se"})
    assert "QConv" not in view.report["ops_after"] and view.report["ops_after"].get("Conv") == 3
    a, b = optcli.load(host.data), optcli.load(view.data)
    fp32 = optcli.load(optcli.optimize(model=model).data)
    for x in _samples(8, seed=7):
        got, expected, ref = a.run({"x": x}), b.run({"x": x}), fp32.run({"x": x})
        err, scale = max_error(got["y"], expected["y"])
        assert err / scale <= RELATIVE["int8"], (err, scale)
        err, scale = max_error(got["y"], ref["y"])
        assert err / scale < 0.1, "int8 stays near fp32"
        np.testing.assert_allclose(got["side"], ref["side"], atol=0.02), "the side output reads the stem's bytes"


def test_silu_between_convs_is_a_byte_table(calib):
    """YOLOv8's Conv -> x * Sigmoid(x) -> Conv: fuse_activation_patterns makes the SiLU one optcli.Swish
    before quantize_int8 runs, and the PTQ must still hand bytes from conv to conv (a QLookup of the
    conv's output), not dequantize, run Swish in float and quantize again (which made YOLOv8n's int8
    plan 2.3x slower than its fp32 plan)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w0", (8, 3, 3, 3)), ("w1", (4, 8, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c0"], ["sg"]), helper.make_node("Mul", ["c0", "sg"], ["a"]),
             helper.make_node("Conv", ["a", "w1"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = optcli.optimize(model=model, quant_type="INT8", calib_data=calib)
    ops = plan.report["ops_after"]
    assert ops.get("QLookup") == 1 and ops.get("QConv") == 1 and "Swish" not in ops, ops
    fp32 = optcli.load(optcli.optimize(model=model).data)
    x = _samples(1, seed=9)[0]
    err, scale = max_error(optcli.load(plan.data).run({"x": x})["y"], fp32.run({"x": x})["y"])
    assert err / scale < 0.1


def _hard_swish_model() -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w0", (8, 3, 3, 3)), ("w1", (4, 8, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["a"]), helper.make_node("Conv", ["a", "w1"], ["y"])]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_gpu_plans_quantize_after_the_epilogue_activation():
    """On the host a conv's hard-swish is a byte table between two quantized tensors; a GPU's float view
    fuses it into the conv's epilogue, so there the conv's raw output must stay unquantized (a FakeQuant
    between the conv and its activation would leave both as separate steps: MobileNetV3's GPU plan had 19
    HardSwish and 29 FakeQuant steps of their own)."""
    graph = read_model(model=_hard_swish_model())
    ops = quantize_int8.quantizable(graph)
    host, _ = ptq_tensors.choose(graph, ops, [])
    gpu, _ = ptq_tensors.choose(graph, ops, [], for_gpu=True)
    assert {"c0", "a"} <= set(host)
    assert "a" in gpu and "c0" not in gpu


@pytest.mark.opencl
def test_gpu_plan_fuses_the_activation_and_its_fake_quant(calib):
    model = _hard_swish_model()
    plan = optcli.optimize(model=model, valid_targets="opencl,arm", quant_type="INT8", calib_data=calib,
                           disabled_passes={"keep_small_islands_on_host"})
    kinds = [(s.op_type, s.target) for s in plan.plan.steps]
    assert ("HardSwish", "opencl") not in kinds and kinds.count(("Conv", "opencl")) == 2, kinds
    assert sum(op == "FakeQuant" for op, _ in kinds) <= 1, kinds  # the graph input's, at most


def test_calibration_samples_must_be_finite(tmp_path):
    """A NaN or inf in a sample is the data's fault, named with its file (it made a FakeQuant of infinite
    scale, which the compiler's own .nb check then refused as an internal error)."""
    from optcli.errors import UsageError

    for i, x in enumerate(_samples(3)):
        if i == 1:
            x[0, 2, 3, 4] = np.nan
        np.save(tmp_path / f"{i}.npy", x)
    with pytest.raises(UsageError, match=r"1\.npy: input 'x' holds 1 NaN or infinite"):
        optcli.optimize(model=_model(), quant_type="INT8", calib_data=tmp_path)


def test_a_tensor_that_overflows_in_calibration_is_quantized_from_its_finite_values(tmp_path):
    """x * 1e30 * 1e30 overflows to inf where |x| > 3.4e-22: the ranges come from the finite values (an
    infinite range made a FakeQuant of infinite scale, which the compiler's .nb check refused as an internal
    error); the plan compiles and runs."""
    n = helper.make_node
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32), "w")
    big = numpy_helper.from_array(np.array(1e30, np.float32), "big")
    nodes = [n("Conv", ["x", "w"], ["c"]), n("Mul", ["c", "big"], ["m1"]), n("Mul", ["m1", "big"], ["m2"]),
             n("Conv", ["m2", "w4"], ["y"])]
    w4 = numpy_helper.from_array((rng.standard_normal((2, 4, 1, 1)) * 0.3).astype(np.float32), "w4")
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], [w, big, w4])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for i in range(4):  # most values ~1e-24 (finite after the Muls), some 1e-19 (inf)
        x = rng.standard_normal((1, 3, 4, 4)) * 1e-24
        x[0, :, 0, 0] = 1e-19
        np.save(tmp_path / f"{i}.npy", x.astype(np.float32))
    plan = optcli.optimize(model=model, quant_type="INT8", calib_data=tmp_path)
    out = optcli.load(plan.data).run({"x": (rng.standard_normal((1, 3, 4, 4)) * 1e-23).astype(np.float32)})["y"]
    assert out.shape == (1, 2, 4, 4)


def test_dense_layers_run_as_integer_matmuls(tmp_path):
    """MatMul + bias Add + Relu (torch's Linear) and Gemm layers: the own PTQ quantizes their outputs after the
    bias and the Relu, so fuse_qdq_matmul makes QMatMul steps, the last one too, whose output only a float
    Softmax reads (quantized because its producer has an integer step, as in a transformer's attention)."""
    n = helper.make_node
    rng = np.random.default_rng(6)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [n("MatMul", ["x", "w1"], ["m1"]), n("Add", ["m1", "b1"], ["a1"]), n("Relu", ["a1"], ["r1"]),
             n("Gemm", ["r1", "w2", "b2"], ["g2"], transB=1), n("Relu", ["g2"], ["r2"]),
             n("MatMul", ["r2", "w3"], ["logits"]), n("Softmax", ["logits"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 7])],
                              [init("w1", 24, 32), init("b1", 32), init("w2", 16, 32), init("b2", 16),
                               init("w3", 16, 7)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for i in range(64):  # (with 8, the last hidden layer's range missed the test input's: saturation)
        np.save(tmp_path / f"{i}.npy", rng.standard_normal((5, 24)).astype(np.float32))
    plan = optcli.optimize(model=model, quant_type="INT8", calib_data=tmp_path)
    ops = plan.report["ops_after"]
    assert ops == {"QuantizeLinear": 1, "QMatMul": 3, "DequantizeLinear": 1, "Softmax": 1}, ops
    view = optcli.optimize(model=model, quant_type="INT8", calib_data=tmp_path, disabled_passes={"fuse_qdq_matmul"})
    assert "QMatMul" not in view.report["ops_after"]
    fp32 = optcli.load(optcli.optimize(model=model).data)
    for seed in range(4):
        x = np.random.default_rng(100 + seed).standard_normal((5, 24)).astype(np.float32)
        got = optcli.load(plan.data).run({"x": x})["y"]
        err, scale = max_error(got, optcli.load(view.data).run({"x": x})["y"])
        assert err / scale <= RELATIVE["int8"], "the integer steps compute the float view's quantization"
        err, scale = max_error(got, fp32.run({"x": x})["y"])
        assert err / scale < 0.1


def test_outputs_are_quantized_only_where_an_integer_step_writes_them():
    """A 1-D conv has no integer step (QConv is 2-D): its output quantized would only cost a FakeQuant before
    the float Softmax that reads it; a 2-D conv's is quantized, its QConv writes it."""
    rng = np.random.default_rng(8)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"]), n("Softmax", ["c1"], ["y1"], axis=-1),
             n("Unsqueeze", ["x", "axes"], ["x4"]), n("Conv", ["x4", "w2"], ["c2"]), n("Softmax", ["c2"], ["y2"])]
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((6, 4, 1, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([2], np.int64), "axes")]
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 20])],
                              [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 6, 18]),
                               helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 6, 1, 18])], inits)
    g = read_model(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    tensors, _ = ptq_tensors.choose(g, quantize_int8.quantizable(g), [])
    assert "c2" in tensors and "c1" not in tensors and "x" in tensors, tensors
