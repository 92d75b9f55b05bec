"""Performance advice: each rule fires on a model built to trigger it, names the nodes, and is
quiet on a model without the problem."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.advice import advise, format_advice


def _conv(name, x, out_ch, in_ch, k=3, y=None):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((out_ch, in_ch, k, k)).astype(np.float32)
                                * 0.1, f"{name}_w")
    return helper.make_node("Conv", [x, w.name], [y or name], pads=[k // 2] * 4, name=name), w


def _model():
    """Every problem at once: 3-channel input, 6 channels, a 5x5 kernel, a Transpose -> DepthToSpace chain, a Concat
    between GPU convs, a Cos (no GPU kernel) between GPU ops, Mish on the generic fallback."""
    parts = [_conv("c0", "image", 8, 3), _conv("c6", "c0", 6, 8), _conv("c5x5", "c6", 8, 6, k=5),
             _conv("a", "c5x5", 8, 8), _conv("b", "c5x5", 8, 8)]
    nodes, weights = [p[0] for p in parts], [p[1] for p in parts]
    nodes += [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="concat"),
              helper.make_node("Transpose", ["cat"], ["t1"], perm=[0, 1, 3, 2], name="transpose_1"),
              helper.make_node("DepthToSpace", ["t1"], ["t2"], blocksize=2, name="depth_to_space")]
    conv, w = _conv("after_t", "t2", 16, 4)
    nodes += [conv, helper.make_node("Cos", ["after_t"], ["cos"], name="cos_on_cpu")]
    conv, w2 = _conv("after_cos", "cos", 8, 16)
    nodes += [conv, helper.make_node("Mish", ["after_cos"], ["out"], name="mish")]
    weights += [w, w2]
    graph = helper.make_graph(nodes, "advice", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                              [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture(scope="module")
def report():
    result = optcli.optimize(model=_model(), valid_targets="opencl,arm",
                             disabled_passes={"keep_small_islands_on_host"})
    return result.report


def _rule(report, rule):
    return next(i for i in report["advice"] if i["rule"] == rule)


def test_every_rule_fires_and_names_its_nodes(report):
    rules = {i["rule"] for i in report["advice"]}
    assert rules == {"rgb_input", "channels_not_multiple_of_4", "kernels_larger_than_3x3", "shape_ops_on_gpu",
                     "memory_bound_between_gpu_ops", "ops_on_cpu", "generic_fallback"}
    assert _rule(report, "rgb_input")["nodes"] == ["upload_image", "pack_image"]
    padded = _rule(report, "channels_not_multiple_of_4")["nodes"]
    assert "c6 (Conv, 6 channels: 25% padded)" in padded
    assert _rule(report, "kernels_larger_than_3x3")["nodes"] == ["c5x5 (5x5)"]
    assert _rule(report, "shape_ops_on_gpu")["nodes"] == ["transpose_1 -> depth_to_space"]
    assert _rule(report, "memory_bound_between_gpu_ops")["nodes"] == ["concat (Concat)"]
    cpu = _rule(report, "ops_on_cpu")
    assert "cos_on_cpu (Cos)" in cpu["nodes"] and "3 host<->device copies" in cpu["title"]
    assert any("no opencl kernel for Cos" in r for r in cpu["reasons"])
    assert _rule(report, "generic_fallback")["nodes"] == ["mish (Mish)"]


def test_items_are_sorted_by_estimated_cost_with_shares(report):
    costs = [i["est_us"] for i in report["advice"]]
    assert costs == sorted(costs, reverse=True)
    assert all(0 <= i["share"] <= 1 for i in report["advice"])


def test_text_fits_80_columns(report):
    text = format_advice(report["advice"])
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "c5x5 (5x5)" in text


def test_quiet_on_a_cpu_plan_and_on_a_clean_gpu_model():
    from optcli.zoo import build

    assert optcli.optimize(model=build("resnet18", resolution=32), valid_targets="arm").report["advice"] == []
    x = build("resnet18", resolution=32, width=0.5)
    plan = optcli.optimize(model=x, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"}).plan
    rules = {i["rule"] for i in advise(plan)}
    assert "ops_on_cpu" not in rules and "channels_not_multiple_of_4" not in rules


def test_all_on_cpu_despite_gpu_target_is_explained():
    from optcli.zoo import build

    items = optcli.optimize(model=build("shufflenet_v2", resolution=32), valid_targets="opencl,arm").report["advice"]
    cpu = next(i for i in items if i["rule"] == "ops_on_cpu")
    assert cpu["title"].startswith("every op runs on the CPU") and "cost-aware" in next(iter(cpu["reasons"]))
