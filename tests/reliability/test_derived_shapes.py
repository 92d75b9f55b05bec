"""The runtime derives every shape itself; recorded shapes are only compared (issue 12).

Crafted files (valid checksums recomputed, as an attacker who read docs/nb-format.md would) that
once made a GPU kernel write outside its buffer: an oversized recorded shape on a Concat input,
hidden from the old load-time check by (1) a symbolic dim on another input, (2) a second writer of
the value after its reader, (3) an int64 input driving a host Range that failed on the check's
zeros.  Each must end in ``NbFormatError`` at load, or a correct result / ``OptError`` at run.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper

import optcli
from optcli.errors import InputError, NbFormatError
from tests.reliability.nbfuzz import parts, rebuild

KEEP_ON_GPU = {"keep_small_islands_on_host"}
X = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)


def _expected(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.maximum(x, 0), 1 / (1 + np.exp(-x))], axis=1)


def _model(inputs=(), nodes=(), outputs=()):
    """x [1, 4, 8, 8] -> Relu, Sigmoid -> Concat (all on the GPU), plus what a case adds."""
    body = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Concat", ["r", "s"], ["y"], axis=1), *nodes]
    graph = helper.make_graph(body, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]), *inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), *outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data


def _recorded(data: bytes, name: str, shape: list) -> bytes:
    body, blob = parts(data)
    for v in body["values"]:
        if v["name"] == name:
            v["shape"] = shape
    return rebuild(body, blob)


@pytest.fixture(scope="module")
def symbolic():
    """(1) A second input with a symbolic dim (host and GPU Neg of t ["T"])."""
    return _model([helper.make_tensor_value_info("t", TensorProto.FLOAT, ["T"])],
                  [helper.make_node("Neg", ["t"], ["u"])],
                  [helper.make_tensor_value_info("u", TensorProto.FLOAT, None)])


@pytest.fixture(scope="module")
def with_range():
    """(3) An int64 input d driving a host Range(0, 10, d)."""
    consts = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
              helper.make_node("Constant", [], ["ten"], value=helper.make_tensor("t", TensorProto.INT64, [], [10])),
              helper.make_node("Range", ["zero", "ten", "d"], ["steps"])]
    return _model([helper.make_tensor_value_info("d", TensorProto.INT64, [])], consts,
                  [helper.make_tensor_value_info("steps", TensorProto.INT64, None)])


def test_an_oversized_concat_input_is_refused_although_another_input_is_symbolic(symbolic, opencl_device):
    crafted = _recorded(symbolic, "r", [1, 4, 800, 800])  # Concat would write 10,000x past its output
    with pytest.raises(NbFormatError, match=r"value 'r' \(written by step \d+ 'Relu_0', Relu\) is recorded as "
                                            r"\[1, 4, 800, 800\] but its step computes \[1, 4, 8, 8\]"):
        optcli.load(crafted)
    t = np.arange(5, dtype=np.float32)
    out = optcli.load(symbolic, require_gpu=True).run({"x": X, "t": t})
    np.testing.assert_allclose(out["y"], _expected(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["u"], -t)


def test_recorded_symbols_are_never_used_for_sizes(symbolic, opencl_device):
    """Symbols in place of the oversized dims agree with anything: the file loads, and the buffers
    and grids come from the derivation, so the result is right."""
    crafted = _recorded(_recorded(symbolic, "r", [1, 4, "H", "W"]), "y@opencl", [1, "C", "H", "W"])
    p = optcli.load(crafted, require_gpu=True)
    out = p.run({"x": X, "t": np.ones(3, np.float32)})
    np.testing.assert_allclose(out["y"], _expected(X), rtol=1e-5, atol=1e-6)
    assert p.gpu.shapes["r"] == (1, 4, 8, 8) and p.gpu.shapes["y@opencl"] == (1, 8, 8, 8)


def test_a_static_plan_is_sized_from_the_derivation_not_the_file(with_range, opencl_device):
    """Static inputs: the one binding is made at load from the derived shapes; recorded symbols
    (or any recorded shape) play no part."""
    crafted = _recorded(_recorded(with_range, "r", [1, 4, "H", "W"]), "y@opencl", ["A", "B", "C", "D"])
    p = optcli.load(crafted, require_gpu=True)
    assert not p.gpu.dynamic and p.gpu.shapes["r"] == (1, 4, 8, 8) and p.gpu.shapes["y@opencl"] == (1, 8, 8, 8)
    out = p.run({"x": X, "d": np.array(2, np.int64)})
    np.testing.assert_allclose(out["y"], _expected(X), rtol=1e-5, atol=1e-6)


def test_a_second_writer_after_the_reader_is_refused(symbolic):
    body, blob = parts(symbolic)
    relu = next(s for s in body["steps"] if s["op"] == "Relu")
    concat = body["steps"].index(next(s for s in body["steps"] if s["op"] == "Concat"))
    body["steps"].insert(concat + 1, copy.deepcopy(relu))  # writes 'r' again, after Concat read it
    with pytest.raises(NbFormatError, match=r"steps\[\d+\]: writes 'r', which already has a value"):
        optcli.load(rebuild(body, blob))


def test_an_int_input_driving_a_host_range_neither_hides_nor_breaks_the_check(with_range, opencl_device):
    crafted = _recorded(with_range, "s", [1, 4, 800, 800])
    with pytest.raises(NbFormatError, match="recorded as"):
        optcli.load(crafted)
    p = optcli.load(with_range, require_gpu=True)  # nothing runs at load: no zeros fed to the Range
    out = p.run({"x": X, "d": np.array(3, np.int64)})
    np.testing.assert_allclose(out["y"], _expected(X), rtol=1e-5, atol=1e-6)
    assert out["steps"].tolist() == [0, 3, 6, 9]
    with pytest.raises(InputError, match="delta is 0"):
        p.run({"x": X, "d": np.array(0, np.int64)})


def test_a_gpu_step_after_a_data_dependent_value_is_sized_from_the_data(opencl_device):
    """Range(0, n, 1) cast to float (host), then a GPU Relu: its buffers cannot be sized at load
    (nothing runs there), so they are sized at the data point, from the Range's real output."""
    nodes = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.INT64, [], [1])),
             helper.make_node("Range", ["zero", "n", "one"], ["idx"]),
             helper.make_node("Cast", ["idx"], ["v"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["v"], ["y"])]
    graph = helper.make_graph(nodes, "h", [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    data = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                           valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data
    p = optcli.load(data, require_gpu=True)
    assert next(s for s in p.plan.steps if s.op_type == "Relu").target == "opencl"
    assert not p.gpu.buffers.get("v@opencl.linear"), "nothing may be sized by data at load"
    for n in (5, 3, 5):
        assert p.run({"n": np.array(n, np.int64)})["y"].tolist() == list(range(n))
        assert p.gpu.shapes["v@opencl.linear"] == (n,)
