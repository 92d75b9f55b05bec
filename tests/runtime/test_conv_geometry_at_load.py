"""A conv's kernel_shape must be its weight's spatial dims (issue 23, part 3): a crafted 1x1
kernel_shape on a 3x3, 5x5 or 7x7 weight loaded, and the stem, depthwise, GEMM and blocked kernels
ran on the mismatched geometry (a wrong answer, C's EINVAL reported as our bug, or an assert that
``python -O`` removes).  The shape rule the load derives every step with now refuses it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError
from tests.reliability.nbfuzz import parts, rebuild


@pytest.mark.parametrize("k, group, channels", [(3, 1, 8), (5, 8, 8), (7, 1, 3)], ids=["dense", "depthwise", "stem"])
def test_a_kernel_shape_other_than_the_weight_is_refused_at_load(k, group, channels):
    w = np.ones((8, channels // group, k, k), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[k // 2] * 4, name="c")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    data = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).data
    optcli.load(data)  # the honest file loads
    body, blob = parts(data)
    convs = [s for s in body["steps"] if s["op"] == "Conv"]
    assert convs
    for step in convs:
        step["attrs"]["kernel_shape"] = [1, 1]
    with pytest.raises(NbFormatError, match=r"kernel_shape \[1, 1\] does not match the weight's spatial dims"):
        optcli.load(rebuild(body, blob))
