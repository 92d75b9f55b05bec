"""The OpenCL runtime on PoCL: mixed plans, precisions, CPU fallback, require_gpu, binary cache.

Tests marked ``opencl`` need the session's usable device (they skip with its failure where there
is none); the fallback tests simulate a missing or failing device and run anywhere."""

from __future__ import annotations

import stat
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import TargetError
from optcli.runtime.opencl import device as opencl
from optcli.runtime.opencl.program_cache import ProgramCache
from optcli.verify import onnxruntime_session
from tests.helpers import assert_close

# These tests are about the GPU path itself: keep even tiny islands on the GPU.
KEEP_ON_GPU = {"keep_small_islands_on_host"}
X = np.random.default_rng(3).standard_normal((2, 5, 6, 7)).astype(np.float32)


@pytest.fixture(scope="module")
def mixed():
    """Relu (GPU) -> CumSum (host only) -> Sigmoid (GPU): two crossings each way."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("CumSum", ["r", "axis"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    expected = onnxruntime_session(model).run(None, {"x": X})
    return model, expected[0]


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_mixed_plan_on_the_gpu(mixed, precision):
    model, expected = mixed
    data = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU,
                           precision=precision).data
    p = optcli.load(data, require_gpu=True)
    assert p.gpu is not None and p.precision == precision
    assert_close(p.run({"x": X})["y"], expected, precision)


def test_no_device_warns_and_runs_on_the_cpu(mixed, monkeypatch, optcli_notices):
    model, expected = mixed
    data = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data

    def no_device(name=None):
        raise opencl.DeviceUnavailable("no OpenCL platform (test)")

    monkeypatch.setattr(opencl.ClDevice, "shared", classmethod(lambda cls, name=None: no_device()))
    monkeypatch.setattr("optcli.runtime.predictor._WARNED", set())
    p = optcli.load(data)
    assert optcli_notices() == ["optcli: running the GPU steps on the CPU: no OpenCL platform (test)"]
    optcli.load(data)
    assert len(optcli_notices()) == 1, "warned once per process"
    assert p.gpu is None
    assert_close(p.run({"x": X})["y"], expected)
    with pytest.raises(TargetError, match="require_gpu=True, but no OpenCL platform"):
        optcli.load(data, require_gpu=True)


@pytest.mark.opencl
def test_kernel_build_failure_falls_back_with_the_reason(mixed, monkeypatch, optcli_notices, opencl_device):
    model, expected = mixed
    data = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data

    def broken(self, source, defines):
        raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE (test)")

    monkeypatch.setattr(opencl.ClDevice, "program", broken)
    monkeypatch.setattr("optcli.runtime.predictor._WARNED", set())
    p = optcli.load(data)
    assert optcli_notices() == [
        f"optcli: running the GPU steps on the CPU: the OpenCL device {opencl_device.describe()} failed "
        "(RuntimeError: clBuildProgram failed: BUILD_PROGRAM_FAILURE (test))"]
    assert_close(p.run({"x": X})["y"], expected)


def test_load_with_targets_arm_runs_everything_on_the_cpu(mixed):
    model, expected = mixed
    data = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = optcli.load(data, targets="arm")
    assert p.gpu is None
    assert_close(p.run({"x": X})["y"], expected)


@pytest.mark.opencl
def test_one_queue_per_predictor(mixed):
    data = optcli.optimize(model=mixed[0], valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data
    a, b = optcli.load(data, require_gpu=True), optcli.load(data, require_gpu=True)
    assert a.gpu.queue is not b.gpu.queue and a.gpu.dev is b.gpu.dev


def test_binary_cache_warm_hit_and_damaged_entry(tmp_path, opencl_device):
    dev = opencl_device
    text = "__kernel void k(__global float* a) { a[get_global_id(0)] += 1.0f; }"
    cache = ProgramCache(tmp_path)
    assert stat.S_IMODE((tmp_path / "programs").stat().st_mode) == 0o700
    _, built = cache.build(dev.context, dev.device, text)
    assert built == 1 and cache.misses == 1
    _, built = cache.build(dev.context, dev.device, text)
    assert built == 0 and cache.hits == 1
    entry = next((tmp_path / "programs").glob("*.bin"))
    damaged = bytearray(entry.read_bytes())
    damaged[-1] ^= 0xFF
    entry.write_bytes(bytes(damaged))
    _, built = cache.build(dev.context, dev.device, text)
    assert built == 1, "a damaged cache entry must be rebuilt, not trusted"


@pytest.mark.opencl
def test_list_devices_reports_pocl():
    devices = optcli.list_devices()
    assert devices and any(d["usable"] for d in devices)
    d = devices[0]
    assert {"version", "fp16_native", "max_work_group_size", "image_support", "global_mem_mb", "recommended"} <= set(d)


@pytest.mark.opencl
def test_device_arrays_in_and_out(mixed):
    import pyopencl.array as cl_array

    model, expected = mixed
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    x_dev = cl_array.to_device(p.queue, X)
    out = p.run({"x": x_dev}, outputs_on_device=True)["y"]
    assert isinstance(out, cl_array.Array)
    assert_close(out.get(), expected)
    assert_close(p.run({"x": x_dev})["y"], expected)  # device in, host out


@pytest.mark.opencl
def test_device_array_of_another_context_is_refused(mixed):
    import pyopencl as cl
    import pyopencl.array as cl_array

    from optcli.errors import InputError

    p = optcli.load(optcli.optimize(model=mixed[0], valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    other = cl.Context([p.context.devices[0]])
    with pytest.raises(InputError, match="another context"):
        p.run({"x": cl_array.to_device(cl.CommandQueue(other), X)})


@pytest.mark.opencl
def test_tuning_picks_a_variant_and_a_tuned_load_reuses_it(tmp_path, monkeypatch):
    from optcli.runtime.opencl import tuning

    monkeypatch.setenv("OPTCLI_CACHE_DIR", str(tmp_path))
    w = np.random.default_rng(1).standard_normal((8, 8, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32)
    expected = onnxruntime_session(model).run(None, {"x": x})
    result = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU, tune="fast")
    conv = [s for s in result.report["steps"] if s["op"] == "Conv"][0]
    assert result.report["tuning"]["steps"][conv["name"]]["kernel"] == conv["kernel"]
    p = optcli.load(result.data, tune="normal", require_gpu=True)
    assert_close(p.run({"x": x})["y"], expected[0])
    calls = []
    monkeypatch.setattr(tuning, "_time", lambda *a, **k: calls.append(1) or 1.0)
    optcli.load(result.data, tune="normal", require_gpu=True)
    assert not calls, "a tuned load must reuse the tuning cache, not time again"


@pytest.mark.opencl
def test_raw_device_buffer_input(mixed):
    import pyopencl as cl

    from optcli.errors import InputError

    model, expected = mixed
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    buf = cl.Buffer(p.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=X)
    assert_close(p.run({"x": buf})["y"], expected)
    small = cl.Buffer(p.context, cl.mem_flags.READ_ONLY, 16)
    with pytest.raises(InputError, match="holds 16 bytes"):
        p.run({"x": small})


@pytest.mark.opencl
def test_out_of_device_memory_falls_back_with_the_reason(mixed, monkeypatch, optcli_notices):
    model, expected = mixed
    data = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data

    def no_memory(*args, **kwargs):
        raise opencl.cl.MemoryError("clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE (test)")

    monkeypatch.setattr(opencl.cl, "Buffer", no_memory)
    monkeypatch.setattr("optcli.runtime.predictor._WARNED", set())
    p = optcli.load(data)
    assert "MEM_OBJECT_ALLOCATION_FAILURE" in " ".join(optcli_notices())
    assert p.gpu is None
    assert_close(p.run({"x": X})["y"], expected)


@pytest.mark.opencl
def test_float32_lowest_in_a_mask_saturates_in_half_storage():
    """Attention masks write "minus a lot" as float32's lowest; in half storage that must stay a
    large finite negative, or a fully masked row's softmax is NaN where onnxruntime's is uniform."""
    nodes = [helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    shape = [1, 3, 4]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                           for n in ("scores", "mask")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lowest = np.finfo(np.float32).min
    mask = np.zeros(shape, np.float32)
    mask[0, 1, 2:] = lowest  # a row partly masked
    mask[0, 2, :] = lowest  # a row fully masked
    feeds = {"scores": np.random.default_rng(5).standard_normal(shape).astype(np.float32), "mask": mask}
    expected = onnxruntime_session(model).run(None, feeds)[0]
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU,
                                    precision="fp16").data, require_gpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast"
        got = p.run(feeds)["y"]
    assert np.isfinite(got).all()
    assert_close(got, expected, "fp16")
