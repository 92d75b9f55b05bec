"""Placement, copy insertion and kernel selection: first capable target wins, reasons recorded,
overrides apply, every host<->device crossing is an explicit step."""

from __future__ import annotations

import re

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
    assert result.warnings == ["CumSum node 'cumsum' cannot run on opencl: no kernel (no opencl kernel for CumSum); "
                               "it runs on arm"]
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


@pytest.mark.parametrize("a_shape, b_shape, macs", [
    ([2, 3, 5, 7], [2, 3, 7, 6], 2 * 3 * 5 * 6 * 7),  # attention-like: K is B's axis -2, not its batch
    ([1, 3, "T", 8], [1, 3, 8, "T"], 3 * 64 * 64 * 8),  # symbolic dims count at nominal sizes (64)
    ([5, 7], [7, 6], 5 * 6 * 7),
])
def test_island_cost_counts_a_matmul_by_its_contraction_axis(a_shape, b_shape, macs):
    from optcli.frontend.onnx_reader import read_model
    from optcli.passes.keep_small_islands_on_host import node_work

    graph = read_model(model=_one_node("MatMul", {"a": (F, a_shape), "b": (F, b_shape)}))
    assert node_work(graph, graph.nodes[0])[0] == macs


def _one_node(op_type, inputs, attrs=None, initializers=None, opset=17):
    """A one-node model: ``inputs`` maps graph input names to (elem type, shape)."""
    node = helper.make_node(op_type, [*inputs, *(initializers or {})], ["y"], name="n0", **(attrs or {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


F, I64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.mark.parametrize("model, kind", [
    (_one_node("Relu", {"x": (F, [1, 2, 3, 4, 5])}), "rank"),
    (_one_node("Relu", {"x": (TensorProto.FLOAT16, [1, 4])}), "dtype"),
    (_one_node("CumSum", {"x": (F, [1, 4])}, initializers={"axis": np.array(1, np.int64)}), "no kernel"),
    (_one_node("Conv", {"x": (F, [1, 2, 4, 4]), "w": (F, [2, 2, 1, 1])}), "non-constant parameter"),
    (_one_node("Reshape", {"x": (F, [1, 4]), "shape": (I64, [2])}), "value computed at run time"),
    (_one_node("MaxPool", {"x": (F, [1, 2, 4, 4])}, {"kernel_shape": [2, 2], "storage_order": 1}),
     "unsupported case"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_gpu_refusal_carries_its_kind_in_warning_and_report(model, kind):
    from optcli.passes.place_nodes import placement_report

    result = optcli.optimize(model=model, valid_targets="opencl,arm")
    assert [s["target"] for s in result.report["steps"]] == ["arm"]
    [warning] = [w for w in result.warnings if "cannot run on opencl" in w]
    assert f"cannot run on opencl: {kind} (" in warning and "'n0'" in warning
    [group] = placement_report(result.report)["placement_reasons"]
    assert (group["target"], group["reason"], group["count"], group["example"], group["runs_on"]) == \
        ("opencl", kind, 1, "n0", ["arm"])


def test_refusals_are_warned_once_per_target_op_and_reason_with_count_and_example():
    from optcli.passes.place_nodes import placement_report
    from optcli.zoo import build

    result = optcli.optimize(model=build("dynamic_cnn"), valid_targets="metal,arm")  # metal binds static shapes only
    conv = [w for w in result.warnings if "Conv nodes cannot run on metal" in w]
    assert conv == ["3 Conv nodes cannot run on metal: dynamic shape (e.g. 'conv_0': 'input' has a dynamic shape "
                    "(the metal runtime binds static shapes only; pin it with --input_shapes)); they run on arm"]
    placed = placement_report(result.report)
    reasons = {(g["op"], g["reason"]): g["count"] for g in placed["placement_reasons"]}
    assert reasons[("Conv", "dynamic shape")] == 3 and len(reasons) == len(placed["placement_reasons"])
    # the report's groups are the warnings' groups: one warning line per group, none lost
    assert len([w for w in result.warnings if "cannot run on metal" in w]) == len(reasons)
    assert placed["steps_per_target"] == {"metal": 0, "arm": len(result.report["steps"])}


def test_steps_per_target_counts_every_step_copies_included():
    from optcli.passes.place_nodes import placement_report

    result = optcli.optimize(model=_model(), valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU)
    per_target = placement_report(result.report)["steps_per_target"]
    assert list(per_target) == ["opencl", "arm"]  # plan target order
    assert per_target == {"opencl": 10, "arm": 1}  # Relu, Sigmoid and their 8 copy/layout steps; CumSum


def test_cost_model_records_the_estimates_that_moved_the_model_to_the_host():
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm")
    [record] = [p["changed"] for p in result.report["passes"] if p["name"] == "keep_small_islands_on_host"]
    assert record["gpu_nodes"] == record["nodes_moved"] == 2
    assert 0 < record["saving_ns"] < record["copy_ns"]
    assert all(re.search(r"estimated [\d.]+ us against [\d.]+ us per run", w)
               for w in result.warnings if "would cost more" in w)


@pytest.mark.parametrize("spec, order", [
    ("arm,opencl", ["opencl", "arm"]),
    ("opencl,arm", ["opencl", "arm"]),
    ("opencl", ["opencl", "arm"]),
    ("metal,opencl", ["metal", "opencl", "arm"]),
    ("host opencl metal", ["opencl", "metal", "arm"]),
    ("cpu,x86", ["arm"]),
])
def test_host_is_the_last_resort_and_gpu_order_is_preference(spec, order):
    from optcli.targets import parse_targets

    assert [t.name for t in parse_targets(spec)] == order


def test_arm_listed_first_still_places_conv_on_opencl():
    w = numpy_helper.from_array(np.ones((64, 64, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = optcli.optimize(model=model, valid_targets="arm,opencl")
    assert {s["name"]: s["target"] for s in result.report["steps"]}["conv"] == "opencl"
    assert result.plan.targets == result.report["targets"] == ["opencl", "arm"]
    result = optcli.optimize(model=model, valid_targets="metal,opencl,arm")
    assert {s["name"]: s["target"] for s in result.report["steps"]}["conv"] == "metal"
