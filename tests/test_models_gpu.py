"""The zoo end to end with the GPU first (OpenCL on PoCL in CI), fp32 and fp16, against
onnxruntime: what opencl claims runs there, the rest on arm, copies in between."""

from __future__ import annotations

import pytest

import optcli
from optcli.verify import onnxruntime_session
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close

pytestmark = pytest.mark.opencl
KEEP_ON_GPU = {"keep_small_islands_on_host"}  # small test models would otherwise go back to the CPU
COPIES = ("Upload", "Download", "Pack", "Unpack")
MODELS = ["mobilenet_v2", "mobilenet_v3", "resnet18", "efficientnet_lite0", "squeezenet", "shufflenet_v2", "unet"]


def _ort(model, feeds):
    sess = onnxruntime_session(model)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_on_opencl(name, precision):
    model = build(name, resolution=32)
    feeds = sample_inputs(model)
    result = optcli.optimize(model=model, valid_targets="opencl,arm", precision=precision,
                             disabled_passes=KEEP_ON_GPU)
    steps = result.report["steps"]
    convs = [s for s in steps if s["op"] in ("Conv", "ConvTranspose")]
    assert convs and all(s["target"] == "opencl" for s in convs), [s for s in convs if s["target"] != "opencl"]
    predictor = optcli.load(result.data, require_gpu=True)
    outputs = predictor.run(feeds)
    for key, expected in _ort(model, feeds).items():
        assert_close(outputs[key], expected, precision, what=f"{name}:{key} on opencl")


def _audio_model(batch: int = 2, mels: int = 16, frames: int = 64, classes: int = 10):
    """A keyword-spotting-like 1-D CNN over [N, mels, frames]: Conv1d -> BN -> Relu -> MaxPool1d ->
    BN (stand-alone) -> depthwise dilated Conv1d -> pointwise Conv1d -> strided Conv1d ->
    GlobalAveragePool -> Flatten -> Gemm."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(13)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def bn(name, c):
        return {f"{name}_s": w(c) + 1, f"{name}_b": w(c), f"{name}_m": w(c), f"{name}_v": np.abs(w(c)) + 0.5}

    inits = {"w1": w(24, mels, 5), "b1": w(24), **bn("bn1", 24), **bn("bn2", 24), "wd": w(24, 1, 3), "bd": w(24),
             "wp": w(32, 24, 1), "w3": w(32, 32, 3), "b3": w(32), "wg": w(classes, 32), "bg": w(classes)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[5], pads=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
        helper.make_node("BatchNormalization", ["p1", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["n2"]),
        helper.make_node("Conv", ["n2", "wd", "bd"], ["cd"], kernel_shape=[3], pads=[2, 2], dilations=[2],
                         group=24),
        helper.make_node("Relu", ["cd"], ["rd"]),
        helper.make_node("Conv", ["rd", "wp"], ["cp"], kernel_shape=[1]),
        helper.make_node("Conv", ["cp", "w3", "b3"], ["c3"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "audio_kws", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [batch, mels, frames])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((batch, mels, frames)).astype(np.float32)}


def _whole_model_on_opencl(model, feeds, precision: str, op: str, count: int, what: str) -> None:
    """Every compute step on opencl (``count`` of them ``op``), loaded with require_gpu=True and
    matching onnxruntime."""
    result = optcli.optimize(model=model, valid_targets="opencl,arm", precision=precision,
                             disabled_passes=KEEP_ON_GPU)
    steps = [s for s in result.report["steps"] if s["domain"] != "optcli" or s["op"] not in COPIES]
    picked = [s for s in steps if s["op"] == op]
    assert len(picked) == count and all(s["target"] == "opencl" for s in picked), picked
    assert all(s["target"] == "opencl" for s in steps), [s for s in steps if s["target"] != "opencl"]
    outputs = optcli.load(result.data, require_gpu=True).run(feeds)
    for key, expected in _ort(model, feeds).items():
        assert_close(outputs[key], expected, precision, what=f"{what}:{key} on opencl")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_audio_conv1d_model_on_opencl(precision):
    """Rank-3 [N, C, L] tensors (packed as H = 1) through the whole model on the GPU: every Conv1d
    (generic, depthwise, pointwise), the pool, the stand-alone BN and the head run on opencl."""
    model, feeds = _audio_model()
    _whole_model_on_opencl(model, feeds, precision, "Conv", 4, "audio_kws")


def _attention_model(batch: int = 2, tokens: int = 7, heads: int = 3, head_dim: int = 5, dynamic: bool = False):
    """One self-attention block as exporters write it: x [B, T, D] -> Q, K, V projections ->
    Reshape [B, T, H, d] -> Transpose to heads -> MatMul(Q, K^T) * scale -> Softmax(-1) ->
    MatMul(P, V) -> Transpose -> Reshape [B, T, D] -> output projection.  ``dynamic``: B and T
    are symbolic (the Reshapes copy them with 0)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(17)
    dim = heads * head_dim

    def w(*shape, scale=0.4):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    lead = [0, 0] if dynamic else [batch, tokens]
    inits = {"wq": w(dim, dim), "wk": w(dim, dim), "wv": w(dim, dim), "wo": w(dim, dim), "bo": w(dim),
             "heads_shape": np.array([*lead, heads, head_dim], np.int64),
             "flat_shape": np.array([*lead, dim], np.int64),
             "scale": np.array(head_dim ** -0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"]
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [p, "heads_shape"], [f"{p}4"]),
                  helper.make_node("Transpose", [f"{p}4"], [f"{p}h"], perm=perm)]
    nodes += [
        helper.make_node("MatMul", ["qh", "kh"], ["scores"]),  # [B, H, T, d] x [B, H, d, T]
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vh"], ["context"]),  # [B, H, T, T] x [B, H, T, d]
        helper.make_node("Transpose", ["context"], ["ct"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ct", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "wo"], ["proj"]),
        helper.make_node("Add", ["proj", "bo"], ["y"]),
    ]
    shape = ["B", "T", dim] if dynamic else [batch, tokens, dim]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((batch, tokens, dim)).astype(np.float32)}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_attention_block_on_opencl(precision):
    """Q.K^T and P.V (MatMul of two run-time tensors) on the GPU, with the Softmax, scale and the
    Reshape / Transpose around them: the whole block is one island on opencl."""
    model, feeds = _attention_model()
    _whole_model_on_opencl(model, feeds, precision, "MatMul", 2, "attention")


def test_attention_block_with_dynamic_batch_and_tokens_on_opencl():
    """The same block with B and T symbolic: placed at nominal sizes, launched per input shape."""
    import numpy as np

    model, _ = _attention_model(dynamic=True)
    result = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU)
    matmuls = [s for s in result.report["steps"] if s["op"] == "MatMul"]
    assert len(matmuls) == 2 and all(s["target"] == "opencl" for s in matmuls), matmuls
    predictor = optcli.load(result.data, require_gpu=True)
    for batch, tokens in [(2, 7), (1, 13)]:
        feeds = {"x": np.random.default_rng(tokens).standard_normal((batch, tokens, 15)).astype(np.float32)}
        for key, expected in _ort(model, feeds).items():
            assert_close(predictor.run(feeds)[key], expected, "fp32", what=f"attention {batch}x{tokens}:{key}")
