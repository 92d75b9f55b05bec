"""Sizes and values that come from the inputs are the input's fault (issue 23, part 6): an Expand,
Tile, ConstantOfShape or Reshape sized by int64 inputs to [2^40, 2^40] or to negative dims ends in
an ``OptError`` (exit 2), not numpy's ValueError reported as "a bug in optcli"; a feed of a dtype
optcli does not run, for an input of unknown dtype, is an ``InputError``; what onnx's reference
implementation refuses in a file's fallback node is a ``StepError``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, KernelError, OptError
from optcli.ir import Value


def _sized_by_input(op: str, *, data=None, attrs=None) -> bytes:
    """``op`` whose size input is a graph input ``s`` (int64, 1-D)."""
    inputs = [helper.make_tensor_value_info("s", TensorProto.INT64, [2])]
    names, inits = ["s"], []
    if data is not None:
        inits.append(numpy_helper.from_array(data, "d"))
        names = ["d", "s"]
    graph = helper.make_graph([helper.make_node(op, names, ["y"], **(attrs or {}))], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets="arm", disabled_passes={"fold_constants"}).data


ONES = np.ones((1, 1), np.float32)
CASES = {
    "Expand": dict(data=ONES), "Tile": dict(data=ONES), "ConstantOfShape": {}, "Reshape": dict(data=ONES),
}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("size", [[2**40, 2**40], [-3, 2], [2**62, 4]], ids=["huge", "negative", "overflow"])
def test_a_size_from_the_input_is_the_inputs_fault(op, size):
    p = optcli.load(_sized_by_input(op, **CASES[op]))
    with pytest.raises(OptError) as exc:
        p.run({"s": np.array(size, np.int64)})
    assert not isinstance(exc.value, KernelError) and exc.value.exit_code == 2
    assert "bug in optcli" not in str(exc.value) and "\n" not in str(exc.value)


def test_a_feed_of_an_unsupported_dtype_for_an_unknown_input(small_cnn):
    p = optcli.load(small_cnn[1].data)
    spec = p.plan.inputs[0]
    p.plan.inputs[0] = Value(spec.name, "unknown", spec.shape)  # as a file may declare it
    feed = np.zeros([d if isinstance(d, int) else 1 for d in spec.shape], "datetime64[s]")
    with pytest.raises(InputError, match="datetime64.*which optcli does not run"):
        p.run({spec.name: feed})


def einsum_file(equation: str) -> bytes:
    """A file whose fallback Einsum node (and step) holds ``equation``, as raw UTF-8 bytes (surrogates
    stand for invalid bytes)."""
    import onnx

    from tests.reliability.nbfuzz import parts, rebuild

    graph = helper.make_graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik", name="e")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    data = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).data
    body, blob = parts(data)
    [step] = [s for s in body["steps"] if s["op"] == "Einsum"]
    assert step["proto"], "Einsum runs through the reference fallback"
    node = onnx.NodeProto()
    node.ParseFromString(step["proto"])
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("equation", equation.encode("utf-8", "surrogateescape")))
    step["proto"] = node.SerializeToString()
    step["attrs"]["equation"] = equation.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return rebuild(body, blob)


EQUATIONS = {"non-ascii": "ij,jk->\u00efk", "invalid": "ij,jk->ik,,", "bad-utf8": "\udcff"}


@pytest.mark.parametrize("equation", sorted(EQUATIONS))
def test_what_the_reference_refuses_in_a_files_fallback_node_is_a_step_error(equation):
    try:
        p = optcli.load(einsum_file(EQUATIONS[equation]))
    except OptError as exc:  # refused at load: as good
        assert exc.exit_code == 2
        return
    with pytest.raises(OptError) as exc:
        p.run({"a": np.ones((2, 3), np.float32), "b": np.ones((3, 2), np.float32)})
    assert not isinstance(exc.value, KernelError) and exc.value.exit_code == 2 and "\n" not in str(exc.value)
