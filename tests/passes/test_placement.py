"""Placement and kernel selection: first capable target wins, reasons recorded, overrides apply."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import ModelError
from optcli.targets.gpu import GPU_KERNELS


def _model(extra_node=None):
    w = numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Erf", ["c"], ["y"], name="erf")]
    if extra_node is not None:
        nodes.append(extra_node)
    out = nodes[-1].output[0]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])


def test_kernel_variants_are_chosen_by_shape():
    steps = optcli.optimize(model=_model()).report["steps"]
    assert steps[0]["kernel"] == "onnx.Conv.depthwise"
    assert steps[1]["kernel"] == "onnx.Erf.default"


def test_gpu_first_falls_back_per_op_with_reason(monkeypatch):
    # Pretend the GPU library has a Conv kernel: Conv goes to opencl, Erf falls back to arm.
    monkeypatch.setitem(GPU_KERNELS, "opencl", {("", "Conv"): "opencl.conv.generic"})
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm")
    placed = {s["name"]: s for s in result.report["steps"]}
    assert placed["conv"]["target"] == "opencl"
    assert placed["erf"]["target"] == "arm" and "no opencl kernel for Erf" in placed["erf"]["reason"]
    assert result.warnings == ["op #1 Erf cannot run on opencl; it runs on arm"]


def test_placement_override(monkeypatch):
    monkeypatch.setitem(GPU_KERNELS, "opencl", {("", "Conv"): "opencl.conv.generic"})
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm", placement_overrides={"Conv": "arm"})
    assert all(s["target"] == "arm" for s in result.report["steps"])


def test_op_no_target_can_run_is_a_clear_error():
    custom = helper.make_node("Frobnicate", ["y"], ["z"], name="frob", domain="my.ops")
    with pytest.raises(ModelError, match="node 'frob' \\(Frobnicate\\): no target can run it"):
        optcli.optimize(model=_model(custom))
