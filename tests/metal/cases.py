"""Representative nodes for every GPU kernel, to run through the Metal shim.

The case tables of the OpenCL tests (``tests/gpu``) are reused where they are module constants,
so a shape or attribute combination the OpenCL kernels are checked on is checked on the Metal
rendering too; the rest are listed here.  Every registered GPU kernel (the Upload / Download
copies aside), every kernel entry, every unary / binary op and every fused epilogue appears.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optcli.gpu.ops_elementwise import BINARY_CODES, UNARY_CODES
from tests.gpu import (
    test_conv,
    test_elementwise,
    test_gemm,
    test_matmul,
    test_norm,
    test_pool,
    test_recurrent,
    test_resize,
    test_tensor,
)
from tests.gpu.harness import one_node_graph
from tests.gpu.test_conv import EPILOGUES, conv_case, ir_graph

RNG = np.random.default_rng(11)
I64, F32 = np.int64, np.float32


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[], tuple]  # -> (graph, node, inputs, kernel id or None)


def _r(*shape, positive=False, scale=1.0):
    x = (RNG.standard_normal(shape) * scale).astype(F32)
    return np.abs(x) + F32(0.5) if positive else x


def _onnx(op, inputs, consts=None, attrs=None, kid=None, **kw):
    def build():
        graph, node = one_node_graph(op, inputs, consts, attrs, **kw)
        return graph, node, inputs, kid
    return build


def _ir(op, inputs, consts, attrs, kid=None, **kw):
    def build():
        graph, node = ir_graph(op, inputs, consts, attrs, **kw)
        return graph, node, inputs, kid
    return build


def _epilogue(name: str) -> dict:
    alpha, beta = EPILOGUES[name]
    return {"activation": name, "activation_alpha": alpha, "activation_beta": beta}


# A FakeQuant fused after the epilogue, checked on integer data: sums of small integers are exact
# in half and float alike, and an integer over 3 is never a rounding tie, so fp16 storage
# cannot flip a step.
FAKE_QUANT = {"activation_quant": [3.0, 3.0, 0.0, 255.0]}


def _ints(*arrays):
    return [np.round(a * 1.5).astype(F32) for a in arrays]


def _cases() -> list[Case]:
    out: list[Case] = []
    x = _r(2, 6, 5, 7, scale=3.0)
    # ---- stand-alone activations (map4 + every epilogue), Clip with an open upper bound
    for op, attrs, consts in [("Relu", {}, {}), ("Sigmoid", {}, {}), ("Tanh", {}, {}), ("HardSwish", {}, {}),
                              ("LeakyRelu", {"alpha": 0.1}, {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}),
                              ("Clip", {}, {"lo": np.array(-1.0, F32), "hi": np.array(6.0, F32)}),
                              ("Clip", {}, {"lo": np.array(-1.0, F32)})]:
        out.append(Case(f"act-{op}-{len(consts)}", _onnx(op, {"x": x}, consts, attrs)))
    out.append(Case("act-Swish", _onnx("Swish", {"x": x[:, :, 0]}, domain="optcli")))
    # ---- unary maths
    for op in UNARY_CODES:
        u = _r(2, 6, 3, 5, positive=op in ("Sqrt", "Log", "Reciprocal"))
        if op in ("Floor", "Ceil"):  # quarters: half stores them exactly, no input crosses an integer
            u = np.round(u * 4) / 4 + F32(0.25)
        attrs = {"approximate": "none"} if op == "Gelu" else None
        out.append(Case(f"unary-{op}", _onnx(op, {"x": u}, attrs=attrs, opset=20 if op == "Gelu" else 17)))
    # ---- binary ops: same shape, broadcasts (OpenCL table), fused epilogues
    for op in BINARY_CODES:
        if op in ("PRelu", "And"):
            continue
        a, b = _r(2, 6, 3, 4), _r(2, 6, 1, 1, positive=op == "Div")
        out.append(Case(f"binary-{op}-bcast", _onnx(op, {"a": a, "b": b})))
        b2 = _r(2, 6, 3, 4, positive=op == "Div")
        out.append(Case(f"binary-{op}-same", _onnx(op, {"a": a, "b": b2})))
    for k, (a_shape, b_shape, const) in enumerate(test_elementwise.BROADCASTS):
        a, b = _r(*a_shape), _r(*b_shape)
        inputs, consts = ({"a": a}, {"b": b}) if const else ({"a": a, "b": b}, {})
        out.append(Case(f"add-broadcast-{k}", _onnx("Add", inputs, consts)))
    for k, act in enumerate(sorted(EPILOGUES)):
        op = ("Add", "Sub", "Mul")[k % 3]
        a, b = _r(2, 5, 3, 3), _r(5, 1, 1)
        out.append(Case(f"binary-{op}-{act}", _ir(op, {"a": a}, {"b": b}, _epilogue(act))))
    a, b = _ints(_r(2, 5, 3, 3, scale=4.0), _r(5, 1, 1, scale=4.0))
    out.append(Case("binary-Add-relu-fakequant", _ir("Add", {"a": a}, {"b": b}, {**_epilogue("relu"), **FAKE_QUANT})))
    out.append(Case("prelu", _onnx("PRelu", {"x": _r(2, 5, 3, 4)}, {"s": _r(5, 1, 1)})))
    bools = RNG.random((2, 5, 3, 4)) > 0.5
    out.append(Case("and", _onnx("And", {"a": bools, "b": RNG.random((2, 5, 3, 4)) > 0.3})))
    # ---- conv family: every OpenCL case, and every epilogue on two variants
    for variant, cases in test_conv.CASES.items():
        for k, (x_shape, m, kern, group, attrs) in enumerate(cases):
            xc, consts, attrs = conv_case(x_shape, m, kern, group, bias=k != 1, **attrs)
            out.append(Case(f"conv-{variant}-{k}", _ir("Conv", {"x": xc}, consts, attrs, f"gpu.onnx.Conv.{variant}")))
    for act, variant in test_conv.ROTATION:
        x_shape, m, kern, group, attrs = test_conv.CASES[variant][0]
        xc, consts, attrs = conv_case(x_shape, m, kern, group, **{**attrs, **_epilogue(act)})
        out.append(Case(f"conv-{variant}-{act}", _ir("Conv", {"x": xc}, consts, attrs, f"gpu.onnx.Conv.{variant}")))
    for act in sorted(EPILOGUES):  # the three winograd launches carry the epilogue define too
        if (act, "winograd") not in test_conv.ROTATION:
            x_shape, m, kern, group, attrs = test_conv.CASES["winograd"][2]
            xc, consts, attrs = conv_case(x_shape, m, kern, group, **{**attrs, **_epilogue(act)})
            out.append(Case(f"conv-winograd-{act}", _ir("Conv", {"x": xc}, consts, attrs, "gpu.onnx.Conv.winograd")))
    for variant in ("1x1", "depthwise", "winograd"):
        x_shape, m, kern, group, attrs = test_conv.CASES[variant][0]
        xc, consts, attrs = conv_case(x_shape, m, kern, group, **{**attrs, **_epilogue("relu"), **FAKE_QUANT})
        xc, *values = _ints(xc, *consts.values())
        out.append(Case(f"conv-{variant}-fakequant", _ir("Conv", {"x": xc}, dict(zip(consts, values)), attrs,
                                                          f"gpu.onnx.Conv.{variant}")))
    for variant, cases in test_conv.CASES_1D.items():  # 1-D convs: rank 3 packed as H = 1
        for k, (x_shape, m, kern, group, attrs) in enumerate(cases):
            xc, consts, attrs = conv_case(x_shape, m, kern, group, bias=k != 1, **attrs)
            out.append(Case(f"conv1d-{variant}-{k}", _ir("Conv", {"x": xc}, consts, attrs,
                                                         f"gpu.onnx.Conv.{variant}")))
    for k, (x_shape, m, group, kern, attrs) in enumerate(test_conv.TRANSPOSE_1D_CASES):
        consts = {"w": _r(x_shape[1], m // group, kern, scale=0.5), "b": _r(m)}
        out.append(Case(f"conv-transpose1d-{k}", _ir("ConvTranspose", {"x": _r(*x_shape)}, consts,
                                                     {**attrs, "group": group})))
    xt = _r(1, 4, 4, 5)
    out.append(Case("conv-transpose", _ir("ConvTranspose", {"x": xt}, {"w": _r(4, 3, 3, 3), "b": _r(3)},
                                          {"strides": [2, 2], "pads": [1, 0, 1, 1], **_epilogue("relu")})))
    out.append(Case("conv-transpose-group", _ir("ConvTranspose", {"x": _r(1, 6, 3, 4)}, {"w": _r(6, 2, 2, 3)},
                                                {"group": 2, "strides": [1, 2]})))
    # ---- gemm family
    for x_shape, n in [((5, 7), 6), ((2, 5, 7), 6), ((2, 3, 5, 9), 3)]:
        xm = _r(*x_shape)
        out.append(Case(f"matmul-{len(x_shape)}d", _ir("MatMul", {"x": xm}, {"w": _r(x_shape[-1], n)}, {})))
    for k, (a_shape, b_shape) in enumerate(test_matmul.CASES):  # two run-time operands: heads / batched
        out.append(Case(f"matmul-runtime-{k}", _onnx("MatMul", {"a": _r(*a_shape), "b": _r(*b_shape)})))
    for k, (attrs, c_shape) in enumerate(test_gemm.GEMM_CASES):
        b = _r(6, 7) if attrs.get("transB") else _r(7, 6)
        consts = {"b": b, **({"c": _r(*c_shape)} if c_shape is not None else {})}
        out.append(Case(f"gemm-{k}", _ir("Gemm", {"a": _r(5, 7)}, consts, attrs)))
    for act in sorted(EPILOGUES):
        for x_shape in ((6, 9), (2, 5, 9)):
            out.append(Case(f"fc-{act}-{len(x_shape)}d", _ir("FullyConnected", {"x": _r(*x_shape)},
                                                            {"w": _r(9, 7), "b": _r(7)}, _epilogue(act),
                                                            domain="optcli")))
    xf, wf, bf = _ints(_r(6, 9), _r(9, 7), _r(7))
    out.append(Case("fc-fakequant", _ir("FullyConnected", {"x": xf}, {"w": wf, "b": bf}, dict(FAKE_QUANT),
                                        domain="optcli")))
    c = 5
    out.append(Case("batchnorm", _ir("BatchNormalization", {"x": _r(2, c, 4, 3)},
                                     {"s": _r(c), "b": _r(c), "mean": _r(c), "var": np.abs(_r(c)) + F32(0.1)},
                                     {"epsilon": 1e-3})))
    out.append(Case("channel-affine", _ir("ChannelAffine", {"x": _r(2, 7, 3, 5)}, {"s": _r(7), "t": _r(7)},
                                          _epilogue("hard_sigmoid"), domain="optcli", input_names=["x", "s", "t"])))
    for k, (x_shape, axis, s_shape, b_shape) in enumerate(test_norm.LAYER_CASES):
        consts = {"s": _r(*s_shape), **({"b": _r(*b_shape)} if b_shape else {})}
        out.append(Case(f"layernorm-{k}", _onnx("LayerNormalization", {"x": _r(*x_shape, scale=2.0)}, consts,
                                                {"axis": axis})))
    for x_shape in ((2, 6, 17), (1, 3, 4, 5)):
        out.append(Case(f"instancenorm-{len(x_shape)}d", _onnx("InstanceNormalization", {"x": _r(*x_shape, scale=3.0)},
                                                               {"s": _r(x_shape[1]), "b": _r(x_shape[1])})))
    # ---- pooling, reductions, softmax, resize, data movement, recurrent layers
    for k, (op, attrs) in enumerate(test_pool.CASES):
        out.append(Case(f"pool-{op}-{k}", _onnx(op, {"x": test_pool.X}, attrs=attrs,
                                                opset=19 if "dilations" in attrs else 17)))
    for k, (op, attrs) in enumerate(test_pool.CASES_1D):
        out.append(Case(f"pool1d-{op}-{k}", _onnx(op, {"x": test_pool.X1}, attrs=attrs,
                                                  opset=19 if "dilations" in attrs else 17)))
    out.append(Case("pool-GlobalAveragePool-fakequant", _ir("GlobalAveragePool", {"x": _ints(test_pool.X)[0]}, {},
                                                            dict(FAKE_QUANT))))
    for op in ("ReduceMean", "ReduceMax", "ReduceSum", "ReduceMin"):
        for shape, axes, keep in [((2, 6, 3, 4), [2, 3], 1), ((2, 5, 3, 4), [1], 0), ((2, 5, 3, 4), [0, 3], 0),
                                  ((2, 3, 3, 4), None, 0)]:
            consts = {} if axes is None else {"axes": np.array(axes, I64)}
            out.append(Case(f"{op}-{shape}-{axes}-{keep}", _onnx(op, {"x": _r(*shape)}, consts, {"keepdims": keep},
                                                               opset=18)))
    for op in ("Softmax", "LogSoftmax"):
        for shape, axis in [((2, 10), -1), ((2, 5, 6), 1), ((2, 5, 3, 4), 2), ((2, 3, 3, 4), 0)]:
            out.append(Case(f"{op}-{shape}-{axis}", _onnx(op, {"x": _r(*shape, scale=3.0)}, attrs={"axis": axis})))
    for k, (attrs, consts) in enumerate(test_resize.CASES):
        out.append(Case(f"resize-{k}", _onnx("Resize", {"x": test_resize.X}, consts, attrs, opset=19,
                                             input_names=["x", *consts])))
    out.append(Case("upsample", _onnx("Upsample", {"x": test_resize.X}, {"s": np.array([1, 1, 2, 3], F32)},
                                      {"mode": "linear"}, opset=9)))
    for k, (op, xin, consts, attrs) in enumerate(test_tensor.CASES):
        out.append(Case(f"tensor-{op}-{k}", _onnx(op, {"x": xin}, consts, attrs)))
    out.append(Case("identity", _onnx("Identity", {"x": x})))
    concats = [([(2, 3, 4, 5), (2, 5, 4, 5), (2, 2, 4, 5)], 1), ([(2, 6, 4, 5), (2, 6, 1, 5)], 2),
               ([(1, 3, 4, 5), (2, 3, 4, 5)], 0)]
    for k, (shapes, axis) in enumerate(concats):
        inputs = {f"x{i}": _r(*s) for i, s in enumerate(shapes)}
        out.append(Case(f"concat-{k}", _onnx("Concat", inputs, attrs={"axis": axis})))
    out.append(Case("split", _onnx("Split", {"x": _r(2, 7, 3, 5)}, {"s": np.array([3, 4], I64)}, {"axis": 1},
                                   n_outputs=2)))
    for case in test_recurrent.CASES:
        if case.id in RECURRENT_CASES:
            out.append(Case(case.id, _recurrent(case)))
    out.append(Case("fake-quant", _fake_quant))
    return out


# The recurrent cases of tests/gpu/test_recurrent.py run here: every entry, cell, direction and
# layout, sequence_lens, peepholes, clip, the activations with alpha / beta and weights as data.
RECURRENT_CASES = ("lstm-forward", "lstm-layout1-bidirectional-lens", "lstm-activations-per-direction",
                   "lstm-input-forget", "lstm-data-weights", "gru-forward", "gru-layout1-lens",
                   "gru-clip-activations", "gru-data-weights", "rnn-bidirectional-lens")


def _recurrent(case):
    def build():
        graph, node, feeds = test_recurrent.node_of(case)
        return graph, node, feeds, None
    return build


def _fake_quant():
    from optcli.ir import Graph, Node, Value

    x = _r(2, 6, 3, 5, scale=2.0)
    node = Node("FakeQuant", ["x"], ["y0"], {"scale": 0.05, "zero_point": 3.0, "qmin": -128, "qmax": 127}, "n0",
                "optcli")
    graph = Graph("g", [node], [Value("x", "float32", x.shape)], [], {}, {}, {"": 17})
    graph.values = {"x": graph.inputs[0], "y0": Value("y0", "float32", x.shape)}
    graph.outputs = [graph.values["y0"]]
    return graph, node, {"x": x}, None


CASES = _cases()
