"""opt --verify: the measured-precision safety net and its exit code."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import optcli
from optcli.zoo import build
from tests.test_cli import run


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("v") / "net.onnx"
    onnx.save(build("mobilenet_v2", resolution=32, width=0.5), path)
    return path


def test_verify_reports_each_output(model_file):
    report = optcli.optimize(model_file=model_file, quant_type="QUANT_INT8", verify=True).report["verify"]
    assert report["reference"] == "onnxruntime" and report["samples"] == 8 and report["passed"]
    out = report["outputs"][0]
    assert out["cosine"] > 0.99 and out["top1_agreement"] is not None and out["relative_error"] < 5e-2


def test_verify_failure_exits_3_and_writes_no_nb(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_file={model_file}", "--quant_model", "--verify", "--verify_tolerance=1e-6",
                        f"--optimize_out={tmp_path}/m", f"--report={tmp_path}/r.json"], capsys)
    assert code == 3 and "verification failed" in err and "FAIL" in err
    assert not (tmp_path / "m.nb").exists()
    assert json.loads((tmp_path / "r.json").read_text())["verify"]["passed"] is False


def test_verify_with_calibration_samples(model_file, tmp_path, capsys):
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", rng.standard_normal((3, 32, 32)).astype(np.float32))  # no batch dim
    code, _, err = run([f"--model_file={model_file}", "--verify", f"--calib_data={tmp_path}",
                        f"--optimize_out={tmp_path}/m"], capsys)
    assert code == 0 and "on 3 input(s)" in err


def test_bad_calibration_folder(model_file, tmp_path, capsys):
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    code, _, err = run([f"--model_file={model_file}", "--verify", f"--calib_data={tmp_path}",
                        f"--optimize_out={tmp_path}/m"], capsys)
    assert code == 2 and "bad.npy" in err


def test_verify_without_onnxruntime_uses_the_fp32_arm_plan(model_file, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ImportError("onnxruntime is not installed (test)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    report = optcli.optimize(model_file=model_file, enable_fp16=True, verify=True).report["verify"]
    assert report["reference"] == "optcli arm fp32" and report["passed"]


def test_calibration_from_images(tmp_path):
    from PIL import Image

    model = build("mobilenet_v2", resolution=32, width=0.25)
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / f"img{i}.png")
    result = optcli.optimize(model=model, quant_type="INT8", calib_data=tmp_path,
                             calib_preprocess="resize=32,mean=0.485,0.456,0.406,std=0.229,0.224,0.225,layout=NCHW")
    assert result.report["int8"]["samples"] == 4
