"""pipeline: the pass order, disabling passes, and the whole pipeline on a small network."""

import numpy as np
import pytest

from optcli.errors import UsageError
from optcli.passes import pipeline
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, const, model, node, ops, to_graph

RNG = np.random.default_rng(6)
# The graph-rewriting part of the pipeline: placement, kernel selection and memory planning are
# tested with the targets.
REWRITES = [p for p in pipeline.PASSES if p.NAME not in getattr(pipeline, "REQUIRED", ())]


def _net():
    f = np.float32
    inits = {
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "w1": RNG.standard_normal((8, 3, 3, 3)).astype(f),
        "g": RNG.uniform(0.5, 1.5, 8).astype(f),
        "be": RNG.standard_normal(8).astype(f),
        "mu": RNG.standard_normal(8).astype(f),
        "v": RNG.uniform(0.5, 1.5, 8).astype(f),
        "three": np.array(3, f),
        "zero": np.array(0, f),
        "six": np.array(6, f),
        "w2": RNG.standard_normal((8, 1, 3, 3)).astype(f),
        "b2": RNG.standard_normal((8, 1, 1)).astype(f),
        "wf": RNG.standard_normal((8, 10)).astype(f),
        "bf": RNG.standard_normal(10).astype(f),
    }
    nodes = [
        node("Pad", ["x", "pads"], ["p"]),
        node("Conv", ["p", "w1"], ["c1"]),
        node("BatchNormalization", ["c1", "g", "be", "mu", "v"], ["n1"]),
        node("Add", ["n1", "three"], ["a"]),
        node("Clip", ["a", "zero", "six"], ["cl"]),
        node("Mul", ["n1", "cl"], ["m"]),
        node("Div", ["m", "six"], ["h"]),
        node("Identity", ["h"], ["hi"]),
        node("Conv", ["hi", "w2"], ["c2"], group=8, pads=[1, 1, 1, 1]),
        node("Add", ["c2", "b2"], ["c2b"]),
        node("Sigmoid", ["c2b"], ["s"]),
        node("Mul", ["c2b", "s"], ["sw"]),
        node("GlobalAveragePool", ["sw"], ["gp"]),
        const("flat_shape", [1, 8], np.int64),
        node("Reshape", ["gp", "flat_shape"], ["fl"]),
        node("MatMul", ["fl", "wf"], ["mm"]),
        node("Add", ["mm", "bf"], ["fa"]),
        node("Relu", ["fa"], ["y"]),
    ]
    return model(nodes, {"x": [1, 3, 8, 8]}, initializers=inits)


def test_full_pipeline_fuses_and_preserves_outputs():
    m = _net()
    graph = to_graph(m)
    seen = []
    records = pipeline.optimize(graph, PassContext(), progress=seen.append, passes=REWRITES)
    assert seen == records
    assert [r["name"] for r in records] == [p.NAME for p in REWRITES]
    assert ops(graph) == ["Conv", "Conv", "GlobalAveragePool", "Reshape", "FullyConnected"]
    assert [n.attrs.get("activation") for n in graph.nodes] == ["hard_swish", "swish", None, None, "relu"]
    assert records[0]["nodes_before"] == 18 and records[-1]["nodes_after"] == 5
    check_same(m, graph)


def test_disabled_passes_are_skipped():
    m = _net()
    graph = to_graph(m)
    disabled = {"fuse_conv_bn", "fuse_conv_bias_activation"}
    records = pipeline.optimize(graph, PassContext(), disabled=disabled, passes=REWRITES)
    assert {r["name"] for r in records}.isdisjoint({"fuse_conv_bn", "fuse_conv_bias_activation"})
    assert "ChannelAffine" in ops(graph) and "Relu" in ops(graph)
    check_same(m, graph)


def test_unknown_pass_name_is_a_usage_error():
    with pytest.raises(UsageError, match="fuse_conv_bn"):
        pipeline.optimize(to_graph(_net()), PassContext(), disabled={"fuse_everything"})


def test_describe_passes():
    described = pipeline.describe_passes()
    names = [n for n, _ in described]
    assert names[:14] == ["qoperator_to_qdq", "fold_constants_before_qdq", "fuse_qdq_conv", "fuse_qdq_matmul",
                          "fuse_qdq_add", "fuse_qdq_movement", "fuse_qdq_lookup", "fuse_qdq_se", "fold_qdq",
                          "fold_constants", "inline_constant_if", "constants_into_bodies", "compile_bodies",
                          "eliminate_identity"]
    assert names[-5:] == ["insert_copies", "select_kernels", "choose_host_layout", "compress_weights", "plan_memory"]
    assert len(names) == len(set(names)) and all(d for _, d in described)
