"""`opt` (and ``optcli.optimize``) on a TFLite flatbuffer, then the `.nb` run: the same answers as TFLite's
own interpreter and as onnxruntime on the ONNX tf2onnx converts it to, with TF's logging kept off our
output.  The models are those of test_tflite_convert.py, written by TF's converter once per module."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import optcli
from optcli.cli import opt_main
from optcli.frontend.tflite_convert import tflite_to_onnx
from tests.frontend.test_tflite_convert import HAVE_EXTRA, run_onnx
from tests.frontend.tflite_models import run_tflite, sample_input, write_tflite_models
from tests.helpers import run_cli

pytestmark = [pytest.mark.skipif(not HAVE_EXTRA, reason="tensorflow and tf2onnx are not installed: "
                                                        "pip install 'optcli[tflite]'")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_tflite_models(tmp_path_factory.mktemp("tflite"))


def _assert_matches(got: dict, want: dict, steps: int = 0) -> None:
    """Outputs by TFLite's tensor names: float to 1e-4, int8 to ``steps`` quantization steps."""
    assert sorted(got) == sorted(want), "the .nb's outputs keep TFLite's names"
    for name, expected in want.items():
        if expected.dtype == np.int8:
            assert got[name].dtype == np.int8, name
            assert np.abs(got[name].astype(int) - expected.astype(int)).max() <= steps, name
        else:
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4, err_msg=name)


def test_opt_model_file_runs_like_tflite_and_onnxruntime(models, tmp_path, capsys):
    """The issue's command line on an fp32 model; the report says what converted it."""
    path = models["fp32"]
    code, out, err = run_cli(opt_main, "opt", [f"--model_file={path}", "--valid_targets=arm",
                                               f"--optimize_out={tmp_path}/net", f"--report={tmp_path}/report.json"],
                             capsys)
    assert code == 0, err
    for chatter in ("XNNPACK", "tensorflow/", "tf2onnx.", "WARNING:", "W0000", "I0000"):
        assert chatter not in out + err, f"the converter's logging stays in its process: {chatter!r} in {out + err}"
    converted = json.loads((tmp_path / "report.json").read_text())["converted"]
    assert converted["format"] == "tflite" and converted["converter"].startswith("tf2onnx "), converted
    x = sample_input()
    got = optcli.load(str(tmp_path / "net.nb")).run([x])
    _assert_matches(got, run_tflite(path, x))
    _assert_matches(got, run_onnx(tflite_to_onnx(path, 17)[0], x))


def test_model_dir_with_one_fp16_quantized_tflite(models, tmp_path, capsys):
    """``--model_dir`` holding one ``.tflite`` (float16-quantized weights), named by content, not suffix."""
    shutil.copy(models["fp16"], tmp_path / "detect.tflite")
    code, _, err = run_cli(opt_main, "opt", [f"--model_dir={tmp_path}", "--valid_targets=arm",
                                             f"--optimize_out={tmp_path}/net"], capsys)
    assert code == 0, err
    x = sample_input()
    _assert_matches(optcli.load(str(tmp_path / "net.nb")).run([x]), run_tflite(models["fp16"], x))


def test_optimize_an_int8_tflite(models):
    """The Python API on a fully int8 model (QDQ after tf2onnx, int8 in and out): within a few quantization
    steps of TFLite's integer kernels, as onnxruntime on the converted model is."""
    result = optcli.optimize(models["int8"], valid_targets="arm")
    x = sample_input(np.int8)
    _assert_matches(optcli.load(result.data).run([x]), run_tflite(models["int8"], x), steps=4)
