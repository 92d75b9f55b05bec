"""Resize / Upsample GPU kernel against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

X = np.random.default_rng(4).standard_normal((2, 5, 4, 6)).astype(np.float32)
F32 = np.float32
EMPTY = np.zeros(0, F32)


def _scales(*s):
    return {"roi": EMPTY, "scales": np.array(s, F32)}


def _sizes(*s):
    return {"roi": EMPTY, "scales": EMPTY, "sizes": np.array(s, np.int64)}


CASES = [
    ({"mode": "nearest"}, _scales(1, 1, 2, 2)),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, _scales(1, 1, 2, 3)),
    ({"mode": "nearest", "coordinate_transformation_mode": "align_corners", "nearest_mode": "round_prefer_ceil"},
     _sizes(2, 5, 7, 9)),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "ceil"},
     _scales(1, 1, 0.5, 0.5)),
    ({"mode": "nearest", "coordinate_transformation_mode": "pytorch_half_pixel"}, _sizes(2, 5, 3, 11)),
    ({"mode": "linear"}, _scales(1, 1, 2, 2)),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, _sizes(2, 5, 7, 5)),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, _scales(1, 1, 1.5, 0.5)),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, _sizes(2, 5, 1, 9)),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, _scales(1, 1, 1.7, 2.3)),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_resize(case, precision):
    attrs, consts = CASES[case]
    graph, node = one_node_graph("Resize", {"x": X}, consts, attrs, opset=19, input_names=["x", *consts])
    check_gpu(graph, node, {"x": X}, precision)


def test_resize_rank3():
    x = X[:, :, 0].copy()
    graph, node = one_node_graph("Resize", {"x": x}, _scales(1, 1, 2.5), {"mode": "linear"}, opset=19)
    check_gpu(graph, node, {"x": x})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode, precision):
    graph, node = one_node_graph("Upsample", {"x": X}, {"s": np.array([1, 1, 2, 3], F32)}, {"mode": mode}, opset=9)
    check_gpu(graph, node, {"x": X}, precision)


def test_resize10():
    graph, node = one_node_graph("Resize", {"x": X}, {"s": np.array([1, 1, 0.5, 1.5], F32)}, opset=10)
    check_gpu(graph, node, {"x": X})


def _reason(attrs, consts, opset=19):
    graph, node = one_node_graph("Resize", {"x": X}, consts, attrs, opset=opset, input_names=["x", *consts])
    return gpu_kernels_for("Resize")[0].check(node, graph)


def test_rejects():
    assert "cubic" in _reason({"mode": "cubic"}, _scales(1, 1, 2, 2))
    assert "antialias" in _reason({"mode": "linear", "antialias": 1}, _scales(1, 1, 2, 2))
    assert "channel" in _reason({"mode": "nearest"}, _scales(1, 2, 2, 2))
    assert "tf_crop_and_resize" in _reason({"coordinate_transformation_mode": "tf_crop_and_resize"},
                                           _scales(1, 1, 2, 2))
