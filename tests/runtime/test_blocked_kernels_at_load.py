"""A file cannot make a kernel of the channel-blocked host layout compute something else (issue 23,
part 1): where its rule does not hold for the shapes derived from the inputs, the load refuses the
file, and the kernel itself refuses operands it would combine wrongly.  The crafted files start from
an honest plan whose Add and PRelu run blocked, then change one weight's shape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, NbFormatError
from optcli.ops import get_kernel
from optcli.passes import choose_host_layout
from tests.reliability.nbfuzz import parts, rebuild

C = 16


def _region(monkeypatch) -> bytes:
    """x -> conv a, conv b -> Add(a, b) -> PRelu -> conv: one blocked region."""
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((C, C, 3, 3)).astype(np.float32) * 0.1, f"w{i}")
         for i in range(3)]
    slope = numpy_helper.from_array(np.full((C, 1, 1), 0.25, np.float32), "slope")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="ca"),
             helper.make_node("Conv", ["x", "w1"], ["b"], pads=[1, 1, 1, 1], name="cb"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("PRelu", ["s", "slope"], ["p"], name="prelu"),
             helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1], name="cy")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 8, 8])], [*w, slope])
    monkeypatch.setattr(choose_host_layout, "CONVS_PER_BORDER", 0)  # this small region runs blocked
    data = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                           valid_targets="arm").data
    kernels = {s.op_type: s.kernel for s in optcli.load(data).plan.steps}
    assert get_kernel(kernels["Add"]).is_blocked and get_kernel(kernels["PRelu"]).is_blocked, kernels
    return data


def _reshaped_weight(data: bytes, name: str, shape: list[int]) -> bytes:
    body, blob = parts(data)
    [entry] = [w for w in body["weights"] if w["name"] == name]
    entry["shape"] = shape
    entry["nbytes"] = int(np.prod(shape)) * 4
    for v in body["values"]:  # the recorded shapes follow, as a crafted file would make them
        v["shape"] = None
    return rebuild(body, blob)


def test_an_honest_plan_loads_and_runs(monkeypatch):
    data = _region(monkeypatch)
    x = np.random.default_rng(1).standard_normal((1, C, 8, 8)).astype(np.float32)
    got = optcli.load(data).run({"x": x})["y"]
    want = optcli.load(data, targets="arm").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_blocked_add_of_a_channel_and_a_broadcast_operand_is_refused(monkeypatch):
    crafted = _reshaped_weight(_region(monkeypatch), "w1", [1, C, 3, 3])  # b: [1, 1, 8, 8], broadcast over C
    with pytest.raises(NbFormatError, match="channel-blocked layout where its rule does not hold"):
        optcli.load(crafted)


def test_a_blocked_prelu_with_a_slope_along_w_is_refused(monkeypatch):
    crafted = _reshaped_weight(_region(monkeypatch), "slope", [1, 1, 8])  # a slope per column
    with pytest.raises(NbFormatError, match="channel-blocked layout where its rule does not hold"):
        optcli.load(crafted)


def test_the_kernels_refuse_operands_they_would_combine_wrongly():
    from optcli.ops.blocked import prelu_blocked

    add = get_kernel("onnx.Add.nchwc")
    a, b = np.ones((1, 2, 8, 8, 8), np.float32), np.ones((1, 1, 8, 8, 8), np.float32)
    with pytest.raises(InputError, match="lane for lane"):
        add.fn([a, b], {})
    with pytest.raises(InputError, match="one slope or one per channel"):
        prelu_blocked([a, np.ones((1, 1, 8), np.float32)], {})
