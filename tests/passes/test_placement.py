"""Placement, copy insertion and kernel selection: first capable target wins, reasons recorded,
overrides apply, every host<->device crossing is an explicit step."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import ModelError

KEEP_ON_GPU = {"keep_small_islands_on_host"}


def _model(extra_node=None):
    # Relu runs on opencl, CumSum has no GPU kernel, Sigmoid runs on opencl again.
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("CumSum", ["r", "axis"], ["c"], name="cumsum"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    if extra_node is not None:
        nodes.append(extra_node)
    out = nodes[-1].output[0]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])


def test_kernel_variants_are_chosen_by_shape():
    w = numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    steps = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).report["steps"]
    assert steps[0]["kernel"] == "onnx.Conv.depthwise"


def test_gpu_first_falls_back_per_op_with_reason_and_copies():
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU)
    steps = result.report["steps"]
    placed = {s["name"]: s for s in steps}
    assert placed["relu"]["target"] == "opencl" and placed["sigmoid"]["target"] == "opencl"
    assert placed["cumsum"]["target"] == "arm" and "no opencl kernel for CumSum" in placed["cumsum"]["reason"]
    assert result.warnings == ["op #1 CumSum cannot run on opencl; it runs on arm"]
    ops = [s["op"] for s in steps]
    assert ops == ["Upload", "Pack", "Relu", "Unpack", "Download", "CumSum", "Upload", "Pack", "Sigmoid",
                   "Unpack", "Download"]
    assert result.report["transfers"]["uploads"] == 2 and result.report["transfers"]["downloads"] == 2
    assert result.report["transfers"]["bytes_per_run"] == 4 * 4 * 8 * 8 * 4


def test_placement_override():
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm", placement_overrides={"Relu": "arm"},
                             disabled_passes=KEEP_ON_GPU)
    placed = {s["name"]: s["target"] for s in result.report["steps"]}
    assert placed["relu"] == "arm" and placed["sigmoid"] == "opencl"


def test_op_no_target_can_run_is_a_clear_error():
    custom = helper.make_node("Frobnicate", ["y"], ["z"], name="frob", domain="my.ops")
    with pytest.raises(ModelError, match="node 'frob' \\(Frobnicate\\): no target can run it"):
        optcli.optimize(model=_model(custom))


def test_cost_aware_placement_moves_a_cheap_island_back_to_the_host():
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm")
    placed = {s["name"]: s for s in result.report["steps"]}
    assert placed["relu"]["target"] == "arm" and "cost-aware" in placed["relu"]["reason"]
    assert result.report["transfers"]["uploads"] == 0
    assert any("would cost more than it saves" in w for w in result.warnings)


def test_cost_aware_placement_keeps_heavy_work_on_the_gpu():
    w = numpy_helper.from_array(np.ones((64, 64, 3, 3), np.float32), "w")
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]),
             helper.make_node("Conv", ["c", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w, numpy_helper.from_array(np.array(1, np.int64), "axis")])
    result = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                             valid_targets="opencl,arm")
    assert {s["name"]: s["target"] for s in result.report["steps"]}["conv"] == "opencl"
