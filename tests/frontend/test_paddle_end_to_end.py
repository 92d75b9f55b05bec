"""`opt` on a Paddle inference model, then `optcli run`: the same answers as onnxruntime on the ONNX
paddle2onnx converts it to, for every form Paddle writes, with paddle's logging kept off our output."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from optcli.cli import opt_main, optcli_main
from optcli.frontend.paddle_convert import paddle_to_onnx
from tests.frontend.paddle_models import FORMS, build_paddle_models, needs_paddle
from tests.helpers import run_cli, run_ort

pytestmark = needs_paddle


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_paddle_models(tmp_path_factory.mktemp("paddle"))


@pytest.fixture(scope="module")
def expected(models):
    """onnxruntime on the converted PIR model (all three forms hold the same weights)."""
    model, _ = paddle_to_onnx(models / "pir/inference.json", models / "pir/inference.pdiparams", 17)
    return run_ort(model, {model.graph.input[0].name: np.load(models / "input.npy")})[0]


def _opt_then_run(args: list[str], models, tmp_path, capsys) -> tuple[np.ndarray, dict]:
    """``opt ARGS`` to tmp_path/net.nb, then ``optcli run`` on the sample input: (output, report)."""
    code, out, err = run_cli(opt_main, "opt", [*args, "--valid_targets=arm", f"--optimize_out={tmp_path}/net",
                                               f"--report={tmp_path}/report.json"], capsys)
    assert code == 0, err
    assert "Paddle2ONNX" not in out + err and "WARNING" not in out + err  # the converter's logging stays in its process
    code, _, err = run_cli(optcli_main, "optcli", ["run", f"{tmp_path}/net.nb", f"--input=x={models}/input.npy",
                                                   f"--output_dir={tmp_path}/out"], capsys)
    assert code == 0, err
    [output] = sorted((tmp_path / "out").glob("*.npy"))
    return np.load(output), json.loads((tmp_path / "report.json").read_text())


@pytest.mark.parametrize("form", FORMS)
def test_model_dir_optimizes_and_runs_like_onnxruntime(models, expected, form, tmp_path, capsys):
    got, report = _opt_then_run([f"--model_dir={models / form}"], models, tmp_path, capsys)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, np.load(models / "expected.npy"), rtol=1e-4, atol=1e-4)
    assert report["converted"]["format"] == "paddle"
    assert report["converted"]["converter"].startswith("paddle2onnx ")


def test_model_file_with_param_file_of_another_name(models, expected, tmp_path, capsys):
    """Paddle Lite's --model_file/--param_file pair, the parameters under a name of their own."""
    shutil.copy(models / "legacy/inference.pdmodel", tmp_path / "model.pdmodel")
    shutil.copy(models / "legacy/inference.pdiparams", tmp_path / "weights.bin")
    got, _ = _opt_then_run([f"--model_file={tmp_path / 'model.pdmodel'}", f"--param_file={tmp_path / 'weights.bin'}"],
                           models, tmp_path, capsys)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
