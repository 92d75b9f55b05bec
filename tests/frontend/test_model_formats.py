"""Which kind of model a file or directory holds: by content, Paddle's names, never by suffix alone."""

from __future__ import annotations

import sys
import types

import onnx
import pytest
from onnx import TensorProto, helper

from optcli.errors import ModelError, UsageError
from optcli.frontend import model_formats
from optcli.frontend.model_formats import identify

# The first bytes of a real TFLite flatbuffer (root offset, then the "TFL3" file identifier).
TFLITE_HEAD = b"\x1c\x00\x00\x00TFL3\x14\x00 \x00" + bytes(64)
PIR_HEAD = b'{"base_code":{"magic":"pir","trainable":false,"version":1},"program":{}}'


def _onnx_bytes() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_tflite_flatbuffer_is_known_by_content_whatever_its_name(tmp_path):
    path = tmp_path / "model.onnx"  # misnamed on purpose
    path.write_bytes(TFLITE_HEAD)
    assert identify(path, None).format == "tflite"


def test_an_onnx_file_stays_onnx(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(_onnx_bytes())
    found = identify(path, None)
    assert (found.format, found.path, found.params) == ("onnx", path, None)


def test_a_paddle_program_finds_its_parameters_by_its_name(tmp_path):
    (tmp_path / "inference.pdmodel").write_bytes(b"\x0a\x05block")
    (tmp_path / "inference.pdiparams").write_bytes(b"\x00" * 16)
    found = identify(tmp_path / "inference.pdmodel", None)
    assert (found.format, found.params) == ("paddle", tmp_path / "inference.pdiparams")
    by_dir = identify(None, tmp_path)
    assert (by_dir.format, by_dir.path, by_dir.params) == ("paddle", tmp_path / "inference.pdmodel",
                                                           tmp_path / "inference.pdiparams")


def test_a_pir_program_is_known_by_content_and_preferred_in_a_directory(tmp_path):
    (tmp_path / "inference.json").write_bytes(PIR_HEAD)
    (tmp_path / "inference.pdiparams").write_bytes(b"\x00" * 16)
    (tmp_path / "other.json").write_text('{"not": "paddle"}')
    found = identify(None, tmp_path)
    assert (found.format, found.path.name, found.params.name) == ("paddle", "inference.json", "inference.pdiparams")
    renamed = tmp_path / "net.json"
    renamed.write_bytes(PIR_HEAD)
    assert identify(renamed, None).format == "paddle"


def test_an_old_model_directory_with_one_file_per_parameter(tmp_path):
    (tmp_path / "__model__").write_bytes(b"\x0a\x05block")
    (tmp_path / "conv1_weights").write_bytes(b"\x00" * 16)
    found = identify(None, tmp_path)
    assert (found.format, found.path.name, found.params) == ("paddle", "__model__", None)
    (tmp_path / "__params__").write_bytes(b"\x00" * 16)
    assert identify(None, tmp_path).params == tmp_path / "__params__"


def test_param_file_names_the_parameters_and_must_exist(tmp_path):
    program = tmp_path / "net.pdmodel"
    program.write_bytes(b"\x0a\x05block")
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 16)
    assert identify(program, None, tmp_path / "weights.bin").params == tmp_path / "weights.bin"
    with pytest.raises(ModelError, match="no such parameters file"):
        identify(program, None, tmp_path / "missing.pdiparams")


def test_param_file_with_a_model_that_is_not_paddle_is_a_usage_error(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(TFLITE_HEAD)
    with pytest.raises(UsageError, match="--param_file is for Paddle models"):
        identify(path, None, tmp_path / "p.pdiparams")


def test_a_directory_with_no_model_says_what_it_reads(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ModelError, match="Paddle inference model .* one .tflite file"):
        identify(None, tmp_path)


def test_a_directory_with_one_tflite_file(tmp_path):
    (tmp_path / "detect.tflite").write_bytes(TFLITE_HEAD)
    assert identify(None, tmp_path).format == "tflite"


def test_two_paddle_programs_ask_which(tmp_path):
    for name in ("a.pdmodel", "b.pdmodel"):
        (tmp_path / name).write_bytes(b"\x0a")
    with pytest.raises(ModelError, match="2 Paddle programs"):
        identify(None, tmp_path)


def test_opt_reports_the_conversion_and_reads_the_converted_model(tmp_path, monkeypatch):
    """The compiler reads what the converter returns and names the converter in the report (the
    converter itself is stubbed here; tests/frontend/test_*_convert.py run the real ones)."""
    from optcli.compiler import compile_model

    path = tmp_path / "m.tflite"
    path.write_bytes(TFLITE_HEAD)
    converted = onnx.load_from_string(_onnx_bytes())
    calls = []

    def fake(p, opset):
        calls.append((p, opset))
        return converted, "fake-converter 1.0"

    monkeypatch.setitem(sys.modules, "optcli.frontend.tflite_convert", types.SimpleNamespace(tflite_to_onnx=fake))
    result = compile_model(model_file=str(path), valid_targets="arm")
    assert calls == [(path, model_formats.CONVERT_OPSET)]
    assert result.report["converted"]["converter"] == "fake-converter 1.0"
    assert result.report["converted"]["format"] == "tflite"
    assert [s.op_type for s in result.plan.steps] == ["Relu"]
