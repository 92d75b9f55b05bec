"""fold_pad_into_conv: a zero Pad on spatial axes merged into the Conv/pool pads when exact."""

import numpy as np
import pytest

from optcli.passes import fold_pad_into_conv
from tests.passes.ir_build import model, node, ops, run_pass

RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
W5 = RNG.standard_normal((4, 5, 3, 3)).astype(np.float32)
SPATIAL = np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64)


def _pad_then(reader, pads=SPATIAL, value=None, mode="constant", extra=None):
    inits = {"pads": pads, "w": W, "w5": W5}
    pad_inputs = ["x", "pads"]
    if value is not None:
        inits["value"] = np.array(value, np.float32)
        pad_inputs.append("value")
    return model(
        [node("Pad", pad_inputs, ["p"], mode=mode), reader],
        {"x": [1, 3, 7, 7]},
        outputs=["y"] + (extra or []),
        initializers=inits,
    )


def test_into_conv_adds_to_existing_pads():
    m = _pad_then(node("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 1]))
    graph, counts = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["Conv"] and counts == {"folded": 1}
    assert graph.nodes[0].attrs["pads"] == [2, 2, 2, 1] and graph.nodes[0].inputs[0] == "x"


def test_into_average_pool_counting_pads():
    m = _pad_then(node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], count_include_pad=1))
    graph, _ = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["AveragePool"]


def test_into_max_pool_only_with_minus_inf():
    m = _pad_then(node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3]), value=-np.inf)
    graph, _ = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["MaxPool"]
    m = _pad_then(node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3]))
    graph, _ = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["Pad", "MaxPool"]


@pytest.mark.parametrize(
    "case",
    [
        "channel_pad",
        "negative",
        "reflect",
        "nonzero_value",
        "avgpool_excluding_pads",
        "two_readers",
        "auto_pad",
    ],
)
def test_left_alone(case):
    conv = node("Conv", ["p", "w"], ["y"])
    kwargs = {}
    if case == "channel_pad":
        kwargs["pads"] = np.array([0, 1, 1, 1, 0, 1, 1, 1], np.int64)
        conv = node("Conv", ["p", "w5"], ["y"])
    elif case == "negative":
        kwargs["pads"] = np.array([0, 0, -1, 1, 0, 0, 1, 1], np.int64)
    elif case == "reflect":
        kwargs["mode"] = "reflect"
    elif case == "nonzero_value":
        kwargs["value"] = 1.0
    elif case == "avgpool_excluding_pads":
        conv = node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3])
    elif case == "two_readers":
        kwargs["extra"] = ["p"]
    elif case == "auto_pad":
        conv = node("Conv", ["p", "w"], ["y"], auto_pad="SAME_UPPER")
    graph, counts = run_pass(_pad_then(conv, **kwargs), fold_pad_into_conv)
    assert ops(graph)[0] == "Pad" and counts == {"folded": 0}


def _relu_pad_maxpool(pads, **pool):
    return model(
        [node("Relu", ["x"], ["r"]), node("Pad", ["r", "pads"], ["p"]), node("MaxPool", ["p"], ["y"], **pool)],
        {"x": [1, 3, 7, 7]},
        initializers={"pads": np.array(pads, np.int64)},
    )


def test_zero_pad_into_max_pool_of_non_negative_input():
    # ResNet stem: Relu -> Pad(0) -> MaxPool. Zero padding cannot win a max over values >= 0.
    m = _relu_pad_maxpool([0, 0, 1, 1, 0, 0, 1, 1], kernel_shape=[3, 3], strides=[2, 2])
    graph, counts = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["Relu", "MaxPool"] and counts == {"folded": 1}
    assert graph.nodes[1].attrs["pads"] == [1, 1, 1, 1]


def test_zero_pad_into_max_pool_needs_real_elements_in_every_window():
    # Pads as wide as the window would leave windows of padding only (max 0 there, -inf never).
    m = _relu_pad_maxpool([0, 0, 2, 2, 0, 0, 2, 2], kernel_shape=[2, 2])
    graph, _ = run_pass(m, fold_pad_into_conv)
    assert ops(graph) == ["Relu", "Pad", "MaxPool"]
