"""fold_affine_into_concat: a BatchNormalization (+ activation) after a channel Concat of convs
folds into the convs (MixNet's mixed depthwise blocks), and stays where it cannot."""

import numpy as np
import pytest

from optcli.passes import (
    batchnorm_to_affine,
    fold_affine_into_concat,
    fuse_activation_patterns,
    fuse_conv_bias_activation,
)
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, model, node, ops, to_graph

RNG = np.random.default_rng(9)


def _inits(channels=(3, 5)) -> dict[str, np.ndarray]:
    c = sum(channels)
    inits = {f"w{i}": RNG.standard_normal((m, 4, k, k)).astype(np.float32) for i, (m, k) in
             enumerate(zip(channels, (1, 3, 5)))}
    inits.update({"b0": RNG.standard_normal(channels[0]).astype(np.float32),
                  "g": RNG.uniform(0.5, 1.5, c).astype(np.float32), "be": RNG.standard_normal(c).astype(np.float32),
                  "mu": RNG.standard_normal(c).astype(np.float32), "v": RNG.uniform(0.5, 1.5, c).astype(np.float32)})
    return inits


def _convs(n=2) -> list:
    convs = [node("Conv", ["x", "w0", "b0"], ["c0"])]
    convs += [node("Conv", ["x", f"w{i}"], [f"c{i}"], pads=[i, i, i, i]) for i in range(1, n)]
    return convs


def _passes(m):
    graph = to_graph(m)
    counts = {}
    for p in (fuse_activation_patterns, batchnorm_to_affine, fuse_conv_bias_activation, fold_affine_into_concat):
        counts = p.run(graph, PassContext())
    return graph, counts


@pytest.mark.parametrize("act", [None, "Relu", "swish", "HardSwish"])
@pytest.mark.parametrize("n", [2, 3])
def test_folds_into_every_conv(act, n):
    channels = (3, 5, 2)[:n]
    tail = [node("BatchNormalization", ["cat", "g", "be", "mu", "v"], ["bn" if act else "y"])]
    if act == "swish":
        tail += [node("Sigmoid", ["bn"], ["s"]), node("Mul", ["bn", "s"], ["y"])]
    elif act:
        tail.append(node(act, ["bn"], ["y"]))
    cat = node("Concat", [f"c{i}" for i in range(n)], ["cat"], axis=1)
    m = model([*_convs(n), cat, *tail], {"x": [1, 4, 7, 7]}, initializers=_inits(channels))
    graph, counts = _passes(m)
    assert ops(graph) == ["Conv"] * n + ["Concat"] and counts == {"folded": 1}
    expected = {None: None, "Relu": "relu", "swish": "swish", "HardSwish": "hard_swish"}[act]
    assert [c.attrs.get("activation") for c in graph.nodes[:n]] == [expected] * n
    assert graph.nodes[-1].outputs == ["y"]
    check_same(m, graph)


def test_left_alone_where_it_cannot_fold():
    inits = _inits()
    bn = node("BatchNormalization", ["cat", "g", "be", "mu", "v"], ["y"])
    cases = {
        "conv output read twice": ([*_convs(), node("Concat", ["c0", "c1"], ["cat"], axis=1), bn,
                                    node("Relu", ["c0"], ["r"])], ["y", "r"]),
        "not a channel concat": ([node("Conv", ["x", "w0", "b0"], ["c0"]), node("Conv", ["x", "w0"], ["c1"]),
                                  node("Concat", ["c0", "c1"], ["cat"], axis=0), bn], ["y"]),
        "an input that is not a conv": ([node("Conv", ["x", "w0", "b0"], ["c0"]), node("MaxPool", ["x"], ["c1"],
                                         kernel_shape=[1, 1]), node("Concat", ["c0", "c1"], ["cat"], axis=1), bn],
                                        ["y"]),
        "concat read twice": ([*_convs(), node("Concat", ["c0", "c1"], ["cat"], axis=1), bn], ["y", "cat"]),
    }
    for what, (nodes, outputs) in cases.items():
        if what == "not a channel concat":
            inits_case = {**inits, "g": inits["g"][:3], "be": inits["be"][:3], "mu": inits["mu"][:3],
                          "v": inits["v"][:3], "w0": inits["w0"]}
        elif what == "an input that is not a conv":
            inits_case = {**inits, "w0": inits["w0"][:, :, :1, :1][:3], "b0": inits["b0"],
                          **{k: np.concatenate([inits[k][:3], inits[k][:4]]) for k in ("g", "be", "mu", "v")}}
        else:
            inits_case = inits
        m = model(nodes, {"x": [1, 4, 7, 7]}, outputs, inits_case)
        graph, counts = _passes(m)
        assert counts == {"folded": 0} and "ChannelAffine" in ops(graph), what
        check_same(m, graph)
