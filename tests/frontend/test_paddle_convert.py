"""Paddle inference models to ONNX through paddle2onnx: every form Paddle writes, and clear errors.

The models are written by Paddle's own exporters (``paddle_models.py``, in a child process) and the
converted ONNX must answer what Paddle's predictor answers."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import onnx
import pytest

from optcli.errors import ModelError
from optcli.frontend.paddle_convert import MAX_OPSET, MAX_REASON, failure_reason, paddle_to_onnx
from tests.frontend.paddle_models import build_paddle_models, needs_paddle
from tests.helpers import run_ort

pytestmark = needs_paddle


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_paddle_models(tmp_path_factory.mktemp("paddle"))


@pytest.mark.parametrize("program, params, opset", [
    ("pir/inference.json", "pir/inference.pdiparams", 99),  # paddle2onnx 2.0 aborts above 21: we ask for 21
    ("legacy/inference.pdmodel", "legacy/inference.pdiparams", 17),
    ("old/__model__", None, 11),
])
def test_converted_model_answers_like_paddle(models, program, params, opset):
    model, converter = paddle_to_onnx(models / program, models / params if params else None, opset)
    onnx.checker.check_model(model)
    assert converter.startswith("paddle2onnx ") and "(paddlepaddle " in converter
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [min(opset, MAX_OPSET)]
    got = run_ort(model, {model.graph.input[0].name: np.load(models / "input.npy")})[0]
    np.testing.assert_allclose(got, np.load(models / "expected.npy"), rtol=1e-4, atol=1e-4)


def test_corrupt_program_is_a_model_error(models, tmp_path):
    program = tmp_path / "inference.pdmodel"
    program.write_bytes((models / "legacy/inference.pdmodel").read_bytes()[:200])
    with pytest.raises(ModelError, match=r"inference.pdmodel: paddle2onnx could not convert it: .*program") as err:
        paddle_to_onnx(program, models / "legacy/inference.pdiparams", 17)
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_missing_parameters_are_a_model_error(models, tmp_path):
    """A legacy program without its parameters file looks for one file per parameter, and finds none."""
    shutil.copy(models / "legacy/inference.pdmodel", tmp_path)
    with pytest.raises(ModelError, match=r"inference.pdmodel: .*--param_file"):
        paddle_to_onnx(tmp_path / "inference.pdmodel", None, 17)


def test_parameters_of_another_model_are_a_model_error(models):
    """paddle2onnx aborts the process on these: the child process turns that into a one-line error."""
    with pytest.raises(ModelError, match=r"inference.json: paddle2onnx could not convert it: .*--param_file"):
        paddle_to_onnx(models / "pir/inference.json", models / "legacy/inference.pdmodel", 17)


def test_absent_files_are_named(models, tmp_path):
    with pytest.raises(ModelError, match="no such Paddle program file"):
        paddle_to_onnx(tmp_path / "inference.json", None, 17)
    with pytest.raises(ModelError, match=r"gone.pdiparams: no such Paddle parameters file"):
        paddle_to_onnx(models / "pir/inference.json", tmp_path / "gone.pdiparams", 17)


def test_without_the_extra_the_error_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "paddle2onnx" else real(name, *a))
    with pytest.raises(ModelError, match=r"needs paddle2onnx: pip install 'optcli\[paddle\]'$"):
        paddle_to_onnx(tmp_path / "inference.json", None, 17)


@pytest.mark.parametrize("output, code, reason", [
    ("[Paddle2ONNX] Start\n[ERROR][Paddle2ONNX] Due to the unsupported operators, the conversion is aborted.\n"
     "FatalError: `Process abort signal` is detected", -6, "Due to the unsupported operators"),
    ("\x1b[0;31m2026-01-01 [ERROR]\tFailed to convert PaddlePaddle model: bad json.\x1b[0m\n[ERROR] None", 1,
     "bad json"),
    ("Traceback (most recent call last):\n  File x\nValueError: (NotFound) no file\n  [Hint: x]", 1,
     "(NotFound) no file"),
    ("", -9, "killed by signal 9"),
])
def test_failure_reason_is_the_line_that_says_why(output, code, reason):
    found = failure_reason(output, code)
    assert reason in found and "\n" not in found


def test_failure_reason_is_bounded():
    assert len(failure_reason("[ERROR] " + "x" * 5000, 1)) <= MAX_REASON
