"""Conv and ConvTranspose GPU kernels against the numpy reference: every variant, fp32 and fp16,
odd channel counts, strides, asymmetric pads, dilation, groups, batch 2, every fused epilogue;
1-D convolutions (rank-3 ``[N, C, L]``, packed as ``H = 1``) on the variants that take them."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.activation_codes import ACTIVATIONS
from optcli.gpu.registry import get_gpu_kernel, gpu_kernels_for
from optcli.ir import Graph, Node, Value
from optcli.ops.evaluate import evaluate_node
from optcli.targets.gpu import OPENCL
from tests.gpu.harness import check_gpu

RNG = np.random.default_rng(7)


def ir_graph(op_type: str, inputs: dict, consts: dict, attrs: dict, domain: str = "",
             input_names: list[str] | None = None) -> tuple[Graph, Node]:
    """A one-node IR graph built directly (fused-epilogue attributes are not ONNX attributes)."""
    names = input_names if input_names is not None else [*inputs, *consts]
    node = Node(op_type, list(names), ["y0"], dict(attrs), "n0", domain)
    graph = Graph("g", [node], [Value(k, str(v.dtype), tuple(v.shape)) for k, v in inputs.items()], [],
                  dict(consts), {}, {"": 17})
    env = {**inputs, **consts}
    (out,) = evaluate_node(node, [env[n] if n else None for n in names], graph.opsets)
    graph.values = {v.name: v for v in graph.inputs}
    graph.values["y0"] = Value("y0", str(out.dtype), tuple(out.shape))
    graph.outputs = [graph.values["y0"]]
    return graph, node


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def conv_case(x_shape, m, k, group=1, bias=True, **attrs):
    x = rand(*x_shape)
    consts = {"w": rand(m, x_shape[1] // group, *k, scale=0.5)}
    if bias:
        consts["b"] = rand(m)
    if group != 1:
        attrs["group"] = group
    return x, consts, attrs


# name -> (x shape, M, kernel, group, attrs)
CASES = {
    "1x1": (((2, 5, 6, 7), 7, (1, 1), 1, {}), ((1, 9, 5, 7), 6, (1, 1), 1, {"strides": [2, 2]})),
    "3x3": (((2, 5, 7, 9), 7, (3, 3), 1, {"pads": [1, 0, 2, 1]}),
            ((1, 3, 9, 8), 5, (3, 3), 1, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
            ((1, 6, 9, 9), 3, (3, 3), 1, {"dilations": [2, 2], "pads": [2, 1, 2, 1]})),
    "depthwise": (((2, 6, 7, 9), 6, (3, 3), 6, {"pads": [1, 1, 1, 1]}),
                  ((1, 5, 9, 8), 5, (3, 3), 5, {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
                  ((1, 5, 7, 7), 10, (3, 3), 5, {"pads": [1, 1, 1, 1]}),  # channel multiplier 2
                  ((1, 7, 11, 10), 7, (5, 5), 7, {"dilations": [2, 2], "pads": [3, 2, 2, 3]})),
    "generic": (((1, 6, 7, 7), 9, (3, 3), 3, {"pads": [1, 1, 1, 1]}),  # groups of 2 -> 3 channels
                ((2, 10, 6, 5), 6, (1, 3), 2, {"pads": [0, 1, 0, 2]}),
                ((1, 3, 11, 9), 5, (5, 5), 1, {"strides": [2, 1], "pads": [2, 2, 1, 0], "dilations": [1, 2]}),
                ((1, 5, 7, 7), 10, (3, 3), 5, {"pads": [1, 1, 1, 1]})),
    "winograd": (((2, 5, 7, 9), 7, (3, 3), 1, {"pads": [1, 1, 1, 1]}),
                 ((1, 9, 6, 7), 3, (3, 3), 1, {"pads": [1, 0, 0, 1]}),
                 ((1, 3, 8, 9), 6, (3, 3), 1, {})),
}
PARAMS = [(v, i) for v, cases in CASES.items() for i in range(len(cases))]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("variant, index", PARAMS)
def test_conv_variant(variant, index, precision):
    x_shape, m, k, group, attrs = CASES[variant][index]
    x, consts, attrs = conv_case(x_shape, m, k, group, bias=index != 1, **attrs)
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, precision, kernel_id=f"gpu.onnx.Conv.{variant}")


EPILOGUES = {"relu": (0, 0), "clip": (-0.5, 0.7), "leaky_relu": (0.1, 0), "sigmoid": (0, 0), "tanh": (0, 0),
             "hard_sigmoid": (0.2, 0.5), "hard_swish": (0, 0), "swish": (0, 0), "gelu": (0, 0), "gelu_tanh": (0, 0)}


def test_epilogue_table_covers_all_activations():
    assert set(EPILOGUES) == set(ACTIVATIONS)


# Each activation on two variants (rotating, so every variant meets several): the epilogue is
# one shared helper, and each (activation, precision) pair is a program PoCL must compile.
ROTATION = [(act, variant) for i, act in enumerate(sorted(EPILOGUES))
            for variant in (sorted(CASES)[i % len(CASES)], sorted(CASES)[(i + 2) % len(CASES)])]


@pytest.mark.parametrize("activation, variant", ROTATION)
def test_conv_epilogue(variant, activation):
    x_shape, m, k, group, attrs = CASES[variant][0]
    alpha, beta = EPILOGUES[activation]
    attrs = {**attrs, "activation": activation, "activation_alpha": alpha, "activation_beta": beta}
    x, consts, attrs = conv_case(x_shape, m, k, group, **attrs)
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, "fp32", kernel_id=f"gpu.onnx.Conv.{variant}")


@pytest.mark.parametrize("variant", sorted(CASES))
def test_conv_epilogue_fp16(variant):
    x_shape, m, k, group, attrs = CASES[variant][0]
    attrs = {**attrs, "activation": "hard_swish"}
    x, consts, attrs = conv_case(x_shape, m, k, group, **attrs)
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, "fp16", kernel_id=f"gpu.onnx.Conv.{variant}")


def test_conv_auto_pad_same():
    x, consts, attrs = conv_case((1, 5, 7, 8), 6, (3, 3), strides=[2, 2], auto_pad="SAME_UPPER")
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    for variant in ("3x3", "generic"):
        check_gpu(graph, node, {"x": x}, "fp32", kernel_id=f"gpu.onnx.Conv.{variant}")


def _fits(graph, node) -> set[str]:
    return {k.variant for k in gpu_kernels_for(node.op_type) if k.check(node, graph) is None}


def test_conv_checks():
    x, consts, attrs = conv_case((1, 8, 9, 9), 8, (3, 3))
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    assert _fits(graph, node) == {"3x3", "winograd", "generic"}
    graph, node = ir_graph("Conv", {"x": x}, *conv_case((1, 8, 9, 9), 8, (1, 1))[1:])
    assert _fits(graph, node) == {"1x1", "generic"}
    graph, node = ir_graph("Conv", {"x": x}, *conv_case((1, 8, 9, 9), 8, (3, 3), 8)[1:])
    assert _fits(graph, node) == {"depthwise", "generic"}
    # A runtime weight: nothing fits, and the reason says why.
    graph, node = ir_graph("Conv", {"x": x, "w": consts["w"]}, {}, {})
    assert "not a constant" in get_gpu_kernel("gpu.onnx.Conv.generic").check(node, graph)


def test_conv_selection_by_cost():
    def best(x_shape, m, k, group=1, **attrs):
        x, consts, attrs = conv_case(x_shape, m, k, group, **attrs)
        graph, node = ir_graph("Conv", {"x": np.zeros(x_shape, np.float32)}, consts, attrs)
        return OPENCL.select_kernel(node, graph).rsplit(".", 1)[1]

    assert best((1, 3, 8, 8), 8, (3, 3), pads=[1, 1, 1, 1]) == "3x3"
    assert best((1, 64, 28, 28), 64, (3, 3), pads=[1, 1, 1, 1]) == "winograd"
    assert best((1, 16, 8, 8), 16, (1, 1)) == "1x1"
    assert best((1, 16, 8, 8), 16, (3, 3), 16, pads=[1, 1, 1, 1]) == "depthwise"
    assert best((1, 16, 8, 8), 16, (3, 3), 4, pads=[1, 1, 1, 1]) == "generic"


# --------------------------------------------------------------------------- 1-D (rank 3)
# name -> (x shape [N, C, L], M, kernel, group, attrs): plain, strided, padded, dilated, grouped
CASES_1D = {
    "generic": (((2, 5, 17), 7, (3,), 1, {}),
                ((1, 6, 20), 9, (5,), 1, {"strides": [2], "pads": [2, 1]}),
                ((1, 3, 19), 4, (3,), 1, {"dilations": [3], "pads": [3, 2]}),
                ((2, 6, 11), 9, (3,), 3, {"pads": [1, 1]}),  # 3 groups of 2 -> 3
                ((1, 4, 15), 5, (4,), 1, {"strides": [3], "auto_pad": "SAME_UPPER"})),
    "depthwise": (((2, 6, 13), 6, (3,), 6, {"pads": [1, 1]}),
                  ((1, 5, 21), 5, (5,), 5, {"strides": [2], "dilations": [2], "pads": [4, 3]}),
                  ((1, 3, 9), 6, (3,), 3, {"pads": [0, 2]})),  # channel multiplier 2
    "1x1": (((2, 9, 10), 6, (1,), 1, {}),
            ((1, 5, 11), 7, (1,), 1, {"strides": [2]})),
}
PARAMS_1D = [(v, i) for v, cases in CASES_1D.items() for i in range(len(cases))]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("variant, index", PARAMS_1D)
def test_conv1d_variant(variant, index, precision):
    x_shape, m, k, group, attrs = CASES_1D[variant][index]
    x, consts, attrs = conv_case(x_shape, m, k, group, bias=index != 1, **attrs)
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, precision, kernel_id=f"gpu.onnx.Conv.{variant}")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("variant, activation", [("generic", "relu"), ("depthwise", "hard_swish"),
                                                 ("1x1", "clip"), ("generic", "sigmoid")])
def test_conv1d_epilogue(variant, activation, precision):
    x_shape, m, k, group, attrs = CASES_1D[variant][-1]
    alpha, beta = EPILOGUES[activation]
    attrs = {**attrs, "activation": activation, "activation_alpha": alpha, "activation_beta": beta}
    x, consts, attrs = conv_case(x_shape, m, k, group, **attrs)
    graph, node = ir_graph("Conv", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, precision, kernel_id=f"gpu.onnx.Conv.{variant}")


def test_conv1d_checks():
    """Which variants take a 1-D conv, and what is refused with a reason (never run wrong)."""
    x = rand(1, 8, 12)

    def fits(m, k, group=1, **attrs):
        graph, node = ir_graph("Conv", {"x": x}, *conv_case(x.shape, m, k, group, **attrs)[1:])
        return _fits(graph, node)

    assert fits(8, (3,), pads=[1, 1]) == {"generic"}  # a 1x3 window: not 3x3, not winograd
    assert fits(8, (3,), 8) == {"depthwise", "generic"}
    assert fits(8, (1,)) == {"1x1", "generic"}
    assert fits(8, (1,), strides=[2]) == {"1x1", "generic"}  # the row stride is unused (one row)
    assert fits(8, (1,), strides=[3]) == {"generic"}
    assert fits(8, (1,), pads=[1, 0]) == {"generic"}
    generic = get_gpu_kernel("gpu.onnx.Conv.generic")
    # the weight's rank must match the input's: a 2-D weight on a 1-D input is not a 1-D conv
    graph, node = ir_graph("Conv", {"x": x}, {"w": rand(4, 8, 3)}, {})
    graph.initializers["w"] = rand(4, 8, 1, 3)
    assert "rank 4" in generic.check(node, graph)
    # kernel_shape of the wrong length
    graph, node = ir_graph("Conv", {"x": x}, {"w": rand(4, 8, 3)}, {"kernel_shape": [3], "pads": [1, 1]})
    node.attrs["kernel_shape"] = [1, 3]
    assert "geometry" in generic.check(node, graph)
    # 3-D convolutions have no GPU kernel
    x5 = rand(1, 4, 3, 5, 5)
    graph, node = ir_graph("Conv", {"x": x5}, {"w": rand(4, 4, 3, 3, 3)}, {})
    assert "rank 5" in generic.check(node, graph)


def test_conv1d_selection_by_cost():
    def best(x_shape, m, k, group=1, **attrs):
        x, consts, attrs = conv_case(x_shape, m, k, group, **attrs)
        graph, node = ir_graph("Conv", {"x": np.zeros(x_shape, np.float32)}, consts, attrs)
        return OPENCL.select_kernel(node, graph).rsplit(".", 1)[1]

    assert best((1, 80, 200), 64, (3,), pads=[1, 1]) == "generic"  # Whisper's conv stem
    assert best((1, 16, 64), 16, (1,)) == "1x1"
    assert best((1, 16, 64), 16, (5,), 16, pads=[2, 2]) == "depthwise"
    # An STFT front end: one input channel, 402 outputs, a 400-tap window every 160 samples.  It is
    # "depthwise" with a channel multiplier of 402, which the depthwise kernel reads four times over:
    # 0.98 ms against generic's 0.22 ms on an H100 (docs/benchmarks-gpu.md)
    assert best((1, 1, 16000), 402, (400,), strides=[160]) == "generic"
    assert best((1, 8, 64), 16, (5,), 8, pads=[2, 2]) == "generic"  # multiplier 2


TRANSPOSE_CASES = [
    ((2, 5, 4, 5), 7, 1, {"strides": [2, 2], "pads": [1, 0, 1, 1], "output_padding": [1, 0]}),
    ((1, 3, 5, 4), 6, 1, {"pads": [1, 1, 1, 1]}),
    ((1, 6, 4, 3), 6, 2, {"strides": [2, 1], "dilations": [1, 2]}),  # 2 groups of 3 -> 3
    ((1, 4, 3, 3), 5, 1, {"strides": [3, 2], "output_shape": [9, 7], "activation": "relu"}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("index", range(len(TRANSPOSE_CASES)))
def test_conv_transpose(index, precision):
    x_shape, m, group, attrs = TRANSPOSE_CASES[index]
    x = rand(*x_shape)
    consts = {"w": rand(x_shape[1], m // group, 3, 3, scale=0.5), "b": rand(m)}
    attrs = {**attrs, "group": group}
    if "activation" in attrs and precision == "fp16":
        attrs.pop("activation")
    graph, node = ir_graph("ConvTranspose", {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, precision, kernel_id="gpu.onnx.ConvTranspose.gather")


TRANSPOSE_1D_CASES = [
    ((2, 5, 7), 6, 1, 3, {"strides": [2], "pads": [1, 0], "output_padding": [1]}),
    ((1, 6, 5), 4, 2, 4, {"strides": [3], "dilations": [2], "activation": "relu"}),  # 2 groups of 3 -> 2
    ((1, 4, 6), 3, 1, 3, {"strides": [2], "output_shape": [12], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("index", range(len(TRANSPOSE_1D_CASES)))
def test_conv_transpose1d(index, precision):
    x_shape, m, group, k, attrs = TRANSPOSE_1D_CASES[index]
    x = rand(*x_shape)
    consts = {"w": rand(x_shape[1], m // group, k, scale=0.5), "b": rand(m)}
    graph, node = ir_graph("ConvTranspose", {"x": x}, consts, {**attrs, "group": group})
    check_gpu(graph, node, {"x": x}, precision, kernel_id="gpu.onnx.ConvTranspose.gather")


def test_conv_transpose_checks():
    generic = get_gpu_kernel("gpu.onnx.ConvTranspose.gather")
    graph, node = ir_graph("ConvTranspose", {"x": rand(1, 4, 6)}, {"w": rand(4, 3, 3)}, {})
    graph.initializers["w"] = rand(4, 3, 1, 3)
    assert "rank 4" in generic.check(node, graph)
    graph, node = ir_graph("ConvTranspose", {"x": rand(1, 4, 2, 3, 3)}, {"w": rand(4, 3, 2, 2, 2)}, {})
    assert "rank 5" in generic.check(node, graph)
