"""TFLite flatbuffers read through tf2onnx (issue 22, the TFLite half): models written by TF's own
converter here, converted, run by onnxruntime and compared with TFLite's interpreter on one input.

The models are built once per module (TF's import and converter cost seconds); each conversion runs in
its own child process (see ``optcli/frontend/tflite_convert.py`` for why), about five seconds apiece.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from optcli.errors import ModelError
from optcli.frontend import tflite_convert
from optcli.frontend.tflite_convert import tflite_to_onnx
from tests.frontend.tflite_models import SHAPE, run_tflite, sample_input, write_tflite_models

HAVE_EXTRA = find_spec("tensorflow") is not None and find_spec("tf2onnx") is not None
needs_extra = pytest.mark.skipif(not HAVE_EXTRA, reason="tensorflow and tf2onnx are not installed: "
                                                        "pip install 'optcli[tflite]'")


def run_onnx(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {name: x}), strict=True))


@pytest.fixture(scope="module")
def tflite_models(tmp_path_factory) -> dict[str, Path]:
    return write_tflite_models(tmp_path_factory.mktemp("tflite"))


@needs_extra
@pytest.mark.parametrize("kind", ["fp32", "fp16"])
def test_float_models_match_tflite(tflite_models, kind, capfd):
    """fp32, and float16-quantized (fp16 weights behind DEQUANTIZE ops, which tf2onnx folds into fp32
    constants): same outputs, by name, as TFLite's interpreter; NHWC input kept; nothing printed."""
    path = tflite_models[kind]
    model, converter = tflite_to_onnx(path, 17)
    assert capfd.readouterr() == ("", ""), "the converter's output must stay off ours"
    assert converter.startswith("tf2onnx ") and "(tensorflow " in converter, converter
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == list(SHAPE)
    assert {op.op_type for op in model.graph.node} >= {"Conv", "AveragePool", "Softmax"}
    assert not {"DequantizeLinear", "Cast"} & {op.op_type for op in model.graph.node}
    x = sample_input()
    want, got = run_tflite(path, x), run_onnx(model, x)
    assert sorted(got) == sorted(want), "output names are TFLite's"
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)


@needs_extra
def test_int8_model_becomes_qdq_with_int8_io(tflite_models):
    """A fully int8-quantized model comes out as QDQ around float ops, int8 in and out, and agrees with
    TFLite's integer kernels to a few quantization steps (of 256): onnxruntime's float math between Q/DQ
    pairs rounds differently from TFLite's per-layer integer requantization (2-4 steps seen)."""
    path = tflite_models["int8"]
    model, _ = tflite_to_onnx(path, 17)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {op.op_type for op in model.graph.node}
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
    x = sample_input(np.int8)
    want, got = run_tflite(path, x), run_onnx(model, x)
    for name in want:
        assert got[name].dtype == np.int8
        assert np.abs(got[name].astype(int) - want[name].astype(int)).max() <= 4, name


@needs_extra
def test_truncated_file_is_a_model_error(tflite_models, tmp_path):
    """TFLite's reader segfaults on a truncated file read by path; the flatbuffers verifier in the child
    turns it into a one-line error instead."""
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(tflite_models["fp32"].read_bytes()[:15000])
    with pytest.raises(ModelError, match="truncated or corrupt") as err:
        tflite_to_onnx(cut, 17)
    assert str(cut) in str(err.value) and "\n" not in str(err.value)


@needs_extra
def test_garbage_with_the_tflite_identifier_is_a_model_error(tmp_path):
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x1c\x00\x00\x00TFL3" + np.random.default_rng(0).bytes(3000))
    with pytest.raises(ModelError, match="not a valid TFLite flatbuffer"):
        tflite_to_onnx(junk, 17)


def test_missing_extra_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(tflite_convert, "find_spec", lambda name: None if name == "tf2onnx" else object())
    with pytest.raises(ModelError) as err:
        tflite_to_onnx(tmp_path / "m.tflite", 17)
    message = str(err.value)
    assert "pip install 'optcli[tflite]'" in message and "tf2onnx" in message and "\n" not in message


def test_a_crashing_converter_is_a_model_error(monkeypatch, tmp_path):
    """Whatever native code still crashes on a crafted file takes down the child only."""
    monkeypatch.setattr(tflite_convert, "find_spec", lambda name: object())
    monkeypatch.setattr(tflite_convert, "_BOOT", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(ModelError, match=r"crashed \(SIGSEGV\).*truncated or corrupt"):
        tflite_to_onnx(tmp_path / "m.tflite", 17)


def test_ops_left_unconverted_are_found():
    """tf2onnx leaves an op it cannot convert in the graph under its TFLite name (``TFL_GELU``), inside
    control-flow bodies too; those are what the child refuses with a message."""
    body = helper.make_graph([helper.make_node("TFL_GELU", ["a"], ["b"])], "body", [],
                             [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("TFL_GELU", ["x"], ["g"]), helper.make_node("Relu", ["g"], ["r"]),
             helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)]
    graph = helper.make_graph(nodes, "g", [], [])
    assert tflite_convert._unconverted_ops(helper.make_model(graph)) == {"TFL_GELU": 3}


def test_optcli_does_not_import_tensorflow():
    code = "import sys, optcli.frontend.tflite_convert; print('tensorflow' in sys.modules, 'tf2onnx' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
