"""Models quantized by onnxruntime's own quantizer (QDQ, QOperator, dynamic) load, fold and run on
every target with outputs matching onnxruntime's."""

from __future__ import annotations

import logging

import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

import optcli
from optcli.tolerance import RELATIVE, max_error
from optcli.zoo import build, sample_inputs

logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process


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
        if kind == "dynamic":
            quantize_dynamic(str(path), str(out))
        else:
            fmt = QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator
            quantize_static(str(path), str(out), _Reader(model), quant_format=fmt)
    return onnx.load(out)


@pytest.mark.parametrize("targets", ["arm", "opencl,arm"])
@pytest.mark.parametrize("kind", ["qdq", "qoperator", "dynamic"])
def test_matches_onnxruntime(float_model, kind, targets):
    q = _quantized(float_model, kind)
    feeds = sample_inputs(float_model[0], seed=9)
    expected = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    result = optcli.optimize(model=q, valid_targets=targets, disabled_passes={"keep_small_islands_on_host"})
    got = optcli.load(result.data).run(feeds)["output"]
    err, scale = max_error(got, expected)
    # Integer accumulations are exact; only rounding ties of a requantization may differ by one step.
    assert err / scale <= RELATIVE["int8"] / 10, (err, scale)
    if kind != "dynamic":
        ops = result.report["ops_after"]
        assert "QuantizeLinear" not in ops and "QLinearConv" not in ops and ops.get("FakeQuant", 0) > 10
        if targets != "arm":
            assert result.report["transfers"]["uploads"] == 1, "the whole quantized model runs on the GPU"


def test_quantized_weights_stay_int8_in_the_file(float_model):
    q = _quantized(float_model, "qdq")
    quantized = optcli.optimize(model=q).report["sizes"]["weights_by_dtype"]
    assert quantized.get("int8", 0) > 4 * quantized.get("float32", 0)
