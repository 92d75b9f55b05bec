"""Device faults during a run: never a wrong or partial answer.

A device lost (or out of resources) mid-run makes the predictor drop its GPU for good, warn, and
run the call again on the CPU; where the CPU cannot stand in (``require_gpu=True``, outputs asked
on the device) the call raises ``DeviceError``.  Faults at load (no device, kernel build failure,
out of device memory) are covered in ``tests/runtime/test_opencl_runtime.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import optcli
from optcli.errors import DeviceError, InputError, OptError
from optcli.runtime.opencl import device as opencl
from optcli.runtime.opencl import steps as opencl_steps
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close

KEEP_ON_GPU = {"keep_small_islands_on_host"}
pytestmark = pytest.mark.opencl  # faults of a device that works: they need one


@pytest.fixture(scope="module")
def model():
    m = build("dynamic_cnn")
    data = optcli.optimize(model=m, valid_targets="opencl,arm", input_shapes="input:1,3,16,16",
                           disabled_passes=KEEP_ON_GPU).data
    feeds = sample_inputs(m, spatial=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = optcli.load(data, targets="arm").run(feeds)
    return data, feeds, expected


def _fail_on_call(monkeypatch, owner, name, error, when):
    """Make ``owner.name`` raise ``error`` on the calls where ``when(call_index, args, kwargs)``."""
    real = getattr(owner, name)
    calls = []

    def faulty(*args, **kwargs):
        calls.append(1)
        if when(len(calls), args, kwargs):
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    return calls


def _gpu_predictor(data, **kwargs):
    p = optcli.load(data, **kwargs)
    assert p.gpu is not None
    return p


def test_device_lost_in_the_download_falls_back_to_the_cpu(model, monkeypatch, optcli_notices):
    data, feeds, expected = model
    p = _gpu_predictor(data)
    device = p.gpu.dev.describe()
    lost = opencl.cl.RuntimeError("clEnqueueReadBuffer failed: DEVICE_NOT_AVAILABLE (test)")
    # the read of the output into host memory (the Download's copy: its destination is a numpy array)
    calls = _fail_on_call(monkeypatch, opencl_steps.cl, "enqueue_copy", lost,
                          lambda n, a, k: isinstance(a[1], np.ndarray))
    out = p.run(feeds)
    assert optcli_notices() == [f"optcli: <bytes>: the OpenCL device {device} failed during run (RuntimeError: "
                                "clEnqueueReadBuffer failed: DEVICE_NOT_AVAILABLE (test)); this predictor now runs "
                                "on the CPU"]
    assert_close(out["output"], expected["output"])
    assert p.gpu is None
    before = len(calls)
    for _ in range(3):
        assert_close(p.run(feeds)["output"], expected["output"])
    assert len(optcli_notices()) == 1, "warned once: later calls are quiet"
    assert len(calls) == before, "a predictor whose GPU was lost must not touch the device again"


def test_out_of_resources_in_a_kernel_launch_falls_back(model, monkeypatch, optcli_notices):
    data, feeds, expected = model
    p = _gpu_predictor(data)
    oom = opencl.cl.MemoryError("clEnqueueNDRangeKernel failed: OUT_OF_RESOURCES (test)")
    _fail_on_call(monkeypatch, opencl.BoundLaunch, "enqueue", oom, lambda n, a, k: n == 3)
    out = p.run(feeds)
    assert "OUT_OF_RESOURCES" in " ".join(optcli_notices())
    assert_close(out["output"], expected["output"])


def test_device_lost_with_require_gpu_is_a_clear_error(model, monkeypatch):
    data, feeds, _ = model
    p = _gpu_predictor(data, require_gpu=True)
    lost = opencl.cl.LogicError("clEnqueueNDRangeKernel failed: INVALID_COMMAND_QUEUE (test)")
    _fail_on_call(monkeypatch, opencl.BoundLaunch, "enqueue", lost, lambda n, a, k: True)
    with pytest.raises(DeviceError, match="device .* failed during run.*INVALID_COMMAND_QUEUE.*require_gpu") as exc:
        p.run(feeds)
    assert isinstance(exc.value, OptError) and "\n" not in str(exc.value)


def test_device_lost_with_outputs_on_device_is_a_clear_error(model, monkeypatch):
    data, feeds, expected = model
    p = _gpu_predictor(data)
    lost = opencl.cl.RuntimeError("DEVICE_NOT_AVAILABLE (test)")
    _fail_on_call(monkeypatch, opencl_steps.cl, "enqueue_copy", lost, lambda n, a, k: n == 2)
    with pytest.raises(DeviceError, match="live on the device"):
        p.run(feeds, outputs_on_device=True)
    monkeypatch.undo()
    assert p.gpu is None  # the next call runs on the CPU, correctly
    assert_close(p.run(feeds)["output"], expected["output"])


def test_errors_that_are_not_device_faults_keep_the_gpu(model):
    data, feeds, expected = model
    p = _gpu_predictor(data)
    with pytest.raises(InputError):
        p.run({"input": np.zeros((1, 3, 8, 8), np.float32)})
    assert p.gpu is not None
    assert_close(p.run(feeds)["output"], expected["output"])
