"""Reading ONNX: files, directories, external data, pinned shapes, and clear errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optcli.errors import ModelError, UsageError
from optcli.frontend.input_shapes import parse_input_shapes
from optcli.frontend.onnx_reader import read_model


def _matmul_model(dynamic: bool = True) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3] if dynamic else [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_pinned_shapes_make_everything_static():
    g = read_model(model=_matmul_model(), input_shapes={"x": [5, 3]})
    assert g.inputs[0].shape == (5, 3)
    assert g.values["y"].shape == (5, 4)


def test_unpinned_dims_stay_symbolic_and_caller_model_untouched():
    model = _matmul_model()
    read_model(model=model, input_shapes={"x": [5, 3]})
    g = read_model(model=model)
    assert g.inputs[0].shape == ("N", 3)


@pytest.mark.parametrize("spec, message", [
    ("x:1,a", "whole numbers"), ("x:0,3", "positive"), ("1,3", "NAME:D1"), ("x:1;x:2", "twice"),
])
def test_bad_input_shapes_spec(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_input_shapes(spec)


def test_input_shapes_must_fit_the_model():
    with pytest.raises(UsageError, match="not an input"):
        read_model(model=_matmul_model(), input_shapes={"nope": [1, 3]})
    with pytest.raises(UsageError, match="rank 2"):
        read_model(model=_matmul_model(), input_shapes={"x": [1, 3, 1]})
    with pytest.raises(UsageError, match="fixed to 3"):
        read_model(model=_matmul_model(), input_shapes={"x": [1, 4]})


def test_model_dir_with_external_data(tmp_path):
    model = _matmul_model()
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    g = read_model(model_dir=str(tmp_path))
    np.testing.assert_array_equal(g.initializers["w"], np.arange(12, dtype=np.float32).reshape(3, 4))


def test_model_dir_needs_exactly_one_model(tmp_path):
    with pytest.raises(ModelError, match="no .onnx file"):
        read_model(model_dir=str(tmp_path))
    onnx.save(_matmul_model(), tmp_path / "a.onnx")
    onnx.save(_matmul_model(), tmp_path / "b.onnx")
    with pytest.raises(ModelError, match="2 .onnx files"):
        read_model(model_dir=str(tmp_path))


def test_external_data_escaping_the_directory_is_refused(tmp_path):
    model = _matmul_model()
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "48")):
        tensor.external_data.add(key=key, value=value)
    (tmp_path / "m").mkdir()
    onnx.save(model, tmp_path / "m" / "model.onnx")
    with pytest.raises(ModelError, match="outside the model directory"):
        read_model(model_file=str(tmp_path / "m" / "model.onnx"))


def test_truncated_protobuf(tmp_path):
    data = _matmul_model().SerializeToString()
    (tmp_path / "bad.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="bad.onnx"):
        read_model(model_file=str(tmp_path / "bad.onnx"))


def test_opset_out_of_range():
    model = _matmul_model()
    model.opset_import[0].version = 5
    with pytest.raises(ModelError, match="opset 5 is outside"):
        read_model(model=model)


def test_missing_input_is_reported():
    model = _matmul_model()
    model.graph.node[0].input[1] = "missing_weight"
    with pytest.raises(ModelError):
        read_model(model=model)


def test_unnamed_nodes_get_names_and_ops_without_kernel_keep_proto():
    node = helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->ij")
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    g = read_model(model=model)
    assert g.nodes[0].name == "Einsum_0"
    assert g.nodes[0].proto is not None


def test_unsupported_element_type_is_refused_at_optimize_time():
    import optcli

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    with pytest.raises(ModelError, match="input 'x' has element type bfloat16"):
        optcli.optimize(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_negative_dims_are_dynamic_everywhere():
    """-1 (paddle2onnx, older exporters) means "any size" on inputs, outputs and value_info."""
    model = _matmul_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4]))
    g = read_model(model=model)
    assert isinstance(g.inputs[0].shape[0], str) and g.inputs[0].shape[1] == 3
    assert isinstance(g.outputs[0].shape[0], str)
    pinned = read_model(model=model, input_shapes={"x": [7, 3]})
    assert pinned.inputs[0].shape == (7, 3) and pinned.values["y"].shape == (7, 4)


def test_names_that_are_not_utf8_are_a_model_error(tmp_path):
    """Protobuf hands back bytes for a name that is not UTF-8: a clear error, not a TypeError."""
    model = _matmul_model(dynamic=False)
    model.graph.node[0].name = "nodeQQQQ"
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString().replace(b"QQQQ", b"\xff\xfe\xfd\xfc"))
    with pytest.raises(ModelError, match="not valid UTF-8"):
        read_model(model_file=str(path))


def _external_model(tmp_path, dims, file_bytes, length=None):
    """A model whose one weight lives in a sparse external file of ``file_bytes`` bytes."""
    data = tmp_path / "w.bin"
    with open(data, "wb") as f:
        f.truncate(file_bytes)  # sparse: takes no disk space
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims)
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", "offset": "0", **({"length": str(length)} if length else {})}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [w])
    (tmp_path / "model.onnx").write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return tmp_path


def test_huge_sparse_external_data_is_refused_before_reading(tmp_path, monkeypatch):
    """16 GiB declared (8 KB on disk): refused from the sizes, never read."""
    monkeypatch.setenv("OPTCLI_MAX_WEIGHT_BYTES", str(1 << 30))
    folder = _external_model(tmp_path, [4, 1 << 30], 16 << 30, length=16 << 30)
    with pytest.raises(ModelError, match="memory budget"):
        read_model(model_dir=str(folder))


def test_external_data_size_must_match_the_declared_shape(tmp_path):
    folder = _external_model(tmp_path, [2, 3], 4096)  # no length: the rest of the file, 4096 != 24 bytes
    with pytest.raises(ModelError, match="declares 24 bytes"):
        read_model(model_dir=str(folder))


@pytest.mark.parametrize("dims", [[0, 1 << 62], [-3, 2], [1 << 20, 1 << 20]])
def test_absurd_initializer_dims_are_a_model_error(dims):
    """[0, 2**62] holds nothing, yet numpy refuses the shape: the model's fault, exit 2."""
    model = _matmul_model(dynamic=False)
    model.graph.initializer.append(onnx.TensorProto(name="junk", data_type=TensorProto.FLOAT, dims=dims))
    with pytest.raises(ModelError, match="junk"):
        read_model(model=model)


def _with_function(recursive: bool = False):
    from onnx import TensorProto, helper

    body = [helper.make_node("MyRelu", ["a"], ["b"], domain="local")] if recursive else [
        helper.make_node("Relu", ["a"], ["b"])]
    imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("local", 1)] if recursive else [])
    fn = helper.make_function("local", "MyRelu", ["a"], ["b"], body, imports)
    graph = helper.make_graph([helper.make_node("MyRelu", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                             functions=[fn])


def test_model_local_functions_are_inlined_in_a_fresh_process(tmp_path):
    """Issue 23: onnx does not import its inliner with ``onnx``; in a process where nothing else had
    imported it, every model with a local function was an internal error (exit 1)."""
    import subprocess
    import sys

    import onnx

    path = tmp_path / "fn.onnx"
    onnx.save(_with_function(), path)
    code = (f"from optcli.cli import opt_main; import sys; sys.argv = ['opt', '--model_file={path}', "
            f"'--optimize_out={tmp_path / 'fn'}']; opt_main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    onnx.save(_with_function(recursive=True), path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "local functions cannot be inlined" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("axis", [0, -4])
def test_per_channel_dequantize_axis_in_an_opset_11_model_is_read_as_opset_13_says(axis):
    """onnxruntime's quantize_static (per_channel=True) writes DequantizeLinear with ``axis`` into
    opset-10..12 models, where the checker rejects the attribute (issue 26).  optcli reads it per
    channel, warns, and computes what the float weight it stands for gives."""
    import onnxruntime as ort

    import optcli

    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    scale = np.array([0.01, 0.02, 0.05, 0.1], np.float32)
    zero = np.array([0, 3, -2, 1], np.int8)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])

    def model(nodes, inits):
        graph = helper.make_graph(nodes, "g", [x_info], [y_info], initializer=inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)

    conv = helper.make_node("Conv", ["x", "wf"], ["y"], pads=[1, 1, 1, 1])
    quantized = model([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=axis), conv],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "s"),
                       numpy_helper.from_array(zero, "z")])
    wf = (w.astype(np.float32) - zero.reshape(4, 1, 1, 1)) * scale.reshape(4, 1, 1, 1)
    plain = model([conv], [numpy_helper.from_array(wf, "wf")])
    x = rng.random((1, 3, 8, 8), dtype=np.float32)
    want = ort.InferenceSession(plain.SerializeToString()).run(None, {"x": x})[0]
    result = optcli.optimize(model=quantized)
    assert any("'axis' of opset 13 in an opset-11 model" in w for w in result.warnings), result.warnings
    np.testing.assert_allclose(optcli.load(result.data).run([x])["y"], want, rtol=1e-5, atol=1e-5)


def test_a_dequantize_axis_at_opset_13_is_no_warning():
    w = np.ones((2, 3), np.int8)
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], axis=0)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=[numpy_helper.from_array(w, "w"),
                                           numpy_helper.from_array(np.array([0.5, 2], np.float32), "s")])
    found: list[str] = []
    read_model(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), warnings=found)
    assert not any("axis" in f for f in found)
