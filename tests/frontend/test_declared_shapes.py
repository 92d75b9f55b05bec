"""Declared shapes and types are hints, not facts (issue 24, part 4): where a model's graph-output or
value_info declaration contradicts what its graph computes, the computed shape wins with a warning
naming the value and both shapes, and the `.nb` runs like onnxruntime (on the model as given where
onnxruntime runs it, else on the model with the declaration cleared)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.cli import opt_main
from optcli.frontend.onnx_reader import read_model
from tests.helpers import assert_close, run_cli

F = TensorProto.FLOAT
HINT = "optcli uses the computed shape (declared shapes are hints, not facts"


def _crnn_like(declared, x_shape=(1, 1, 8, "W"), out_type=F) -> onnx.ModelProto:
    """A CRNN recogniser's tail in small: Conv (stride 8 along W) -> Squeeze -> Transpose -> Relu,
    computing [W/8, 1, 16], whose graph output declares ``declared``."""
    w = np.random.default_rng(0).standard_normal((16, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[8, 8], pads=[1, 1, 1, 1]),
             helper.make_node("Squeeze", ["c", "axes"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[2, 0, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    weights = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2], np.int64), "axes")]
    graph = helper.make_graph(nodes, "crnn_tail", [helper.make_tensor_value_info("x", F, list(x_shape))],
                              [helper.make_tensor_value_info("y", out_type, declared)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _shape_of_lie(declared_r, x_shape) -> onnx.ModelProto:
    """y = Reshape(Flatten(x), Shape(Relu(x))): y is x again, whatever value_info says of Relu's output
    ``r``; a lie about ``r`` that reached the Shape would reshape x into the lie."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Flatten", ["x"], ["f"], axis=0), helper.make_node("Reshape", ["f", "s"], ["y"])]
    graph = helper.make_graph(nodes, "shape_of_lie", [helper.make_tensor_value_info("x", F, list(x_shape))],
                              [helper.make_tensor_value_info("y", F, None)],
                              value_info=[helper.make_tensor_value_info("r", F, declared_r)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _cleared(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its output and value_info declarations cleared by hand."""
    clean = onnx.ModelProto()
    clean.CopyFrom(model)
    del clean.graph.value_info[:]
    for out in clean.graph.output:
        out.type.tensor_type.Clear()
        out.type.tensor_type.elem_type = F
    return clean


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # onnxruntime warns about the very declarations under test
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _check_runs_like_onnxruntime(model, widths, reference=None):
    """optimize -> load -> run at each input width, against onnxruntime; returns the result's warnings."""
    result = optcli.optimize(model=model, valid_targets="arm")
    predictor = optcli.load(result.data)
    for width in widths:
        x = np.random.default_rng(width).standard_normal((1, 1, 8, width)).astype(np.float32)
        got = predictor.run({"x": x})["y"]
        assert_close(got, _ort(reference or model, {"x": x}), what=f"W={width}")
        assert got.shape == (width // 8, 1, 16)
    return result.warnings


@pytest.mark.parametrize("declared, shown", [
    ([1, "seqlen"], "[1, seqlen]"),  # the CRNN of the issue: another rank, a symbol
    ([1, 5], "[1, 5]"),  # another rank, fixed
    ([1, 5, 7, 9], "[1, 5, 7, 9]"),  # a higher rank
    ([None, 1, 5], "[?, 1, 5]"),  # the rank right, a fixed dim wrong
    ([8, 1, 16], "[8, 1, 16]"),  # right for W = 64 only: the graph computes it from the dynamic W
])
def test_a_lying_output_declaration_gives_way_to_the_computed_shape(declared, shown):
    warnings = _check_runs_like_onnxruntime(_crnn_like(declared), (64, 128))
    assert warnings == [f"graph output 'y' is declared {shown} but the graph computes [?, 1, 16]; {HINT}: fix the "
                        "declaration in the exporter to silence this)"]


def test_static_input_records_the_computed_static_shape():
    model = _crnn_like([1, "seqlen"], x_shape=(1, 1, 8, 64))
    warnings = _check_runs_like_onnxruntime(model, (64,))
    assert warnings[0].startswith("graph output 'y' is declared [1, seqlen] but the graph computes [8, 1, 16];")
    assert optcli.load(optcli.optimize(model=model).data).outputs[0].shape == (8, 1, 16)


def test_a_fixed_declared_dim_does_not_pin_a_dynamic_input_dim():
    """Declared [8, 1, 16] where the graph computes [8, N, 16]: batch N stays dynamic."""
    model = _crnn_like([8, 1, 16], x_shape=("N", 1, 8, 64))
    result = optcli.optimize(model=model, valid_targets="arm")
    assert result.warnings == [f"graph output 'y' is declared [8, 1, 16] but the graph computes [8, N, 16]; {HINT}: "
                               "fix the declaration in the exporter to silence this)"]
    predictor = optcli.load(result.data)
    assert predictor.outputs[0].shape == (8, "N", 16)
    x = np.random.default_rng(3).standard_normal((3, 1, 8, 64)).astype(np.float32)
    assert_close(predictor.run({"x": x})["y"], _ort(model, {"x": x}))


def test_the_cli_warns_and_writes_a_nb_that_runs(tmp_path, capsys):
    model = _crnn_like([1, "seqlen"])
    onnx.save(model, tmp_path / "crnn.onnx")
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={tmp_path / 'crnn.onnx'}", "--valid_targets=arm",
                                             f"--optimize_out={tmp_path / 'crnn'}"], capsys)
    assert code == 0, err
    assert "bug in optcli" not in err
    assert ("opt: warning: graph output 'y' is declared [1, seqlen] but the graph computes [?, 1, 16]; optcli uses "
            "the computed shape") in err
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 96)).astype(np.float32)
    assert_close(optcli.load(str(tmp_path / "crnn.nb")).run({"x": x})["y"], _ort(model, {"x": x}))


def test_a_lying_output_dtype_gives_way_to_the_computed_one():
    """onnxruntime refuses such a model; optcli runs what the graph computes (float32), and says so."""
    model = _crnn_like([None, 1, 16], out_type=TensorProto.INT64)
    warnings = _check_runs_like_onnxruntime(model, (64,), reference=_cleared(model))
    assert warnings == ["graph output 'y' is declared int64 but the graph computes float32; optcli uses float32 "
                        "(declared types are hints, not facts: fix the declaration in the exporter to silence this)"]
    assert optcli.load(optcli.optimize(model=model).data).outputs[0].dtype == "float32"


@pytest.mark.parametrize("declared_r, x_shape, shown", [
    ([1, 48], [1, 3, 4, 4], "[1, 48] but the graph computes [1, 3, 4, 4]"),
    ([1, 3, 4, 4], ["N", 3, 4, 4], "[1, 3, 4, 4] but the graph computes [N, 3, 4, 4]"),
])
def test_a_lying_value_info_does_not_poison_what_reads_its_shape(declared_r, x_shape, shown):
    """The lie about ``r`` once became the Reshape target ([1, 48]: a wrong result, no error); with a
    dynamic batch onnxruntime itself folds the lie (and fails on batch 2), so the reference is the
    model with the declaration cleared."""
    model = _shape_of_lie(declared_r, x_shape)
    result = optcli.optimize(model=model, valid_targets="arm")
    assert result.warnings == [f"value 'r' (value_info) is declared {shown}; {HINT}: fix the declaration in the "
                               "exporter to silence this)"]
    predictor = optcli.load(result.data)
    for batch in ((1, 2) if x_shape[0] == "N" else (1,)):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4, 4)).astype(np.float32)
        got = predictor.run({"x": x})["y"]
        assert_close(got, _ort(_cleared(model), {"x": x}), what=f"batch {batch}")
        assert_close(got, x, what=f"batch {batch}")


def test_honest_declarations_warn_nothing_and_name_dynamic_dims():
    """A declared symbol names a dim the graph computes but cannot name (W/8)."""
    model = _crnn_like(["seqlen", 1, 16])
    warnings = _check_runs_like_onnxruntime(model, (64, 128))
    assert warnings == []
    assert optcli.load(optcli.optimize(model=model).data).outputs[0].shape == ("seqlen", 1, 16)


def test_a_declaration_stays_a_hint_where_nothing_computes_the_value():
    """The output of an op onnx does not know keeps its declared shape, and what follows it is
    shaped from that hint (the op's placement is judged later, not here)."""
    node = helper.make_node("Mystery", ["x"], ["m"], domain="com.example")
    relu = helper.make_node("Relu", ["m"], ["y"])
    graph = helper.make_graph([node, relu], "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, None)],
                              value_info=[helper.make_tensor_value_info("m", F, [6, "k"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    found: list[str] = []
    g = read_model(model=model, warnings=found)
    assert found == []
    assert g.values["m"].shape == (6, "k")
    assert g.values["y"].shape == (6, "k")


@pytest.mark.parametrize("x_shape, pin", [([1, 3, 8, 8], []), ([1, "C", 8, 8], ["--input_shapes=x:1,3,8,8"])])
def test_a_graph_that_does_not_fit_its_inputs_is_the_models_fault(tmp_path, capsys, x_shape, pin):
    """A Conv whose weight takes 4 channels of a 3-channel input (as given, or as pinned): exit 2 naming
    the node, not a .nb our reader refuses reported as a bug in optcli."""
    w = numpy_helper.from_array(np.ones((16, 4, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")], "g",
                              [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info("y", F, None)], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={tmp_path / 'm.onnx'}", *pin,
                                             f"--optimize_out={tmp_path / 'm'}"], capsys)
    assert code == 2, err
    assert "bug in optcli" not in err and "please report" not in err
    assert ("the graph does not fit the shapes of its inputs: (op_type:Conv, node name: conv1): the input has 3 "
            "channels, the weight takes 4 (group 1); the model cannot run as written") in err
