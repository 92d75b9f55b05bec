"""The zoo end to end with the GPU first (OpenCL on PoCL in CI), fp32 and fp16, against
onnxruntime: what opencl claims runs there, the rest on arm, copies in between."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import optcli
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close

pytestmark = pytest.mark.opencl
KEEP_ON_GPU = {"keep_small_islands_on_host"}  # small test models would otherwise go back to the CPU
MODELS = ["mobilenet_v2", "mobilenet_v3", "resnet18", "efficientnet_lite0", "squeezenet", "shufflenet_v2", "unet"]


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_on_opencl(name, precision):
    model = build(name, resolution=32)
    feeds = sample_inputs(model)
    result = optcli.optimize(model=model, valid_targets="opencl,arm", precision=precision,
                             disabled_passes=KEEP_ON_GPU)
    steps = result.report["steps"]
    convs = [s for s in steps if s["op"] in ("Conv", "ConvTranspose")]
    assert convs and all(s["target"] == "opencl" for s in convs), [s for s in convs if s["target"] != "opencl"]
    predictor = optcli.load(result.data, require_gpu=True)
    outputs = predictor.run(feeds)
    for key, expected in _ort(model, feeds).items():
        assert_close(outputs[key], expected, precision, what=f"{name}:{key} on opencl")
