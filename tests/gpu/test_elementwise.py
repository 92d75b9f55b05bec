"""Element-wise GPU kernels (binary with broadcasting, PRelu, unary maths) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph, run_gpu

RNG = np.random.default_rng(1)


def _r(*shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


# (a shape, b shape, b constant?)
BROADCASTS = [
    ((2, 5, 3, 4), (2, 5, 3, 4), False),   # same shape
    ((2, 6, 3, 4), (6, 1, 1), True),       # per-channel constant [C,1,1]
    ((2, 6, 3, 4), (1, 6, 1, 1), False),   # per-channel runtime [1,C,1,1]
    ((2, 5, 3, 4), (2, 5, 1, 1), False),   # squeeze-excite gate [N,C,1,1]
    ((2, 3, 3, 4), (), True),              # scalar constant
    ((2, 3, 3, 4), (1,), False),           # size-1 runtime
    ((2, 7), (7,), True),                  # rank 2, [C]
    ((2, 7), (7,), False),
    ((2, 5, 6), (2, 5, 1), False),         # rank 3
    ((2, 5, 6), (5, 1), True),             # rank 3 [N, C, L], per-channel constant [C, 1]
    ((2, 5, 6), (6,), True),               # rank 3, per-position constant [L]
    ((2, 5, 6), (1, 5, 6), False),         # rank 3, runtime, batch broadcast
    ((2, 5, 6), (1, 1, 6), False),         # rank 3, runtime [1, 1, L]
    ((2, 5, 3, 4), (1, 1, 3, 4), True),    # spatial-only constant
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("a_shape, b_shape, const", BROADCASTS)
def test_add_broadcast(a_shape, b_shape, const, precision):
    a, b = _r(*a_shape), _r(*b_shape)
    inputs, consts = ({"a": a}, {"b": b}) if const else ({"a": a, "b": b}, {})
    graph, node = one_node_graph("Add", inputs, consts)
    check_gpu(graph, node, inputs, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["Sub", "Mul", "Div", "Max", "Min"])
def test_binary_ops(op, precision):
    a, b = _r(2, 6, 3, 4), _r(2, 6, 1, 1, positive=op == "Div")
    # b first: the broadcast operand may be either one
    graph, node = one_node_graph(op, {"b": b, "a": a})
    check_gpu(graph, node, {"b": b, "a": a}, precision)
    graph, node = one_node_graph(op, {"a": a, "b": b})
    check_gpu(graph, node, {"a": a, "b": b}, precision)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_fused_epilogue(op):
    a, b = _r(2, 5, 3, 3), _r(5, 1, 1)
    graph, node = one_node_graph(op, {"a": a}, {"b": b})
    node.attrs.update(activation="sigmoid")
    check_gpu(graph, node, {"a": a})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("slope_shape", [(5, 1, 1), (1,)])
def test_prelu(slope_shape, precision):
    x, slope = _r(2, 5, 3, 4), _r(*slope_shape)
    graph, node = one_node_graph("PRelu", {"x": x}, {"s": slope})
    check_gpu(graph, node, {"x": x}, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["Exp", "Neg", "Abs", "Sqrt", "Log", "Reciprocal", "Erf", "Softplus", "Floor", "Ceil",
                                "Gelu"])
def test_unary(op, precision):
    x = _r(2, 6, 3, 5, positive=op in ("Sqrt", "Log", "Reciprocal"))
    if op in ("Floor", "Ceil") and precision == "fp16":
        # Floor and Ceil are discontinuous: feed values half stores exactly (quarters), so storage
        # cannot move an input across an integer.
        x = np.round(x * 4) / 4 + np.float32(0.25)
    graph, node = one_node_graph(op, {"x": x}, opset=20 if op == "Gelu" else 17)
    check_gpu(graph, node, {"x": x}, precision)


def test_unary_rank2():
    x = _r(2, 7)
    graph, node = one_node_graph("Exp", {"x": x})
    check_gpu(graph, node, {"x": x})


def _check(op, graph, node):
    return gpu_kernels_for(op)[0].check(node, graph)


def test_rejects():
    x = _r(2, 6, 3, 4)
    graph, node = one_node_graph("Add", {"x": x, "b": _r(6, 1, 1)})
    assert "broadcast pattern" in _check("Add", graph, node)
    # rank 3: a runtime [C, 1] packs C as N (rank 2), not as the output's channels: refused
    graph, node = one_node_graph("Mul", {"x": _r(2, 6, 5), "b": _r(6, 1)})
    assert "broadcast pattern" in _check("Mul", graph, node)
    graph, node = one_node_graph("Max", {"x": x, "y": x, "z": x})
    assert "3 inputs" in _check("Max", graph, node)
    graph, node = one_node_graph("Add", {"x": x, "y": x})
    graph.values[node.outputs[0]].dtype = "float64"
    assert "takes float32 tensors" in _check("Add", graph, node)
    graph, node = one_node_graph("Add", {"x": x.reshape(2, 6, 3, 4, 1), "y": x.reshape(2, 6, 3, 4, 1)})
    assert "rank 5" in _check("Add", graph, node)


# --------------------------------------------------------------------------- padding lanes
def _raw_outputs(graph, node, inputs):
    """Run a node's GPU kernel with its outputs pre-filled with garbage; the raw packed data."""
    from optcli.gpu.layout import pack, packed_elements
    from optcli.runtime.opencl.device import ClLaunchContext, cl
    from tests.gpu.harness import device

    dev = device()
    kern = next(k for k in gpu_kernels_for(node.op_type, node.domain) if k.check(node, graph) is None)
    shapes = {n: tuple(graph.shape_of(n)) for n in [*node.inputs, *node.outputs] if n and n not in graph.initializers}
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    buffers = {n: cl.Buffer(dev.context, flags, hostbuf=pack(x)) for n, x in inputs.items()}
    for n in node.outputs:
        buffers[n] = cl.Buffer(dev.context, flags, hostbuf=np.full(packed_elements(shapes[n]), 7.0, np.float32))
    ctx = ClLaunchContext(dev, shapes, dict(graph.initializers), buffers)
    for launch in kern.launch(ctx, node):
        ctx.bind(launch, node.name).enqueue(dev.queue)
    out = []
    for n in node.outputs:
        host = np.empty(packed_elements(shapes[n]), np.float32)
        cl.enqueue_copy(dev.queue, host, buffers[n])
        out.append((host, shapes[n]))
    dev.queue.finish()
    return out


PADDED = [  # every kernel family on channel counts that leave padding lanes
    ("Exp", {"x": _r(2, 5, 2, 3)}, {}, {}),
    ("Add", {"x": _r(2, 5, 2, 3)}, {"b": np.array(1.5, np.float32)}, {}),
    ("Div", {"x": _r(2, 5, 2, 3), "y": _r(2, 5, 2, 3)}, {}, {}),
    ("AveragePool", {"x": _r(2, 5, 4, 4)}, {}, {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1],
                                                 "count_include_pad": 1}),
    ("Concat", {"x": _r(2, 3, 2, 2), "y": _r(2, 2, 2, 2)}, {}, {"axis": 1}),
    ("Pad", {"x": _r(2, 3, 2, 2)}, {"p": np.array([0, 1, 0, 0, 0, 1, 1, 1], np.int64),
                                    "v": np.array(2.0, np.float32)}, {}),
    ("Transpose", {"x": _r(2, 3, 5, 2)}, {}, {"perm": [0, 2, 3, 1]}),
    ("Reshape", {"x": _r(2, 6, 5)}, {"s": np.array([2, 5, 6], np.int64)}, {}),
    ("Softmax", {"x": _r(2, 5, 3)}, {}, {"axis": 2}),
    ("Softmax", {"x": _r(2, 5)}, {}, {"axis": 1}),
    ("ReduceMean", {"x": _r(2, 5, 2, 3)}, {"a": np.array([1], np.int64)}, {"keepdims": 0}),
    ("ReduceSum", {"x": _r(2, 5, 2, 3)}, {"a": np.array([3], np.int64)}, {"keepdims": 0}),
]


@pytest.mark.parametrize("case", range(len(PADDED)))
def test_padding_lanes_are_zero(case):
    from optcli.gpu.layout import c4, dims4

    op, inputs, consts, attrs = PADDED[case]
    graph, node = one_node_graph(op, inputs, consts, attrs, opset=18)
    for host, shape in _raw_outputs(graph, node, inputs):
        n, c, h, w = dims4(shape)
        lanes = host.reshape(n, c4(c), h, w, 4).transpose(0, 1, 4, 2, 3).reshape(n, c4(c) * 4, h, w)
        assert np.all(lanes[:, c:] == 0), f"{op}: padding lanes {np.unique(lanes[:, c:])}"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_and_on_bool_tensors(precision):
    x = _r(2, 6, 3, 4)
    p, q = x > 0, x < 0.5
    graph, node = one_node_graph("And", {"p": p, "q": q})
    out = run_gpu(graph, node, {"p": p, "q": q}, precision)[0]
    np.testing.assert_array_equal(out != 0, p & q)


def test_and_end_to_end_returns_bool():
    from onnx import TensorProto, helper

    import optcli

    g = helper.make_graph([helper.make_node("And", ["p", "q"], ["y"])], "g",
                          [helper.make_tensor_value_info(n, TensorProto.BOOL, [2, 5, 3]) for n in "pq"],
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    result = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"})
    assert [s["target"] for s in result.report["steps"] if s["op"] == "And"] == ["opencl"]
    p, q = _r(2, 5, 3) > 0, _r(2, 5, 3) > 0.3
    y = optcli.load(result.data, require_gpu=True).run({"p": p, "q": q})["y"]
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, p & q)
