"""Full int8 post-training quantization: calibrators, top-1 agreement with fp32, both targets,
and --precision=auto keeping sensitive ops in float."""

from __future__ import annotations

import numpy as np
import pytest

import optcli
from optcli.errors import UsageError
from optcli.tolerance import RELATIVE, max_error
from optcli.zoo import build, sample_inputs


def _calib_dir(tmp_path_factory, model, n=32):
    folder = tmp_path_factory.mktemp("calib")
    for i in range(n):
        np.save(folder / f"{i:03d}.npy", sample_inputs(model, seed=1000 + i)["input"])
    return folder


def _snr_db(expected: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(expected ** 2) / np.sum((got - expected) ** 2)))


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18", "efficientnet_lite0", "mobilenet_v3"])
def test_top1_agreement_on_200_seeded_inputs(name, tmp_path_factory):
    """These random-weight models give nearly the same class for every input (EfficientNet-Lite0:
    one class for all 200), so top-1 agreement alone would pass a constant model: the int8 output
    must also follow what varies from input to input (the SNR of its deviation from the fp32
    mean; a model that ignores its input scores 0 dB).  Real weights: test_real_weights.py.  Every
    conv is an integer step and no FakeQuant is left on the host, MobileNetV3's hard-swish and
    squeeze-excite blocks included (byte tables, QMul, QGlobalAveragePool)."""
    model = build(name, resolution=32)
    calib = _calib_dir(tmp_path_factory, model)
    fp32 = optcli.load(optcli.optimize(model=model).data)
    result = optcli.optimize(model=model, quant_type="INT8", calib_data=calib)
    int8 = optcli.load(result.data)
    tests = [sample_inputs(model, seed=i) for i in range(200)]
    ref = np.concatenate([fp32.run(x)["output"] for x in tests])
    got = np.concatenate([int8.run(x)["output"] for x in tests])
    assert np.mean(ref.argmax(1) == got.argmax(1)) >= 0.98
    snr = _snr_db(ref - ref.mean(0), got - ref.mean(0))
    assert snr >= 10, snr  # measured 12.9, 18.0, 11.0, 14.9 dB
    assert result.report["sizes"]["weights_by_dtype"]["int8"] > 0
    ops = result.report["ops_after"]
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    assert ops.get("QConv", 0) == convs and "FakeQuant" not in ops, f"every conv runs in integers: {ops}"


@pytest.mark.opencl
@pytest.mark.parametrize("calibrator", ["minmax", "percentile", "entropy"])
def test_calibrators_and_gpu(calibrator, tmp_path_factory):
    model = build("mobilenet_v2", resolution=32, width=0.25)
    calib = _calib_dir(tmp_path_factory, model, n=8)
    feeds = sample_inputs(model, seed=5)
    reference = optcli.load(optcli.optimize(model=model).data).run(feeds)["output"]
    host = optcli.optimize(model=model, quant_type="INT8", calib_data=calib, calibrator=calibrator)
    gpu = optcli.optimize(model=model, valid_targets="opencl,arm", quant_type="INT8", calib_data=calib,
                          calibrator=calibrator, disabled_passes={"keep_small_islands_on_host"})
    a = optcli.load(host.data).run(feeds)["output"]
    b = optcli.load(gpu.data, require_gpu=True).run(feeds)["output"]
    cosine = float(a.ravel() @ reference.ravel() / (np.linalg.norm(a) * np.linalg.norm(reference)))
    assert cosine > 0.9, "int8 stays close to fp32 (a tiny 8-channel net: accuracy is tested on real widths above)"
    err, scale = max_error(b, a)
    assert err / scale <= RELATIVE["int8"], "the GPU's float view of int8 matches the host's"


def test_precision_auto_keeps_sensitive_ops_in_float(tmp_path_factory):
    model = build("mobilenet_v2", resolution=32, width=0.25)
    calib = _calib_dir(tmp_path_factory, model, n=8)
    loose = optcli.optimize(model=model, precision="auto", calib_data=calib, verify_tolerance=1.0)
    tight = optcli.optimize(model=model, precision="auto", calib_data=calib, verify_tolerance=1e-2)
    assert loose.report["int8"]["kept_float"] == []
    kept = tight.report["int8"]["kept_float"]
    assert kept and all(k["with_others"] > 1e-2 for k in kept)
    quantized = [sum(r.report["ops_after"].get(op, 0) for op in ("QConv", "FakeQuant")) for r in (tight, loose)]
    assert quantized[0] < quantized[1], quantized
    feeds = sample_inputs(model, seed=3)
    reference = optcli.load(optcli.optimize(model=model).data).run(feeds)["output"]
    err, scale = max_error(optcli.load(tight.data).run(feeds)["output"], reference)
    assert err / scale < 5e-2


def test_int8_needs_calibration_data():
    with pytest.raises(UsageError, match="--calib_data"):
        optcli.optimize(model=build("mobilenet_v2", resolution=32, width=0.25), quant_type="INT8")
