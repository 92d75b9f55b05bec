"""GPU steps whose sizes follow from data (issue 12): bound when the data exists.

A Range or Slice bound by a run-time value, or NonZero, gives a value whose size no input shape
tells.  Placement judges the GPU nodes after such a *data point* at nominal sizes
(``optcli.targets.nominal``); at ``run``, once the host steps before it have run, the runtime
derives the later device values' shapes from the data (``runtime.bind_shapes``), binds buffers
and launches for them (cached per shape), and carries the device values alive across the point
into the new buffers (``runtime.opencl.steps``)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import TargetError
from optcli.runtime.host.steps import StepError
from tests.helpers import assert_close

RNG = np.random.default_rng(11)
X = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
KEEP_ON_GPU = {"keep_small_islands_on_host"}


def _const(name: str, value) -> object:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))


def _first_columns(k: str, out: str) -> list:
    """out = x[..., :k] through Range + Gather (host steps: their sizes are data)."""
    return [helper.make_node("Range", ["zero", k, "one"], [f"{out}_idx"]),
            helper.make_node("Gather", ["x", f"{out}_idx"], [out], axis=3)]


def _model(nodes: list, inputs: list, inits: list = (), x_shape: list | None = None) -> object:
    graph = helper.make_graph([_const("zero", 0), _const("one", 1), *nodes], "data_points",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape or list(X.shape)),
                               *inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _carried_model(x_shape: list) -> object:
    """A device value made before the data point (the per-channel mean of a conv of x) is read
    after it (added to the data-sized columns of x)."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 4, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("GlobalAveragePool", ["a"], ["m"]),
             *_first_columns("k", "s"), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Add", ["r", "m"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("k", TensorProto.INT64, [])], [w], x_shape)


@pytest.fixture(scope="module")
def carried():
    model = _carried_model(list(X.shape))
    return model, optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data


def test_nodes_after_a_data_point_are_placed_on_the_gpu(carried):
    plan = optcli.load(carried[1], targets="arm").plan
    targets = {s.op_type: s.target for s in plan.steps}
    assert targets["Relu"] == targets["Add"] == targets["GlobalAveragePool"] == "opencl"
    assert targets["Range"] == targets["Gather"] == "arm"


@pytest.mark.opencl
def test_each_run_binds_the_sizes_its_data_gives(carried):
    model, data = carried
    p = optcli.load(data, require_gpu=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    p.gpu.enable_profiling()
    device_steps = {i for i, s in enumerate(p.plan.steps) if s.op_type in ("Relu", "Add")}
    builds = None
    for k in (5, 9, 5, 16, 9):
        feeds = {"x": X, "k": np.array(k, np.int64)}
        got = p.run(feeds)["y"]
        assert got.shape == (1, 4, 16, k)
        # m is made before the data point and read after it: a wrong or missing carry shows here
        assert_close(got, sess.run(None, feeds)[0], what=f"k={k}")
        ran = {i for i, _ in p.gpu.events}
        assert device_steps <= ran, f"k={k}: the data-sized steps did not run on the device"
        p.gpu.events.clear()
        if builds is None:
            builds = (p.gpu.dev.builds, len(p.gpu.dev._programs))
        assert (p.gpu.dev.builds, len(p.gpu.dev._programs)) == builds, "a new size must build no program"
    # one binding from the input shapes, one per size the data gave
    assert len(p.gpu._bindings) == 1 + len({5, 9, 16})


@pytest.mark.opencl
def test_dynamic_input_shapes_and_a_data_point():
    """Bound per input shape, then per data: the value carried across the point has a symbolic
    shape in the file and its concrete one from the input-shape binding."""
    model = _carried_model(["N", 4, "H", "W"])
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    assert p.gpu.dynamic and next(s for s in p.plan.steps if s.op_type == "Add").target == "opencl"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape, k in [((1, 4, 8, 12), 5), ((2, 4, 6, 9), 3), ((1, 4, 8, 12), 7), ((2, 4, 6, 9), 3)]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "k": np.array(k, np.int64)}
        assert_close(p.run(feeds)["y"], sess.run(None, feeds)[0], what=f"{shape} k={k}")


@pytest.mark.opencl
def test_data_the_device_cannot_take_runs_the_call_on_the_host(carried, optcli_notices, monkeypatch):
    model, data = carried
    monkeypatch.setattr("optcli.runtime.predictor._WARNED", set())
    feeds = {"x": X, "k": np.array(0, np.int64)}  # empty columns: GPU kernels take no empty value
    p = optcli.load(data)
    got = p.run(feeds)["y"]
    assert got.shape == (1, 4, 16, 0)
    assert any("would be empty" in n and "running those calls on the CPU" in n for n in optcli_notices())
    assert p.run({"x": X, "k": np.array(3, np.int64)})["y"].shape == (1, 4, 16, 3)  # the device again
    with pytest.raises(TargetError, match="sizes computed at run time cannot run on the GPU.*require_gpu"):
        optcli.load(data, require_gpu=True).run(feeds)


@pytest.mark.opencl
def test_data_that_makes_later_steps_inconsistent_is_the_inputs_fault():
    """Two data-sized values added: their sizes must agree, which only the data tells."""
    nodes = [*_first_columns("k1", "s1"), *_first_columns("k2", "s2"), helper.make_node("Relu", ["s1"], ["r1"]),
             helper.make_node("Relu", ["s2"], ["r2"]), helper.make_node("Add", ["r1", "r2"], ["y"])]
    ints = [helper.make_tensor_value_info(k, TensorProto.INT64, []) for k in ("k1", "k2")]
    model = _model(nodes, ints)
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    assert next(s for s in p.plan.steps if s.op_type == "Add").target == "opencl"
    same = {"x": X, "k1": np.array(6, np.int64), "k2": np.array(6, np.int64)}
    assert_close(p.run(same)["y"], 2 * np.maximum(X[..., :6], 0))
    with pytest.raises(StepError, match="values computed at run time do not fit"):
        p.run({**same, "k2": np.array(5, np.int64)})


@pytest.mark.opencl
def test_nonzero_then_gpu_steps():
    nodes = [helper.make_node("NonZero", ["v"], ["nz"]), helper.make_node("Cast", ["nz"], ["f"], to=1),
             helper.make_node("Relu", ["f"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v", TensorProto.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    p = optcli.load(optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data,
                    require_gpu=True)
    assert {s.target for s in p.plan.steps if s.op_type in ("Relu", "Sigmoid")} == {"opencl"}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for density in (0.2, 0.7, 0.2):
        v = (RNG.random((8, 4)) < density).astype(np.float32)
        assert_close(p.run({"v": v})["y"], sess.run(None, {"v": v})[0], what=f"density {density}")
