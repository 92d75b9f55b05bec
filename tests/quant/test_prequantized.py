"""Models quantized by onnxruntime's own quantizer (QDQ, QOperator, dynamic) load, fold and run on
every target with outputs matching onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

import optcli
from optcli.ops.activation import QUANT_ATTR
from optcli.tolerance import RELATIVE, max_error
from optcli.zoo import build, sample_inputs
from tests.quant.quantized_models import quiet_quantizer


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    model = build("mobilenet_v2", resolution=32, width=0.5)
    path = tmp_path_factory.mktemp("q") / "float.onnx"
    onnx.save(model, path)
    return model, path


class _Reader(CalibrationDataReader):
    def __init__(self, model):
        self.samples = iter([sample_inputs(model, seed=i) for i in range(4)])

    def get_next(self):
        return next(self.samples, None)


def _quantized(float_model, kind: str) -> onnx.ModelProto:
    model, path = float_model
    out = path.with_name(f"{kind}.onnx")
    if not out.exists():
        with quiet_quantizer():
            if kind == "dynamic":
                quantize_dynamic(str(path), str(out))
            else:
                fmt = QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator
                quantize_static(str(path), str(out), _Reader(model), quant_format=fmt)
    return onnx.load(out)


def _ort_extended_nodes(model: onnx.ModelProto, tmp_path) -> int:
    """Nodes onnxruntime keeps after its extended optimizations (its QDQ and quantization fusions)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "ort_extended.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(str(tmp_path / "ort_extended.onnx")).graph.node)


@pytest.mark.parametrize("targets", ["arm", pytest.param("opencl,arm", marks=pytest.mark.opencl)])
@pytest.mark.parametrize("kind", ["qdq", "qoperator", "dynamic"])
def test_matches_onnxruntime(float_model, kind, targets, tmp_path):
    q = _quantized(float_model, kind)
    feeds = sample_inputs(float_model[0], seed=9)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    expected = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    result = optcli.optimize(model=q, valid_targets=targets, disabled_passes={"keep_small_islands_on_host"})
    got = optcli.load(result.data, require_gpu=targets != "arm").run(feeds)["output"]
    err, scale = max_error(got, expected)
    # Integer accumulations are exact; only rounding ties of a requantization may differ by one step.
    assert err / scale <= RELATIVE["int8"] / 10, (err, scale)
    ops = result.report["ops_after"]
    compute = [s for s in result.report["steps"] if s["op"] not in ("Upload", "Download", "Pack", "Unpack")]
    assert len(compute) <= _ort_extended_nodes(q, tmp_path)
    if kind != "dynamic" and targets == "arm":
        # no GPU: the convs run as integer QConv steps; QOperator models are onnxruntime's arithmetic to the bit
        assert ops.get("QConv", 0) > 10 and "QLinearConv" not in ops and "Conv" not in ops
        assert kind == "qdq" or np.array_equal(got, expected)
    elif kind != "dynamic":
        # the float view: every QuantizeLinear/DequantizeLinear pair is a FakeQuant, and all but the
        # input's are the last stage of the epilogue of the op before them
        assert "QuantizeLinear" not in ops and "QLinearConv" not in ops and ops.get("FakeQuant", 0) <= 2
        assert sum(QUANT_ATTR in s.attrs for s in result.plan.steps) > 100
        if targets != "arm":
            assert result.report["transfers"]["uploads"] == 1, "the whole quantized model runs on the GPU"
    else:
        assert ops.get("DynamicQuantizeMatMul") == 1 and "MatMulInteger" not in ops


def test_quantized_weights_stay_int8_in_the_file(float_model):
    q = _quantized(float_model, "qdq")
    quantized = optcli.optimize(model=q).report["sizes"]["weights_by_dtype"]
    assert quantized.get("int8", 0) > 4 * quantized.get("float32", 0)
