"""batchnorm_to_affine: a stand-alone BN becomes ChannelAffine(x, scale, shift)."""

import numpy as np

from optcli.passes import batchnorm_to_affine
from tests.passes.ir_build import model, node, ops, run_pass

RNG = np.random.default_rng(2)
PARAMS = {
    "gamma": RNG.uniform(0.5, 1.5, 3).astype(np.float32),
    "beta": RNG.standard_normal(3).astype(np.float32),
    "mean": RNG.standard_normal(3).astype(np.float32),
    "var": RNG.uniform(0.5, 2.0, 3).astype(np.float32),
}


def test_converts_bn():
    m = model(
        [node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-2)],
        {"x": [2, 3, 4, 5]},
        initializers=PARAMS,
    )
    graph, counts = run_pass(m, batchnorm_to_affine)
    assert ops(graph) == ["ChannelAffine"] and counts == {"converted": 1}
    affine = graph.nodes[0]
    scale = PARAMS["gamma"] / np.sqrt(PARAMS["var"] + 1e-2)
    np.testing.assert_allclose(graph.initializers[affine.inputs[1]], scale, rtol=1e-6)
    np.testing.assert_allclose(
        graph.initializers[affine.inputs[2]], PARAMS["beta"] - PARAMS["mean"] * scale, rtol=1e-5, atol=1e-6
    )


def test_converts_2d_bn():
    m = model(
        [node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"])],
        {"x": [4, 3]},
        initializers=PARAMS,
    )
    graph, _ = run_pass(m, batchnorm_to_affine)
    assert ops(graph) == ["ChannelAffine"]


def test_runtime_params_stay():
    inits = {k: v for k, v in PARAMS.items() if k != "var"}
    m = model(
        [node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"])],
        {"x": [2, 3, 4, 5], "var": [3]},
        initializers=inits,
    )
    feeds = {"x": RNG.standard_normal((2, 3, 4, 5)).astype(np.float32), "var": PARAMS["var"]}
    graph, counts = run_pass(m, batchnorm_to_affine, feeds=feeds)
    assert ops(graph) == ["BatchNormalization"] and counts["converted"] == 0
