"""Dynamic dims on the GPU: plans keep symbolic dims, the runtime binds them per input shape.

Placement judges symbolic dims at nominal sizes (``optcli.targets.nominal``); at ``run`` the
runtime derives every device value's shape from the inputs (``optcli.runtime.gpu_common.bind_shapes``),
builds buffers and launches for them (no new program: sizes are kernel arguments) and caches the
binding per input shape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, TargetError
from optcli.runtime.opencl.steps import OpenClSteps
from optcli.verify import onnxruntime_session
from optcli.zoo import build
from tests.helpers import assert_close

RNG = np.random.default_rng(7)


def mini_unet() -> object:
    """["N", 3, "H", "W"] -> conv -> (skip) + upsample(strided conv): H and W must be even."""
    def conv(name, x, cin, cout, stride=1, k=3):
        w = numpy_helper.from_array((RNG.standard_normal((cout, cin, k, k)) * 0.3).astype(np.float32), f"{name}_w")
        b = numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b")
        node = helper.make_node("Conv", [x, w.name, b.name], [name], kernel_shape=[k, k], strides=[stride, stride],
                                pads=[k // 2] * 4)
        return [node], [w, b]

    nodes, inits = [], []
    for part in (conv("a", "x", 3, 8), conv("down", "a_relu", 8, 8, stride=2)):
        nodes += part[0]
        inits += part[1]
    nodes.insert(1, helper.make_node("Relu", ["a"], ["a_relu"]))
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes += [helper.make_node("Resize", ["down", "", "scales"], ["up"], mode="nearest"),
              helper.make_node("Add", ["a_relu", "up"], ["sum"])]
    head = conv("y", "sum", 8, 4, k=1)
    nodes += head[0]
    inits += head[1]
    graph = helper.make_graph(nodes, "mini_unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"dynamic_cnn": lambda: build("dynamic_cnn"), "mini_unet": mini_unet}
SHAPES = {"dynamic_cnn": [(1, 3, 32, 32), (3, 3, 20, 28), (2, 3, 17, 9), (1, 3, 32, 32)],
          "mini_unet": [(1, 3, 16, 16), (2, 3, 24, 10), (1, 3, 16, 16)]}


def _optimize(model, precision="fp32", **kw):
    return optcli.optimize(model=model, valid_targets="opencl,arm", precision=precision, **kw)


def test_dynamic_convs_are_placed_on_opencl_without_input_shapes():
    result = _optimize(build("dynamic_cnn"))
    convs = [s for s in result.plan.steps if s.op_type == "Conv"]
    assert convs and all(s.target == "opencl" for s in convs)
    assert any(not isinstance(d, int) for d in result.plan.values[convs[0].outputs[0]].shape)  # still symbolic
    assert all(s.target == "opencl" for s in result.plan.steps)


def test_metal_keeps_dynamic_nodes_on_the_host_with_the_reason():
    result = optcli.optimize(model=build("dynamic_cnn"), valid_targets="metal,arm")
    assert all(s.target == "arm" for s in result.plan.steps if s.op_type == "Conv")
    assert any("binds static shapes only" in w for w in result.warnings)


def test_cost_model_counts_symbolic_dims_at_nominal_sizes():
    """A heavy conv island with dynamic dims stays on the GPU: at nominal sizes (batch 1, 64x64)
    its work outweighs two copies; counted as 0 elements it would go back to the host."""
    w = numpy_helper.from_array(np.ones((64, 64, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    result = _optimize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [s.target for s in result.plan.steps if s.op_type == "Conv"] == ["opencl"]


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_runs_each_input_shape_on_the_gpu_and_reuses_programs(name, precision):
    model = MODELS[name]()
    p = optcli.load(_optimize(model, precision).data, require_gpu=True)
    assert p.gpu.dynamic and all(s.target == "opencl" for s in p.plan.steps if s.op_type == "Conv")
    sess = onnxruntime_session(model)
    dev, first_buffers = p.gpu.dev, None
    for k, shape in enumerate(SHAPES[name]):
        x = RNG.standard_normal(shape).astype(np.float32)
        before = (dev.builds, len(dev._programs))
        out = p.run([x])
        assert_close(next(iter(out.values())), sess.run(None, {sess.get_inputs()[0].name: x})[0], precision,
                     what=f"{name} {shape}")
        assert p.gpu.shapes[p.plan.steps[0].outputs[0]] == shape  # buffers sized for this shape
        if k == 0:
            first_buffers = p.gpu.buffers
        else:  # sizes are kernel arguments: a new shape builds no program
            assert (dev.builds, len(dev._programs)) == before, f"{shape} built programs"
    assert p.gpu.buffers is first_buffers  # back to the first shape: its binding, from the cache
    assert len(p.gpu._bindings) == len(set(SHAPES[name]))


@pytest.mark.opencl
def test_shapes_the_model_cannot_take_are_input_errors():
    p = optcli.load(_optimize(mini_unet()).data, require_gpu=True)
    with pytest.raises(InputError, match=r"input shapes 'x' \[1, 3, 15, 16\] do not fit the model.*Add"):
        p.run([np.zeros((1, 3, 15, 16), np.float32)])
    assert p.run([np.zeros((1, 3, 16, 16), np.float32)])["y"].shape == (1, 4, 16, 16)  # still usable


@pytest.mark.opencl
def test_bindings_are_bounded(monkeypatch):
    monkeypatch.setattr(OpenClSteps, "MAX_BINDINGS", 2)
    p = optcli.load(_optimize(build("dynamic_cnn")).data, require_gpu=True)
    for size in (16, 20, 24):
        p.run([np.zeros((1, 3, size, size), np.float32)])
    assert [dict(k)["input"][2] for k in p.gpu._bindings] == [20, 24]  # least recently used went


@pytest.mark.opencl
def test_a_shape_the_gpu_cannot_take_runs_on_the_host(optcli_notices):
    model = build("dynamic_cnn")
    data = _optimize(model).data
    x = np.zeros((0, 3, 16, 16), np.float32)  # an empty batch: GPU kernels take no empty tensors
    with pytest.raises(TargetError, match=r"cannot run input shapes 'input' \[0, 3, 16, 16\].*would be empty"):
        optcli.load(data, require_gpu=True).run([x])
    p = optcli.load(data)
    assert p.run([x])["output"].shape == (0, 10)
    assert p.run([np.zeros((1, 3, 16, 16), np.float32)])["output"].shape == (1, 10)  # the GPU again
    assert p.gpu is not None and p.gpu.shapes["output"] == (1, 10)


@pytest.mark.opencl
def test_recorded_shapes_are_checked_not_trusted():
    p = optcli.load(_optimize(build("dynamic_cnn")).data, require_gpu=True)
    conv = next(s for s in p.plan.steps if s.op_type == "Conv")
    value = p.plan.values[conv.outputs[0]]
    value.shape = (value.shape[0], value.shape[1] // 2, *value.shape[2:])  # a file recording fewer channels
    with pytest.raises(InputError, match=r"would have shape \[1, 16, 16, 16\], the model has \[N, 8, "):
        p.run([np.zeros((1, 3, 16, 16), np.float32)])
