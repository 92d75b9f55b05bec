"""A conv's kernel_shape must be its weight's spatial dims (issue 23, part 3): a crafted 1x1
kernel_shape on a 3x3, 5x5 or 7x7 weight loaded, and the stem, depthwise, GEMM and blocked kernels
ran on the mismatched geometry (a wrong answer, C's EINVAL reported as our bug, or an assert that
``python -O`` removes).  The shape rule the load derives every step with now refuses it; each case
first shows which native path its honest file runs (tests/reliability/test_hostile_round_three.py
runs this file under ``python -O`` and through ``optcli run``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli import native
from optcli.errors import NbFormatError
from tests.reliability.nbfuzz import parts, rebuild

REFUSED = r"kernel_shape \[1, 1\] does not match the weight's spatial dims"


def conv_file(k: int, group: int, channels: int) -> bytes:
    w = np.ones((8, channels // group, k, k), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[k // 2] * 4, name="c")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    return optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).data


def with_1x1_kernel_shape(data: bytes) -> bytes:
    """Every conv step of ``data`` told its window is 1x1 without padding, its weight left as it is:
    the output shapes the file records still hold (a 1x1 window keeps the size a padded KxK one kept)."""
    body, blob = parts(data)
    convs = [s for s in body["steps"] if s["op"] == "Conv"]
    assert convs
    for step in convs:
        step["attrs"]["kernel_shape"] = [1, 1]
        step["attrs"]["pads"] = [0, 0, 0, 0]
    return rebuild(body, blob)


CASES = {"stem-3x3": (3, 1, 8, "stem_conv2d"), "depthwise-5x5": (5, 8, 8, "depthwise_conv2d"),
         "stem-7x7": (7, 1, 3, "stem_conv2d"), "implicit-gemm-5x5": (5, 1, 32, "conv2d_gemm")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_kernel_shape_other_than_the_weight_is_refused_at_load(case, monkeypatch):
    k, group, channels, path = CASES[case]
    data = conv_file(k, group, channels)
    if native.available():  # the honest file runs the native path the case is about
        calls = []
        real = getattr(native, path)
        monkeypatch.setattr(native, path, lambda *a, **kw: calls.append(path) or real(*a, **kw))
        optcli.load(data, targets="arm").run({"x": np.ones((1, channels, 16, 16), np.float32)})
        assert calls == [path]
    with pytest.raises(NbFormatError, match=REFUSED):
        optcli.load(with_1x1_kernel_shape(data))


def test_a_kernel_shape_other_than_the_weight_is_refused_in_the_blocked_layout(monkeypatch):
    from tests.runtime.test_blocked_kernels_at_load import _region

    data = _region(monkeypatch)  # 3x3 convs of the channel-blocked layout
    assert {s.kernel for s in optcli.load(data).plan.steps if s.op_type == "Conv"} == \
        {"onnx.Conv.nchwc_from_nchw", "onnx.Conv.nchwc"}
    with pytest.raises(NbFormatError, match=REFUSED):
        optcli.load(with_1x1_kernel_shape(data))
