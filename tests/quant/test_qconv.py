"""Integer convolutions in host plans of quantized models (issue 26): ``fuse_qdq_conv`` turns the QDQ convs of
onnxruntime's quantize_static output and QLinearConv nodes into ``optcli.QConv`` steps, the plan then matches
onnxruntime on the same model within one quantization step, GPU plans keep the float view, and a `.nb` whose
QConv scales or zero points were tampered with is refused at load."""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

import optcli
from optcli.errors import NbFormatError
from optcli.frontend.onnx_reader import read_model
from optcli.passes import fuse_qdq_conv
from optcli.passes.base import PassContext
from optcli.targets import parse_targets
from optcli.zoo import build
from tests.quant.quantized_models import feeds, ort_run, quantized, quiet_quantizer, residual_cnn
from tests.reliability.nbfuzz import parts, rebuild


def qconv_steps(plan) -> int:
    return sum(s.domain == "optcli" and s.op_type == "QConv" for s in plan.steps)


def output_step(model: onnx.ModelProto) -> float:
    """The quantization step of the model's output: its last DequantizeLinear's scale, or the scale of
    the QuantizeLinear feeding its last float op's input when that op is dequantized (a Gemm head)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    node = producers[model.graph.output[0].name]
    while node.op_type != "DequantizeLinear":
        node = producers[node.input[0]]
    return float(inits[node.input[1]])


def test_qdq_convs_become_integer_steps_and_match_onnxruntime(tmp_path):
    model = residual_cnn()
    qdq = quantized(model, "qdq", tmp_path)
    result = optcli.optimize(model=qdq, valid_targets="arm")
    assert qconv_steps(result.plan) == 3  # every Conv of the model
    assert not any(s.op_type == "FakeQuant" and s.inputs[0].endswith("qconv") for s in result.plan.steps)
    predictor = optcli.load(result.data)
    step = output_step(qdq)
    for seed in range(3):
        x = feeds(model, seed)
        ours = predictor.run(x)["y"]
        theirs = ort_run(qdq, x)[0]
        assert np.abs(ours - theirs).max() <= step * 1.01


def test_qlinearconv_nodes_become_integer_steps(tmp_path):
    model = residual_cnn()
    qop = quantized(model, "qoperator", tmp_path)
    assert sum(n.op_type == "QLinearConv" for n in qop.graph.node) == 3
    result = optcli.optimize(model=qop, valid_targets="arm")
    assert qconv_steps(result.plan) == 3
    x = feeds(model, 5)
    ours = optcli.load(result.data).run(x)["y"]
    assert np.abs(ours - ort_run(qop, x)[0]).max() <= output_step(qop) * 1.01


def test_plans_with_a_gpu_target_keep_the_float_view(tmp_path):
    graph = read_model(model=quantized(residual_cnn(), "qdq", tmp_path))
    before = collections.Counter(n.op_type for n in graph.nodes)
    counts = fuse_qdq_conv.run(graph, PassContext(targets=parse_targets("opencl,arm")))
    assert counts["fused"] == 0 and collections.Counter(n.op_type for n in graph.nodes) == before
    assert fuse_qdq_conv.run(graph, PassContext(targets=parse_targets("arm")))["fused"] == 3


class _Reader(CalibrationDataReader):
    def __init__(self, name: str, shape: list[int]):
        rng = np.random.default_rng(0)
        self.feeds = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.feeds, None)


@pytest.fixture(scope="module", params=[False, True], ids=["8-bit weights", "reduce_range"])
def mobilenet_qdq(tmp_path_factory, request):
    """A small MobileNetV2 pre-processed (BN folded into the convs) and quantized as a device engineer
    would: quantize_static, QDQ, per channel, u8 activations, s8 weights (7-bit with reduce_range)."""
    folder = tmp_path_factory.mktemp("mobilenet")
    model = build("mobilenet_v2", resolution=32, width=0.5)
    onnx.save(model, folder / "raw.onnx")
    quant_pre_process(str(folder / "raw.onnx"), str(folder / "fp32.onnx"), skip_symbolic_shape=True)
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    with quiet_quantizer():
        quantize_static(str(folder / "fp32.onnx"), str(folder / "qdq.onnx"), _Reader(inp.name, shape),
                        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, reduce_range=request.param)
    kinds = collections.Counter(n.op_type for n in onnx.load(str(folder / "fp32.onnx")).graph.node)
    return folder / "qdq.onnx", inp.name, shape, (kinds["Conv"], kinds["Add"]), request.param


def test_a_quantized_mobilenet_runs_its_convs_in_integers(mobilenet_qdq):
    path, name, shape, (convs, adds), reduce_range = mobilenet_qdq
    result = optcli.optimize(model_file=str(path), valid_targets="arm")
    assert convs == 52 and qconv_steps(result.plan) == convs
    kinds = collections.Counter(s.op_type for s in result.plan.steps)
    assert kinds["FakeQuant"] == 0 and kinds["Conv"] == 0
    assert adds == 10 and kinds["QAdd"] == adds and kinds["Add"] == 0  # residual blocks stay in u8
    predictor = optcli.load(result.data, threads=2)
    qdq = onnx.load(str(path))
    step = output_step(qdq)
    x = {name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    ours = predictor.run(x)[qdq.graph.output[0].name]
    # onnxruntime running the QDQ graph as written: DequantizeLinear, float Conv, QuantizeLinear
    assert np.abs(ours - ort_run(qdq, x)[0]).max() <= step * 1.01
    if reduce_range:
        # onnxruntime's own integer kernels (its QDQ -> QLinearConv fusions), compared where they are exact:
        # on x86 CPUs without VNNI they sum u8 x s8 product pairs in saturating int16 (vpmaddubsw), which
        # 8-bit weights overflow (that is what its reduce_range is for); optcli's sums never saturate
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert np.abs(ours - session.run(None, x)[0]).max() <= step * 1.01


def _tamper(data: bytes, **attrs) -> bytes:
    body, blob = parts(data)
    step = next(s for s in body["steps"] if s["op"] == "QConv")
    step["attrs"].update(attrs)
    return rebuild(body, blob)


@pytest.fixture(scope="module")
def qconv_nb(tmp_path_factory):
    qdq = quantized(residual_cnn(), "qdq", tmp_path_factory.mktemp("qdq"))
    return optcli.optimize(model=qdq, valid_targets="arm").data


def crafted_quant_attrs(channels: int) -> list:
    """(tampered attributes, what the load error says) for an integer step with QConv's quantization attributes
    and ``channels`` output channels (QConv, QMatMul)."""
    return [
        ({"x_scale": 0.0}, "positive finite scales"),
        ({"y_scale": -0.5}, "positive finite scales"),
        ({"x_scale": math.nan}, "positive finite scales"),
        ({"y_scale": math.inf}, "positive finite scales"),
        ({"x_scale": 1e300}, "positive finite scales"),
        ({"w_scale": [1e-44] * channels}, "positive finite scales"),
        ({"x_scale": 1e30, "y_scale": 1e-30}, "multiplier"),
        ({"x_scale": 1e-30, "y_scale": 1e30}, "multiplier"),
        ({"w_scale": []}, "positive finite scales"),
        ({"w_scale": [0.1, 0.2]}, f"weight scales for {channels} output channels"),
        ({"x_zero_point": 256}, "'x_zero_point' 256 is outside"),
        ({"x_zero_point": -129}, "'x_zero_point' -129 is outside"),
        ({"x_signed": 0, "x_zero_point": -1}, "'x_zero_point' -1 is outside"),
        ({"y_zero_point": 300}, "'y_zero_point' 300 is outside"),
        ({"y_signed": 1, "y_zero_point": 200}, "'y_zero_point' 200 is outside"),
        ({"y_signed": 0, "y_zero_point": -3, "qmin": 0}, "'y_zero_point' -3 is outside"),
        ({"qmin": 10, "qmax": 5}, "qmin and qmax"),
        ({"qmax": 1000}, "qmin and qmax"),
        ({"x_signed": 7}, "'x_signed' must be 0 or 1"),
        ({"x_scale": "0.1"}, "attribute 'x_scale' must be FLOAT"),
    ]


@pytest.mark.parametrize("attrs, message", crafted_quant_attrs(8))
def test_crafted_scales_and_zero_points_are_refused_at_load(qconv_nb, attrs, message):
    optcli.load(qconv_nb)  # the untouched file loads
    with pytest.raises(NbFormatError, match=message):
        optcli.load(_tamper(qconv_nb, **attrs))


def _tamper_weight(data: bytes, which: int, dtype: str) -> bytes:
    """The QConv's weight (1) or bias (2) described with another dtype of the same size, its bytes kept."""
    body, blob = parts(data)
    name = next(s for s in body["steps"] if s["op"] == "QConv")["inputs"][which]
    for entry in body["weights"]:
        if entry["name"] == name:
            entry["dtype"] = dtype
    return rebuild(body, blob)


@pytest.mark.parametrize("which, dtype", [(1, "uint8"), (1, "bool"), (2, "uint32"), (2, "float32")])
def test_crafted_weight_and_bias_dtypes_are_refused_at_load(qconv_nb, which, dtype):
    """A uint8 or bool weight (the same bytes, read as int8 by the kernel) or a float32 bias reached the
    kernel and failed there as "a bug in optcli"; they are the file's fault, refused at load."""
    with pytest.raises(NbFormatError, match="weight must be a constant int8" if which == 1 else "bias must be"):
        optcli.load(_tamper_weight(qconv_nb, which, dtype))


def test_a_qconv_fed_another_dtype_is_the_plans_fault():
    """An activation of another dtype can only come from a crafted plan: NbFormatError (exit 2), not
    a ValueError reported as our bug."""
    from optcli.ops import qconv
    from optcli.ops.registry import StepAttrs

    attrs = StepAttrs({"x_scale": 0.1, "x_zero_point": 0, "w_scale": [0.1], "y_scale": 0.1, "y_zero_point": 0,
                       "qmin": 0, "qmax": 255, "kernel_shape": [1, 1]})
    w = np.ones((2, 3, 1, 1), np.int8)
    with pytest.raises(NbFormatError, match="corrupted or crafted"):
        qconv.qconv([np.zeros((1, 3, 2, 2), np.float32), w, None], attrs)
