"""FakeQuant steps of pre-quantized models end in the op before them, or go when they requantize
values already on their grid (fuse_fake_quant, drop_redundant_fake_quant); the DequantizeLinear
after an integer Pad / MaxPool moves before it (fold_qdq).  Results are the unfused plan's bit for
bit, on the host and on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import optcli
from optcli.ir import OPTCLI_DOMAIN, Graph, Node, Value
from optcli.ops.activation import QUANT_ATTR
from optcli.passes import drop_redundant_fake_quant, fuse_fake_quant
from optcli.passes.base import PassContext
from optcli.tolerance import RELATIVE, max_error
from tests.passes.ir_build import run_ir
from tests.quant.quantized_models import feeds, ort_extended_nodes, ort_run, quantized, residual_cnn

FUSIONS = {"fuse_fake_quant", "drop_redundant_fake_quant"}
WHOLE_GPU = {"keep_small_islands_on_host"}  # these models are too small to be worth a GPU otherwise
# host plans' integer steps (tests/quant/test_q*.py, test_qdq_movement.py, test_qdq_islands.py)
INTEGER_CONVS = {"fuse_qdq_conv", "fuse_qdq_matmul", "fuse_qdq_add", "fuse_qdq_movement", "fuse_qdq_lookup",
                 "fuse_qdq_se"}


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fq")
    model = residual_cnn()
    return model, {kind: quantized(model, kind, folder) for kind in ("qdq", "qoperator")}, folder


def _compute_steps(result) -> list[dict]:
    return [s for s in result.report["steps"] if s["op"] not in ("Upload", "Download", "Pack", "Unpack")]


@pytest.mark.parametrize("targets", ["arm", "opencl,arm"])
def test_qdq_model_runs_as_onnxruntime_fuses_it(cnn, targets):
    model, q, folder = cnn
    qdq = q["qdq"]
    # the float view (what GPU plans run; on the host, with its integer convs turned off)
    result = optcli.optimize(model=qdq, valid_targets=targets, disabled_passes=WHOLE_GPU | INTEGER_CONVS)
    ops = result.report["ops_after"]
    # only the input's FakeQuant stays a step: the others end the Conv / Add / pool before them,
    # or requantized a MaxPool's or Flatten's values onto the grid they were already on
    assert ops.get("FakeQuant") == 1 and "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert sum(QUANT_ATTR in s.attrs for s in result.plan.steps) == 6  # 3 Conv, Add, pool, Gemm
    assert len(_compute_steps(result)) < ort_extended_nodes(qdq, folder)
    unfused = optcli.optimize(model=qdq, valid_targets=targets, disabled_passes=FUSIONS | WHOLE_GPU | INTEGER_CONVS)
    assert unfused.report["ops_after"]["FakeQuant"] >= 8
    for seed in range(3):
        x = feeds(model, seed)
        got = optcli.load(result.data).run(x)["y"]
        assert np.array_equal(got, optcli.load(unfused.data).run(x)["y"])
        err, scale = max_error(got, ort_run(qdq, x)[0])
        assert err / scale <= RELATIVE["int8"], (err, scale)
    if targets != "arm":
        assert all(s["target"] == "opencl" for s in _compute_steps(result))


def test_qoperator_model_on_the_gpu_is_a_float_view_without_pairs(cnn):
    """QLinearConv -> QuantizeLinear -> MaxPool(uint8) -> DequantizeLinear x2: the DequantizeLinear
    moves before the MaxPool, the pair folds, every FakeQuant but the input's fuses."""
    model, q, folder = cnn
    result = optcli.optimize(model=q["qoperator"], valid_targets="opencl,arm", disabled_passes=WHOLE_GPU)
    ops = result.report["ops_after"]
    assert ops.get("FakeQuant") == 1 and "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert all(s["target"] == "opencl" for s in _compute_steps(result))
    x = feeds(model, 0)
    err, scale = max_error(optcli.load(result.data).run(x)["y"], ort_run(q["qoperator"], x)[0])
    assert err / scale <= RELATIVE["int8"]


def test_qoperator_model_on_the_host_is_onnxruntime_to_the_bit(cnn):
    model, q, folder = cnn
    result = optcli.optimize(model=q["qoperator"], valid_targets="arm")
    assert result.report["ops_after"]["QConv"] == 3  # QLinearConv as optcli's integer conv
    assert len(_compute_steps(result)) <= ort_extended_nodes(q["qoperator"], folder)
    for seed in range(3):
        x = feeds(model, seed)
        assert np.array_equal(optcli.load(result.data).run(x)["y"], ort_run(q["qoperator"], x)[0])


# ---------------------------------------------------------------------------- the passes on the IR
GRID = {"scale": 0.05, "zero_point": 3.0, "qmin": 0.0, "qmax": 255.0}


def _graph(nodes: list[Node], consts: dict | None = None, shape=(1, 2, 4, 4)) -> Graph:
    g = Graph("g", nodes, [Value("x", "float32", shape)], [], dict(consts or {}), {}, {"": 17})
    g.values["x"] = g.inputs[0]
    for n in nodes:
        for o in n.outputs:
            g.values[o] = Value(o, "float32", None)
    g.outputs = [g.values[nodes[-1].outputs[0]]]
    return g


def _fq(src: str, dst: str, **params) -> Node:
    return Node("FakeQuant", [src], [dst], {**GRID, **params}, f"fq_{dst}", OPTCLI_DOMAIN)


def _run_both(graph: Graph, pass_module, x: np.ndarray) -> tuple[np.ndarray, dict]:
    before = run_ir(graph, {"x": x})[0]
    counts = pass_module.run(graph, PassContext())
    after = run_ir(graph, {"x": x})[0]
    assert np.array_equal(before, after)
    return after, counts


X = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("mover, consts, removed", [
    (Node("MaxPool", ["a"], ["b"], {"kernel_shape": [2, 2]}, "m"), {}, 1),
    (Node("Transpose", ["a"], ["b"], {"perm": [0, 2, 3, 1]}, "m"), {}, 1),
    (Node("Pad", ["a", "pads", "zero"], ["b"], {}, "m"), {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1]),
                                                          "zero": np.array(0.0, np.float32)}, 1),
    # 0.13 is not a multiple of 0.05 away from 0: the second FakeQuant has work to do
    (Node("Pad", ["a", "pads", "v"], ["b"], {}, "m"), {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1]),
                                                       "v": np.array(0.13, np.float32)}, 0),
    (Node("Sigmoid", ["a"], ["b"], {}, "m"), {}, 0),  # new values: off the grid
])
def test_requantizing_onto_the_same_grid_is_dropped(mover, consts, removed):
    graph = _graph([_fq("x", "a"), mover, _fq("b", "z"), Node("Neg", ["z"], ["y"], {}, "neg")], consts)
    _, counts = _run_both(graph, drop_redundant_fake_quant, X * 3)
    assert counts["removed"] == removed
    assert [n.op_type for n in graph.nodes].count("FakeQuant") == 2 - removed


def test_another_grid_is_kept():
    graph = _graph([_fq("x", "a"), Node("MaxPool", ["a"], ["b"], {"kernel_shape": [2, 2]}, "m"),
                    _fq("b", "z", scale=0.07), Node("Neg", ["z"], ["y"], {}, "neg")])
    _, counts = _run_both(graph, drop_redundant_fake_quant, X)
    assert counts["removed"] == 0


def test_fused_into_the_epilogue_after_the_activation():
    consts = {"w": np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32),
              "b": np.float32([0.1, -0.2, 0.3])}
    conv = Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1], "activation": "relu"}, "conv")
    graph = _graph([conv, _fq("c", "y", zero_point=0.0)], consts)
    out, counts = _run_both(graph, fuse_fake_quant, X)
    assert counts["fused"] == 1 and [n.op_type for n in graph.nodes] == ["Conv"]
    assert conv.attrs[QUANT_ATTR] == [0.05, 0.0, 0.0, 255.0] and conv.outputs == ["y"]
    assert np.allclose(out / 0.05, np.rint(out / 0.05), atol=1e-4) and out.min() == 0.0


def test_not_fused_when_the_value_has_other_readers():
    graph = _graph([Node("Add", ["x", "x"], ["a"], {}, "add"), _fq("a", "f"),
                    Node("Mul", ["f", "a"], ["y"], {}, "mul")])
    _, counts = _run_both(graph, fuse_fake_quant, X)
    assert counts["fused"] == 0


@pytest.mark.parametrize("value, moved", [(0.0, 1), (0.15, 1), (0.13, 0)])
def test_fake_quant_moves_before_a_pad_with_a_value_of_its_grid(value, moved):
    """Pad -> FakeQuant -> Conv (an input quantized after its 'same' padding) becomes
    FakeQuant -> Pad -> Conv, where the Pad can fold into the Conv."""
    consts = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1]), "v": np.array(value, np.float32),
              "w": np.ones((1, 2, 3, 3), np.float32)}
    graph = _graph([Node("Pad", ["x", "pads", "v"], ["p"], {}, "pad"), _fq("p", "q"),
                    Node("Conv", ["q", "w"], ["y"], {}, "conv")], consts)
    _, counts = _run_both(graph, drop_redundant_fake_quant, X)
    assert counts["moved_before_pad"] == moved
    assert [n.op_type for n in graph.nodes] == (["FakeQuant", "Pad", "Conv"] if moved else ["Pad", "FakeQuant", "Conv"])
    if moved:
        assert graph.shape_of(graph.nodes[0].outputs[0]) == X.shape


def test_shape_inference_sees_through_fake_quant():
    """A FakeQuant between a Pad and the Shape of run-time 'same' padding must not hide the
    Pad's shape once its pads are folded (a QDQ model's Shape reads a dequantized tensor)."""
    from optcli.passes._helpers.shape_inference import reinfer_shapes

    pad = Node("Pad", ["x", "pads"], ["p"], {}, "pad")
    graph = _graph([pad, _fq("p", "q"), Node("Relu", ["q"], ["y"], {}, "relu")],
                   {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1])})
    graph.values["q"] = Value("q", "float32", ("n", "c", "h", "w"))  # what the exporter's model said
    reinfer_shapes(graph)
    assert graph.shape_of("q") == (1, 2, 6, 6) and graph.shape_of("y") == (1, 2, 6, 6)
