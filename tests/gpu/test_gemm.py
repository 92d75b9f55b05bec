"""Gemm, MatMul, FullyConnected, BatchNormalization and ChannelAffine GPU kernels against the
numpy reference, fp32 and fp16, with odd sizes, every left-operand rank and every epilogue."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import get_gpu_kernel
from tests.gpu.harness import check_gpu
from tests.gpu.test_conv import EPILOGUES, ir_graph

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


PRECISIONS = ["fp32", "fp16"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("x_shape, n", [((5, 7), 6), ((7,), 5), ((2, 5, 7), 6), ((2, 3, 5, 9), 3), ((1, 13), 1)])
def test_matmul(x_shape, n, precision):
    x = rand(*x_shape)
    graph, node = ir_graph("MatMul", {"x": x}, {"w": rand(x_shape[-1], n)}, {})
    check_gpu(graph, node, {"x": x}, precision, kernel_id="gpu.onnx.MatMul.default")


GEMM_CASES = [
    ({}, (6,)),
    ({"transB": 1, "alpha": 0.7, "beta": 1.3}, (1, 6)),
    ({"alpha": 2.0}, ()),
    ({"transB": 1, "beta": 0.5}, None),
]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("index", range(len(GEMM_CASES)))
def test_gemm(index, precision):
    attrs, c_shape = GEMM_CASES[index]
    a = rand(5, 7)
    b = rand(6, 7) if attrs.get("transB") else rand(7, 6)
    consts = {"b": b}
    if c_shape is not None:
        consts["c"] = rand(*c_shape)
    graph, node = ir_graph("Gemm", {"a": a}, consts, attrs)
    check_gpu(graph, node, {"a": a}, precision, kernel_id="gpu.onnx.Gemm.default")


def test_gemm_constant_left_operand():
    graph, node = ir_graph("Gemm", {}, {"a": rand(3, 5), "b": rand(5, 4)}, {})
    check_gpu(graph, node, {}, "fp32", kernel_id="gpu.onnx.Gemm.default")


@pytest.mark.parametrize("activation", sorted(EPILOGUES))
@pytest.mark.parametrize("x_shape", [(6, 9), (2, 5, 9)])
def test_fully_connected_epilogue(x_shape, activation):
    alpha, beta = EPILOGUES[activation]
    x = rand(*x_shape)
    attrs = {"activation": activation, "activation_alpha": alpha, "activation_beta": beta}
    graph, node = ir_graph("FullyConnected", {"x": x}, {"w": rand(9, 7), "b": rand(7)}, attrs, domain="optcli")
    check_gpu(graph, node, {"x": x}, "fp32", kernel_id="gpu.optcli.FullyConnected.default")


@pytest.mark.parametrize("x_shape", [(6, 9), (2, 5, 9)])
def test_fully_connected_fp16(x_shape):
    x = rand(*x_shape)
    graph, node = ir_graph("FullyConnected", {"x": x}, {"w": rand(9, 7), "b": rand(7)}, {}, domain="optcli")
    check_gpu(graph, node, {"x": x}, "fp16", kernel_id="gpu.optcli.FullyConnected.default")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("x_shape", [(2, 5, 4, 3), (3, 7), (2, 6, 5)])
def test_batch_normalization(x_shape, precision):
    c = x_shape[1]
    x = rand(*x_shape)
    consts = {"s": rand(c), "b": rand(c), "mean": rand(c), "var": np.abs(rand(c)) + 0.1}
    graph, node = ir_graph("BatchNormalization", {"x": x}, consts, {"epsilon": 1e-3})
    check_gpu(graph, node, {"x": x}, precision, kernel_id="gpu.onnx.BatchNormalization.default")


@pytest.mark.parametrize("activation, shift, precision, x_shape", [
    ("clip", True, "fp32", (2, 7, 3, 5)), ("hard_sigmoid", True, "fp32", (2, 7, 3, 5)),
    (None, False, "fp32", (2, 7, 3, 5)), (None, True, "fp16", (2, 7, 3, 5)),
    ("relu", True, "fp32", (2, 7, 9)), ("relu", True, "fp16", (2, 7, 9))])  # rank 3: a sequence [N, C, L]
def test_channel_affine(activation, shift, precision, x_shape):
    x = rand(*x_shape)
    consts = {"s": rand(7)}
    names = ["x", "s", "t" if shift else ""]
    if shift:
        consts["t"] = rand(7)
    attrs = {}
    if activation:
        alpha, beta = EPILOGUES[activation]
        attrs = {"activation": activation, "activation_alpha": alpha, "activation_beta": beta}
    graph, node = ir_graph("ChannelAffine", {"x": x}, consts, attrs, domain="optcli", input_names=names)
    check_gpu(graph, node, {"x": x}, precision, kernel_id="gpu.optcli.ChannelAffine.default")


def _reason(graph, node) -> str | None:
    kern = get_gpu_kernel(f"gpu.{node.domain or 'onnx'}.{node.op_type}.default")  # the constant-weight kernel
    return kern.check(node, graph)


def test_checks_reject():
    a = rand(4, 6)
    graph, node = ir_graph("MatMul", {"a": a, "b": rand(6, 3)}, {}, {})
    assert "not a constant" in _reason(graph, node)
    graph, node = ir_graph("Gemm", {"a": a}, {"b": rand(4, 3)}, {"transA": 1})
    assert "transA" in _reason(graph, node)
    graph, node = ir_graph("Gemm", {"a": a}, {"b": rand(6, 3), "c": rand(4, 3)}, {})
    assert "row vector" in _reason(graph, node)
    graph, node = ir_graph("MatMul", {"a": rand(2, 4, 6)}, {"b": rand(2, 6, 3)}, {})
    assert "2-D" in _reason(graph, node)
    x = rand(2, 3, 4, 4)
    consts = {"s": rand(3), "b": rand(3), "mean": rand(3), "var": np.abs(rand(3))}
    graph, node = ir_graph("BatchNormalization", {"x": x, "s": consts.pop("s")}, consts, {},
                           input_names=["x", "s", "b", "mean", "var"])
    assert "not a constant" in _reason(graph, node)
