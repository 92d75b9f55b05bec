"""Model zoo tests: every model is valid ONNX, runs in onnxruntime with sane output scale, is seeded.

The zoo feeds the optimizer tests and benchmarks, so a broken or degenerate zoo model (all-zero
outputs, inf, a checker failure, non-reproducible weights) would silently weaken everything else.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from optcli.zoo.builder import GraphBuilder
from optcli.zoo.models import FULL_SIZE, ZOO, build, mobilenet_v3, sample_inputs

NAMES = sorted(ZOO)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: build(name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_valid_and_runs_with_sane_scale(models, name):
    model = models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert not any(n.op_type == "Constant" for n in model.graph.node)
    feeds = sample_inputs(model)
    outs = _session(model).run(None, feeds)
    assert [o.name for o in model.graph.output] == ["output"]
    for out in outs:
        assert np.isfinite(out).all(), name
        std, peak = float(out.std()), float(np.abs(out).max())
        assert 1e-3 < std and peak < 1e3, (name, std, peak)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_per_seed(models, name):
    a = models[name].SerializeToString()
    assert build(name, seed=0).SerializeToString() == a
    other = build(name, seed=1)
    assert _ops(other) == _ops(models[name])
    w0 = {t.name: numpy_helper.to_array(t) for t in models[name].graph.initializer}
    w1 = {t.name: numpy_helper.to_array(t) for t in other.graph.initializer}
    assert w0.keys() == w1.keys()
    assert any(not np.array_equal(w0[k], w1[k]) for k in w0)


def test_dynamic_cnn_runs_any_shape():
    model = build("dynamic_cnn")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", 3, "H", "W"]
    sess = _session(model)
    for batch, spatial, hw in [(1, 32, (32, 32)), (3, (17, 45), (17, 45))]:
        feeds = sample_inputs(model, batch=batch, spatial=spatial)
        assert feeds["input"].shape == (batch, 3, *hw)
        (out,) = sess.run(None, feeds)
        assert out.shape == (batch, 10) and np.isfinite(out).all()


def test_symbolic_batch_for_static_models():
    model = build("shufflenet_v2", batch="N")  # Reshape targets must use 0 for the batch dim
    onnx.checker.check_model(model, full_check=True)
    (out,) = _session(model).run(None, sample_inputs(model, batch=2))
    assert out.shape == (2, 10)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="resnet18") as err:
        build("resnet19")
    assert all(name in str(err.value) for name in NAMES)


def test_full_size_presets_cover_zoo_and_match_published_params():
    assert FULL_SIZE.keys() == ZOO.keys()
    expected = {"mobilenet_v2": 3.5e6, "efficientnet_lite0": 4.7e6, "squeezenet": 1.24e6}
    for name, params in expected.items():
        m = build(name, full=True)
        n = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
        assert abs(n - params) / params < 0.05, (name, n)


def test_exporter_patterns_present(models):
    ops = {name: _ops(m) for name, m in models.items()}
    for name in ("mobilenet_v2", "resnet18", "efficientnet_lite0", "shufflenet_v2", "unet", "dynamic_cnn"):
        assert "BatchNormalization" in ops[name], name  # left unfolded on purpose
    init_names = {t.name for t in models["mobilenet_v2"].graph.initializer}
    clips = [n for n in models["mobilenet_v2"].graph.node if n.op_type == "Clip"]
    assert clips and all(len(c.input) == 3 and set(c.input[1:]) <= init_names for c in clips)
    assert {"HardSwish", "Div", "HardSigmoid"} <= set(ops["mobilenet_v3"])
    r = ops["resnet18"]
    assert r[r.index("MaxPool") - 1] == "Pad"
    assert "Pad" in ops["efficientnet_lite0"] and "MatMul" in ops["efficientnet_lite0"]
    s = ops["shufflenet_v2"]
    assert "Split" in s and any(s[i:i + 3] == ["Reshape", "Transpose", "Reshape"] for i in range(len(s)))
    assert "Concat" in ops["squeezenet"]
    resize_modes = {a.s for n in models["unet"].graph.node if n.op_type == "Resize" for a in n.attribute
                    if a.name == "mode"}
    assert resize_modes == {b"nearest", b"linear"}
    assert "ConvTranspose" in ops["unet"] and ops["unet"][-1] == "Sigmoid"
    assert ops["lstm_model"][:1] == ["LSTM"] and ops["lstm_model"][-2:] == ["MatMul", "Add"]


def test_hardswish_forms_are_equivalent():
    """Same seed, op vs decomposed hard-swish: identical weights, so outputs agree (a fusion oracle)."""
    a, b = mobilenet_v3(hardswish="op"), mobilenet_v3(hardswish="decomposed")
    assert "HardSwish" in _ops(a) and "HardSwish" not in _ops(b)
    feeds = sample_inputs(a)
    np.testing.assert_allclose(_session(a).run(None, feeds)[0], _session(b).run(None, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_builder_primitives_shape_tracking():
    """Ops the models don't all use; full_check compares the builder's shapes with ONNX inference."""
    g = GraphBuilder("prims", seed=3)
    x = g.input("x", [2, 8, 15, 15])
    y = g.swish(g.conv(x, 8, 3, dilation=2, bias=False))
    y = g.hardsigmoid(g.avgpool(y, 3, 2, pad=1, ceil_mode=True), decomposed=True)
    y = g.conv(g.pad(y, [0, 0, 1, 1]), 16, (3, 1), stride=2, pad=0, group=4)
    y = g.squeeze_excite(g.resize(y, 2.0, "linear"), 4, gate="sigmoid")
    z = g.transpose(g.reshape(y, [2, 16, -1]), [0, 2, 1])
    z = g.matmul_add(z, 5)
    w = g.conv_transpose(g.relu6(y), 4, k=3, stride=2, pad=1, output_padding=1)
    model = g.build(outputs=[z, w])
    onnx.checker.check_model(model, full_check=True)
    outs = _session(model).run(None, sample_inputs(model))
    for out, vi in zip(outs, model.graph.output):
        assert list(out.shape) == [d.dim_value for d in vi.type.tensor_type.shape.dim]
        assert np.isfinite(out).all()


def test_sample_inputs_seeded():
    model = build("lstm_model")
    a, b, c = sample_inputs(model, seed=0), sample_inputs(model, seed=0), sample_inputs(model, seed=1)
    assert a["input"].dtype == np.float32 and a["input"].shape == (16, 1, 32)
    assert np.array_equal(a["input"], b["input"]) and not np.array_equal(a["input"], c["input"])
