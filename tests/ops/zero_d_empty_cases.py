"""Input recipes for tests/ops/test_zero_d_and_empty.py: every registered host kernel on 0-d
inputs and on empty inputs (a dim of 0), wherever the ONNX op allows them.

One table, keyed by the registry's (domain, op_type):

* ``CASES``: the recipes.  A case's label starts with ``0-d`` (a rank-0 input, or a rank-0
  output from non-scalar inputs) or ``empty`` (some input or output has a dim of 0).
* ``NO_ZERO_D`` / ``NO_EMPTY``: ops with no case of that kind, and why the ONNX op rules it out.
* ``NOT_APPLICABLE``: registered ops with no recipe at all, and why.

A newly registered kernel fails ``test_every_registered_op_has_recipes`` until it is given cases
or listed here with a reason.  Cases compare with onnxruntime; a case whose ``onnx_reference``
names a reason compares with ``onnx.reference`` instead (onnxruntime refuses that input, or gets
it wrong; the reasons were checked against onnxruntime 1.32), and ops outside the ONNX domains
(``optcli.*``) name an ``equivalent`` ONNX subgraph to run there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(20240610)
I64 = np.int64
U8 = np.uint8
MS = "com.microsoft"
OPTCLI = "optcli"

# (node input names, output names) -> (nodes, extra initializers) computing the same outputs.
Equivalent = Callable[[list[str], list[str]], tuple[list, dict[str, np.ndarray]]]


@dataclass
class Case:
    label: str
    inputs: list  # positional node inputs; None is an absent optional input
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    n_outputs: int = 1
    onnx_reference: str = ""  # non-empty: why onnxruntime cannot be the reference here
    equivalent: Equivalent | None = None


CASES: dict[tuple[str, str], list[Case]] = {}


def add(op: str, *cases: Case, domain: str = "") -> None:
    CASES.setdefault((domain, op), []).extend(cases)


def f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.asarray(RNG.uniform(lo, hi, size=shape)).astype(np.float32)


def ints(*values: int, dtype=I64) -> np.ndarray:
    return np.array(values, dtype=dtype)


def scalar(value, dtype=np.float32) -> np.ndarray:
    return np.array(value, dtype=dtype)


def q8(*shape: int, dtype=U8) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def boolean(*shape: int) -> np.ndarray:
    return np.asarray(RNG.random(shape) > 0.5)


# ----------------------------------------------------------------------------- element-wise

UNARY_FLOAT = {
    "Abs": {}, "Ceil": {}, "Cos": {}, "Erf": {}, "Exp": {}, "Floor": {}, "Log": {}, "Neg": {},
    "Reciprocal": {}, "Round": {}, "Sign": {}, "Sin": {}, "Sqrt": {}, "Tanh": {}, "Sigmoid": {}, "Relu": {},
    "Softplus": {}, "Softsign": {}, "Elu": {}, "Selu": {}, "ThresholdedRelu": {"alpha": 0.5},
    "LeakyRelu": {}, "HardSigmoid": {}, "IsNaN": {}, "IsInf": {}, "Identity": {},
}
for _op, _attrs in UNARY_FLOAT.items():
    # 0-d values on both sides of zero: the positive one exercises Log/Sqrt, the negative one the
    # branchy activations.
    add(_op, Case("0-d negative", [scalar(-0.75)], _attrs), Case("0-d positive", [scalar(1.25)], _attrs),
        Case("empty", [f(2, 0, 3)], _attrs))
for _op, _opset in [("Celu", 12), ("HardSwish", 14), ("Gelu", 20), ("Swish", 24)]:
    add(_op, Case("0-d", [scalar(-0.75)], opset=_opset), Case("empty", [f(0, 3)], opset=_opset))
for _op in ["Abs", "Neg", "Sign", "Identity"]:
    add(_op, Case("0-d int64", [scalar(-3, I64)]), Case("empty int32", [np.zeros((0, 2), np.int32)]))
add("Not", Case("0-d", [scalar(True, bool)]), Case("empty", [boolean(0, 3)]))
add("Clip",
    Case("0-d with bounds", [scalar(3.5), scalar(-1.0), scalar(1.0)], opset=13),
    Case("0-d with one bound", [scalar(-3.5), scalar(-1.0), None], opset=13),
    Case("0-d without bounds", [scalar(0.5)], opset=13),
    Case("0-d int64", [scalar(7, I64), scalar(0, I64), scalar(5, I64)], opset=13),
    Case("0-d bounds as attributes", [scalar(3.5)], {"min": -1.0, "max": 1.0}, opset=6),
    Case("empty with bounds", [f(2, 0), scalar(-1.0), scalar(1.0)], opset=13))
add("PRelu", Case("0-d", [scalar(-0.75), scalar(0.25)], opset=16),
    Case("empty", [f(0, 3), f(3)], opset=16))
add("Cast", Case("0-d to int64", [scalar(2.75)], {"to": TensorProto.INT64}),
    Case("empty to float16", [f(0, 3)], {"to": TensorProto.FLOAT16}))
add("CastLike", Case("0-d", [scalar(2.75), scalar(1, np.int32)], opset=15),
    Case("empty", [f(3, 0), scalar(1.0, np.float16)], opset=15))

BINARY = {
    "Add": "f", "Sub": "f", "Mul": "f", "Div": "f", "Pow": "f", "Mod": "i", "Equal": "f", "Less": "f",
    "Greater": "f", "LessOrEqual": "f", "GreaterOrEqual": "f", "And": "b", "Or": "b", "Xor": "b",
    "Max": "f", "Min": "f", "Sum": "f", "Mean": "f",
}


def _operands(kind: str, *shape: int) -> np.ndarray:
    if kind == "b":
        return boolean(*shape)
    if kind == "i":  # divisors of Mod must not be 0
        return np.asarray(RNG.integers(1, 9, size=shape) * RNG.choice([-1, 1], size=shape)).astype(I64)
    return f(*shape, lo=0.5, hi=2.0)  # positive: Pow's base, Div's divisor


for _op, _kind in BINARY.items():
    def _x(*shape, _kind=_kind):
        return _operands(_kind, *shape)

    add(_op, Case("0-d", [_x(), _x()]), Case("0-d with empty", [_x(), _x(0, 3)]),
        Case("empty", [_x(0, 3), _x(3)]), Case("empty broadcast", [_x(2, 1, 3), _x(0, 1)]))
for _op in ["Max", "Min", "Sum", "Mean"]:
    add(_op, Case("0-d single input", [f()]), Case("empty single input", [f(0, 2)]))
add("Mod", Case("0-d fmod", [_operands("i"), _operands("i")], {"fmod": 1}))
add("Where", Case("0-d", [scalar(False, bool), f(), f()]),
    Case("empty", [boolean(0, 3), f(3), f()]), Case("empty condition scalar", [scalar(True, bool), f(2, 0), f(1)]))

# ----------------------------------------------------------------------------- reductions

REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
# The spec leaves the mean of no values undefined: onnxruntime gives 0, onnx.reference (numpy) and
# PyTorch NaN.  The kernel keeps NaN (0 / 0), so those cases compare with onnx.reference.
_EMPTY_MEAN = "the mean of no values is undefined in the spec: onnxruntime says 0, onnx.reference NaN (ours)"
for _op in REDUCTIONS:
    _pos = {"lo": 0.5, "hi": 2.0}
    _ref = _EMPTY_MEAN if _op == "ReduceMean" else ""
    add(_op,
        Case("0-d all axes", [f(**_pos)], opset=18),
        Case("0-d keepdims=0", [f(**_pos)], {"keepdims": 0}, opset=18),
        Case("0-d noop_with_empty_axes", [f(**_pos), ints()], {"noop_with_empty_axes": 1}, opset=18),
        Case("0-d output from all axes", [f(2, 3, **_pos)], {"keepdims": 0}, opset=18),
        Case("empty, reduce another axis", [f(2, 0, 3), ints(2)], {"keepdims": 0}, opset=18),
        Case("empty, reduce the empty axis", [f(2, 0, 3), ints(1)], opset=18, onnx_reference=_ref),
        Case("empty, reduce all axes", [f(0, 3)], {"keepdims": 0}, opset=18, onnx_reference=_ref),
        Case("empty, axes attribute", [f(0, 3)], {"axes": [0], "keepdims": 1}, opset=11, onnx_reference=_ref))

for _op in ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"]:
    add(_op, Case("0-d int64", [scalar(-3, I64)], opset=18),
        Case("empty int64, reduce the empty axis", [np.zeros((2, 0), I64), ints(1)], opset=18))

for _op in ["ArgMax", "ArgMin"]:
    add(_op, Case("empty, other axis", [f(0, 3)], {"axis": 1}),
        Case("empty, keepdims=0", [f(2, 0, 3)], {"axis": 2, "keepdims": 0}),
        Case("empty, select_last_index", [f(0, 3)], {"axis": -1, "select_last_index": 1}))

for _op in ["Softmax", "LogSoftmax"]:
    add(_op, Case("empty rows", [f(0, 3)]), Case("empty axis", [f(2, 0)]),
        Case("empty 3-d", [f(2, 0, 4)], {"axis": 1}),
        Case("empty rows, opset 11 (2-D coercion)", [f(0, 3)], {"axis": 1}, opset=11),
        Case("empty inner, opset 11 (2-D coercion)", [f(2, 3, 0)], {"axis": 1}, opset=11))

add("CumSum", Case("empty", [f(0, 3), scalar(0, I64)]), Case("empty other axis", [f(0, 3), scalar(1, I64)]),
    Case("empty exclusive reverse", [f(2, 0), scalar(1, I64)], {"exclusive": 1, "reverse": 1}),
    Case("empty exclusive", [f(0, 3), scalar(0, I64)], {"exclusive": 1}))

# ----------------------------------------------------------------------------- tensor ops

add("Reshape", Case("0-d to [1, 1]", [f(), ints(1, 1)]), Case("0-d output", [f(1, 1), ints()]),
    Case("0-d to [-1]", [f(), ints(-1)]),
    Case("empty, inferred dim", [f(0, 3), ints(3, -1)]), Case("empty, copied 0", [f(2, 0, 3), ints(0, -1)]),
    Case("empty, allowzero", [f(0, 3), ints(0, 3)], {"allowzero": 1}, opset=14),
    Case("empty, -1 first", [f(0, 3), ints(-1, 3)]))
add("Flatten", Case("0-d", [f()], {"axis": 0}),
    Case("empty batch", [f(0, 3, 4)]), Case("empty inner", [f(2, 0, 4)], {"axis": 2}),
    Case("empty, axis 0", [f(2, 0)], {"axis": 0}))
add("Transpose", Case("0-d", [f()]), Case("empty", [f(0, 3, 2)], {"perm": [2, 0, 1]}),
    Case("empty default perm", [f(2, 0)]))
add("Squeeze", Case("0-d output", [f(1, 1)]), Case("0-d output, axes", [f(1), ints(0)]),
    Case("empty", [f(0, 1, 3), ints(1)]), Case("empty, no axes", [f(1, 0)]))
add("Unsqueeze", Case("0-d", [f(), ints(0)]), Case("0-d two axes", [f(), ints(0, -1)]),
    Case("empty", [f(0, 3), ints(0, 3)]), Case("0-d, axes attribute", [f()], {"axes": [0]}, opset=11))
add("Slice", Case("empty input", [f(0, 3), ints(0), ints(2), ints(1)]),
    Case("empty output", [f(2, 3), ints(1), ints(1), ints(1)]),
    Case("empty, negative step", [f(0, 3), ints(-1), ints(-10), ints(0), ints(-1)]),
    Case("empty, attributes", [f(0, 3)], {"starts": [0], "ends": [2], "axes": [1]}, opset=9))
add("Shape", Case("0-d", [f()]), Case("0-d, start/end", [f()], {"start": 0, "end": -1}, opset=15),
    Case("empty", [f(2, 0, 3)]))
add("Size", Case("0-d", [f()]), Case("empty", [f(2, 0, 3)]))
add("DepthToSpace", Case("empty DCR", [f(0, 8, 2, 3)], {"blocksize": 2}),
    Case("empty CRD", [f(0, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}))
add("SpaceToDepth", Case("empty", [f(0, 2, 4, 6)], {"blocksize": 2}))
add("Expand", Case("0-d to [2, 3]", [f(), ints(2, 3)]), Case("0-d to []", [f(), ints()]),
    Case("empty target", [f(1, 3), ints(0, 3)]), Case("empty input", [f(0, 1), ints(1, 4)]))
add("Tile", Case("0-d", [f(), ints()]), Case("empty input", [f(0, 3), ints(2, 2)]),
    Case("empty output, zero repeats", [f(2, 3), ints(0, 1)]))
add("Pad",
    Case("empty, pad the empty axis", [f(0, 3), ints(1, 0, 1, 0), scalar(2.5)], opset=18),
    Case("empty, pad another axis", [f(0, 3), ints(0, 1, 0, 1)], opset=18),
    Case("empty, edge mode", [f(2, 0), ints(1, 0, 1, 0)], {"mode": "edge"}, opset=18),
    Case("empty, pads attribute", [f(0, 3)], {"pads": [0, 1, 0, 1]}, opset=10))
add("Constant", Case("0-d value", [], {"value": scalar(1.5)}), Case("0-d value_int", [], {"value_int": 3}),
    Case("0-d value_float", [], {"value_float": 2.5}), Case("empty value", [], {"value": f(0, 3)}))
add("ConstantOfShape", Case("0-d", [ints()], {"value": ints(7)}), Case("0-d default value", [ints()]),
    Case("empty", [ints(2, 0)], {"value": np.array([1.5], np.float32)}))
add("Range", Case("0-d inputs", [scalar(1, I64), scalar(7, I64), scalar(2, I64)]),
    Case("0-d float inputs", [scalar(0.5), scalar(2.0), scalar(0.5)]),
    Case("empty output", [scalar(3, I64), scalar(3, I64), scalar(1, I64)]),
    Case("empty float output", [scalar(2.0), scalar(1.0), scalar(0.5)]))
add("Trilu", Case("empty", [f(0, 3)], opset=14), Case("empty batch", [f(2, 0, 3), scalar(1, I64)], opset=14),
    Case("empty lower", [f(3, 0)], {"upper": 0}, opset=14))
add("Concat", Case("empty, one part", [f(0, 3), f(2, 3)], {"axis": 0}),
    Case("empty, every part", [f(0, 3), f(0, 3)], {"axis": -1}), Case("empty, axis 1", [f(2, 0), f(2, 3)], {"axis": 1}))
add("Split", Case("empty, split input", [f(0, 3), ints(0, 0)], {"axis": 0}, opset=13, n_outputs=2),
    Case("empty, equal parts", [f(2, 0)], {"axis": 1}, opset=13, n_outputs=2),
    Case("empty, non-empty axis", [f(4, 0), ints(1, 3)], {"axis": 0}, opset=13, n_outputs=2),
    Case("empty, num_outputs", [f(0, 4)], {"axis": 1, "num_outputs": 2}, opset=18, n_outputs=2))

# ----------------------------------------------------------------------------- indexing

add("Gather", Case("0-d indices", [f(3, 4), scalar(1, I64)]), Case("0-d output", [f(3), scalar(-1, I64)]),
    Case("empty indices", [f(3, 4), ints()]), Case("empty data", [f(0, 3), ints(0, 2)], {"axis": 1}))
add("GatherElements", Case("empty indices", [f(2, 3), np.zeros((2, 0), I64)], {"axis": 1}),
    Case("empty data", [f(0, 3), np.zeros((0, 3), I64)]))
add("GatherND", Case("0-d output", [f(2, 3), ints(1, 2)]), Case("empty indices", [f(2, 3), np.zeros((0, 2), I64)]),
    Case("empty rows", [f(2, 3), np.zeros((0, 1), I64)]),
    Case("empty batch", [f(0, 2, 3), np.zeros((0, 1), I64)], {"batch_dims": 1}))
for _op, _opset in [("ScatterElements", 16), ("Scatter", 10)]:
    add(_op, Case("empty indices", [f(2, 3), np.zeros((2, 0), I64), f(2, 0)], {"axis": 1}, opset=_opset),
        Case("empty data", [f(0, 3), np.zeros((0, 3), I64), f(0, 3)], opset=_opset))
add("ScatterElements", Case("empty, reduction add", [f(2, 3), np.zeros((0, 3), I64), f(0, 3)],
                            {"reduction": "add"}, opset=16))
add("ScatterND", Case("0-d update", [f(2, 3), ints(1, 2), scalar(9.0)]),
    Case("empty indices", [f(2, 3), np.zeros((0, 2), I64), f(0)]),
    Case("empty rows", [f(2, 3), np.zeros((0, 1), I64), f(0, 3)]))
add("TopK", Case("empty rows", [f(0, 3), ints(2)], n_outputs=2),
    Case("empty output, k = 0", [f(2, 3), ints(0)], n_outputs=2),
    Case("empty axis", [f(2, 0), ints(0)], n_outputs=2),
    Case("empty rows, k attribute", [f(0, 3)], {"k": 1}, opset=9, n_outputs=2))
add("NonZero", Case("0-d true", [scalar(2.0)]), Case("0-d false", [scalar(0.0)]),
    Case("empty", [f(0, 3)]))
_ONEHOT_0D = "onnxruntime (ONNX shape inference) wants indices of rank >= 1; onnx.reference computes it"
add("OneHot", Case("0-d indices", [scalar(2, I64), scalar(4, I64), f(2)], opset=11, onnx_reference=_ONEHOT_0D),
    Case("0-d negative index", [scalar(-1, I64), scalar(3, I64), f(2)], opset=11, onnx_reference=_ONEHOT_0D),
    Case("empty indices", [ints(), scalar(4, I64), f(2)], opset=11),
    Case("empty, axis 0", [np.zeros((0, 2), I64), scalar(3, I64), f(2)], {"axis": 0}, opset=11))

# ----------------------------------------------------------------------------- matrix products

add("MatMul", Case("0-d output", [f(3), f(3)]), Case("empty rows", [f(0, 3), f(3, 4)]),
    Case("empty inner", [f(2, 0), f(0, 4)]), Case("empty batch", [f(2, 0, 3), f(3, 4)]),
    Case("empty, vector", [f(0, 3), f(3)]), Case("empty batch 3-d by 3-d", [f(0, 2, 3), f(1, 3, 4)]),
    Case("empty inner, 3-d by 2-d", [f(2, 3, 0), f(0, 4)]))
add("Gemm", Case("empty rows", [f(0, 3), f(3, 4), f(4)]), Case("empty inner, 0-d C", [f(2, 0), f(0, 4), scalar(1.5)]),
    Case("empty, transposed", [f(3, 0), f(4, 3), f(1, 4)], {"transA": 1, "transB": 1, "alpha": 2.0}),
    Case("empty, relu-free no C", [f(0, 3), f(3, 4)]))


def _fully_connected_equivalent(names, outs):
    x, w, b = names[0], names[1], names[2] if len(names) > 2 else ""
    if not b:
        return [helper.make_node("MatMul", [x, w], outs)], {}
    return [helper.make_node("MatMul", [x, w], ["xw"]), helper.make_node("Add", ["xw", b], outs)], {}


add("FullyConnected", Case("empty rows", [f(0, 3), f(3, 4), f(4)], equivalent=_fully_connected_equivalent),
    Case("empty batch", [f(2, 0, 3), f(3, 4)], equivalent=_fully_connected_equivalent),
    Case("empty inner", [f(2, 0), f(0, 4), f(4)], equivalent=_fully_connected_equivalent),
    Case("empty inner, 3-d", [f(2, 3, 0), f(0, 4), f(4)], equivalent=_fully_connected_equivalent), domain=OPTCLI)

# ----------------------------------------------------------------------------- windows, normalisation

_POOL = {"kernel_shape": [2, 2]}
_NCHWC = ("onnxruntime refuses C = 0: its NCHWc optimizer (\"invalid channel count\") and, with that off, its "
          "pooling kernels (\"Only N can be zero\")")
for _op in ["MaxPool", "AveragePool"]:
    add(_op, Case("empty batch", [f(0, 2, 4, 4)], _POOL),
        Case("empty channels", [f(1, 0, 4, 4)], _POOL, onnx_reference=_NCHWC),
        Case("empty batch, padded", [f(0, 2, 3, 3)], {**_POOL, "pads": [1, 1, 0, 0], "strides": [2, 2]}),
        Case("empty batch, ceil_mode", [f(0, 1, 5)], {"kernel_shape": [2], "strides": [2], "ceil_mode": 1}))
add("AveragePool", Case("empty batch, count_include_pad", [f(0, 2, 3, 3)],
                        {**_POOL, "pads": [1, 1, 1, 1], "count_include_pad": 1}))
# No "empty channels" for GlobalAveragePool: onnx.reference fails on it too (np.average of nothing).
for _op in ["GlobalAveragePool", "GlobalMaxPool"]:
    add(_op, Case("empty batch", [f(0, 2, 3, 3)]), Case("empty batch 1-d", [f(0, 3, 5)]))
add("GlobalMaxPool", Case("empty channels", [f(1, 0, 3, 3)], onnx_reference=_NCHWC))

add("Conv",
    Case("empty batch, pointwise", [f(0, 3, 4, 4), f(5, 3, 1, 1), f(5)]),
    Case("empty batch, depthwise", [f(0, 3, 4, 4), f(3, 1, 3, 3)], {"group": 3, "pads": [1, 1, 1, 1]}),
    Case("empty batch, 3x3", [f(0, 2, 5, 5), f(4, 2, 3, 3), f(4)], {"strides": [2, 2]}),
    Case("empty batch, 1-d", [f(0, 2, 6), f(4, 2, 3)]),
    Case("empty output channels", [f(1, 2, 4, 4), f(0, 2, 1, 1)]))
add("ConvTranspose", Case("empty batch", [f(0, 2, 3, 3), f(2, 4, 3, 3), f(4)], {"strides": [2, 2]}),
    Case("empty batch, grouped", [f(0, 4, 3), f(4, 1, 2)], {"group": 2}))
add("BatchNormalization", Case("empty batch", [f(0, 3, 2, 2), f(3), f(3), f(3), f(3, lo=0.5)]),
    Case("empty batch 2-d", [f(0, 3), f(3), f(3), f(3), f(3, lo=0.5)]))
add("InstanceNormalization", Case("empty batch", [f(0, 3, 2, 2), f(3), f(3)]),
    Case("empty batch 1-d", [f(0, 3, 5), f(3), f(3)]))
add("LayerNormalization", Case("empty rows", [f(0, 4), f(4), f(4)]),
    Case("empty batch", [f(2, 0, 4), f(4)], {"axis": -1}),
    Case("empty batch, two axes", [f(0, 3, 4), f(3, 4), f(3, 4)], {"axis": 1}),
    Case("empty rows, three outputs", [f(0, 4), f(4), f(4)], n_outputs=3))


def _channel_affine_equivalent(names, outs):
    x, scale, shift = names
    nodes = [helper.make_node("Unsqueeze", [scale, "axes"], ["s"]), helper.make_node("Mul", [x, "s"], ["xs"]),
             helper.make_node("Unsqueeze", [shift, "axes"], ["b"]), helper.make_node("Add", ["xs", "b"], outs)]
    return nodes, {"axes": ints(1, 2)}


add("ChannelAffine", Case("empty batch", [f(0, 3, 2, 2), f(3), f(3)], equivalent=_channel_affine_equivalent),
    domain=OPTCLI)

add("Resize",
    Case("empty batch, nearest", [f(0, 1, 2, 2), None, np.array([1, 1, 2, 2], np.float32)], opset=13),
    Case("empty batch, linear", [f(0, 1, 2, 2), None, np.array([1, 1, 2, 1.5], np.float32)], {"mode": "linear"},
         opset=13),
    Case("empty batch, cubic", [f(0, 1, 4, 4), None, np.array([1, 1, 0.5, 0.5], np.float32)], {"mode": "cubic"},
         opset=13),
    Case("empty batch, sizes", [f(0, 1, 2, 2), None, None, ints(0, 1, 3, 3)], {"mode": "linear"}, opset=13),
    Case("empty batch, sizes on some axes", [f(0, 1, 2, 2), None, None, ints(3, 3)], {"axes": [2, 3]}, opset=18),
    Case("empty batch, opset 10", [f(0, 1, 2, 2), np.array([1, 1, 2, 2], np.float32)], opset=10))
add("Upsample", Case("empty batch", [f(0, 1, 2, 2), np.array([1, 1, 2, 2], np.float32)], opset=9))

# ----------------------------------------------------------------------------- quantization

add("QuantizeLinear", Case("0-d", [scalar(0.7), scalar(0.05), scalar(128, U8)], opset=13),
    Case("0-d int8 default zero point", [scalar(-0.7), scalar(0.05)], opset=13),
    Case("empty", [f(0, 3), scalar(0.05), scalar(3, np.int8)], opset=13),
    Case("empty per-axis", [f(0, 3), f(3, lo=0.01, hi=0.1), q8(3)], opset=13))
add("DequantizeLinear", Case("0-d", [scalar(200, U8), scalar(0.05), scalar(128, U8)], opset=13),
    Case("empty", [q8(0, 3), scalar(0.05), scalar(3, U8)], opset=13),
    Case("empty per-axis", [q8(2, 0, dtype=np.int8), f(0, lo=0.01, hi=0.1), np.zeros(0, np.int8)], opset=13))
add("DynamicQuantizeLinear", Case("0-d", [scalar(1.5)], n_outputs=3), Case("0-d negative", [scalar(-2.0)], n_outputs=3),
    Case("0-d zero", [scalar(0.0)], n_outputs=3), Case("empty", [f(0, 3)], n_outputs=3))
_QMM = [scalar(0.02), scalar(128, U8)]
_K0 = "onnxruntime leaves the output uninitialised when K = 0 (garbage values, different each run)"
add("QLinearMatMul", Case("empty rows", [q8(0, 3), *_QMM, q8(3, 4), *_QMM, scalar(0.1), scalar(120, U8)]),
    Case("empty inner", [q8(2, 0), *_QMM, q8(0, 4), *_QMM, scalar(0.1), scalar(120, U8)], onnx_reference=_K0),
    Case("0-d output", [q8(3), *_QMM, q8(3), *_QMM, scalar(0.1), scalar(120, U8)]))
add("MatMulInteger", Case("empty rows", [q8(0, 3), q8(3, 4), scalar(100, U8), scalar(120, U8)], opset=10),
    Case("empty inner", [q8(2, 0), q8(0, 4)], opset=10, onnx_reference=_K0),
    Case("0-d output", [q8(3), q8(3), scalar(100, U8)], opset=10))
add("ConvInteger", Case("empty batch", [q8(0, 2, 4, 4), q8(3, 2, 3, 3), scalar(100, U8), scalar(120, U8)],
                        opset=10))
add("QLinearConv", Case("empty batch", [q8(0, 2, 4, 4), *_QMM, q8(3, 2, 3, 3), *_QMM, scalar(0.1), scalar(120, U8),
                                        np.zeros(3, np.int32)], {"pads": [1, 1, 1, 1]}, opset=10))


def _fake_quant_equivalent(names, outs):
    nodes = [helper.make_node("QuantizeLinear", [names[0], "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], outs)]
    return nodes, {"s": scalar(0.05), "z": scalar(3, np.int8)}


_FQ = {"scale": 0.05, "zero_point": 3.0}
add("FakeQuant", Case("0-d", [scalar(0.7)], _FQ, equivalent=_fake_quant_equivalent),
    Case("0-d saturating", [scalar(-30.0)], _FQ, equivalent=_fake_quant_equivalent),
    Case("empty", [f(2, 0)], _FQ, equivalent=_fake_quant_equivalent), domain=OPTCLI)

_QA = [scalar(0.02), scalar(128, U8)]
for _op in ["QLinearAdd", "QLinearMul"]:
    add(_op, Case("0-d", [q8(), *_QA, q8(), *_QA, scalar(0.05), scalar(100, U8)]),
        Case("empty", [q8(0, 3), *_QA, q8(3), *_QA, scalar(0.05), scalar(100, U8)]), domain=MS)
for _op in ["QLinearSigmoid", "QLinearLeakyRelu"]:
    add(_op, Case("0-d", [q8(), *_QA, scalar(0.004), scalar(0, U8)]),
        Case("empty", [q8(0, 3), *_QA, scalar(0.004), scalar(0, U8)]), domain=MS)
add("QLinearGlobalAveragePool", Case("empty batch", [q8(0, 2, 3, 3), *_QA, *_QA]), domain=MS)
add("QLinearAveragePool", Case("empty batch", [q8(0, 2, 4, 4), *_QA, *_QA], _POOL), domain=MS)
add("QLinearConcat", Case("empty part", [*_QA, q8(0, 3), *_QA, q8(2, 3), *_QA], {"axis": 0}),
    Case("empty every part", [*_QA, q8(2, 0), *_QA, q8(2, 0), *_QA], {"axis": 0}), domain=MS)
add("QGemm", Case("empty rows", [q8(0, 3), *_QA, q8(3, 4), *_QA, None, scalar(0.05), scalar(100, U8)]),
    Case("empty rows, float output", [q8(0, 3), *_QA, q8(3, 4), *_QA]), domain=MS)

# ----------------------------------------------------------------------------- optcli-only ops


def _identity_equivalent(names, outs):
    return [helper.make_node("Identity", names[:1], outs)], {}


def _swish_equivalent(names, outs):
    return [helper.make_node("Sigmoid", names[:1], ["s"]), helper.make_node("Mul", [names[0], "s"], outs)], {}


for _op in ["Upload", "Download", "Pack", "Unpack"]:
    add(_op, Case("0-d", [f()], equivalent=_identity_equivalent),
        Case("empty", [f(0, 3)], equivalent=_identity_equivalent), domain=OPTCLI)
add("Swish", Case("0-d", [scalar(-0.75)], equivalent=_swish_equivalent),
    Case("empty", [f(0, 3)], equivalent=_swish_equivalent), domain=OPTCLI)


def _dynamic_quantize_matmul_equivalent(names, outs):
    """The chain quantize_dynamic writes and the fused op replaces."""
    a, b, b_scale, b_zp, bias = names
    nodes = [helper.make_node("DynamicQuantizeLinear", [a], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", b, "z", b_zp], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", b_scale], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y"]),
             helper.make_node("Add", ["y", bias], outs)]
    return nodes, {}


_DQMM = [q8(3, 4, dtype=np.int8), scalar(0.02), scalar(0, np.int8), f(4)]
_DQMM_EQ = _dynamic_quantize_matmul_equivalent
add("DynamicQuantizeMatMul", Case("empty rows", [f(0, 3), *_DQMM], opset=13, equivalent=_DQMM_EQ),
    Case("empty batch", [f(2, 0, 3), *_DQMM], opset=13, equivalent=_DQMM_EQ), domain=OPTCLI)

_QCONV = {"x_scale": 0.02, "x_zero_point": 128, "w_scale": [0.01, 0.03], "y_scale": 0.05, "y_zero_point": 3,
          "qmin": 3, "qmax": 255, "x_signed": 0, "y_signed": 0, "pads": [1, 1, 1, 1]}


def _qconv_equivalent(names, outs):
    """optcli.QConv is QLinearConv with its quantization as attributes, and a fused Relu as qmin."""
    scales = {"xs": np.float32(_QCONV["x_scale"]), "xz": np.uint8(_QCONV["x_zero_point"]),
              "ws": np.asarray(_QCONV["w_scale"], np.float32), "wz": np.zeros(2, np.int8),
              "ys": np.float32(_QCONV["y_scale"]), "yz": np.uint8(_QCONV["y_zero_point"])}
    node = helper.make_node("QLinearConv", [names[0], "xs", "xz", names[1], "ws", "wz", "ys", "yz", names[2]], outs,
                            pads=_QCONV["pads"])
    return [node], scales


add("QConv", Case("empty batch", [q8(0, 3, 4, 4), q8(2, 3, 3, 3, dtype=np.int8), ints(5, -7, dtype=np.int32)],
                  dict(_QCONV), equivalent=_qconv_equivalent), domain=OPTCLI)

_QMATMUL = {"x_scale": 0.02, "x_zero_point": 128, "w_scale": [0.01, 0.03], "y_scale": 0.05, "y_zero_point": 3,
            "qmin": 0, "qmax": 255, "x_signed": 0, "y_signed": 0}


def _qmatmul_equivalent(names, outs):
    """optcli.QMatMul with no bias and no clamp is QLinearMatMul with its quantization as attributes."""
    scales = {"xs": np.float32(_QMATMUL["x_scale"]), "xz": np.uint8(_QMATMUL["x_zero_point"]),
              "ws": np.asarray(_QMATMUL["w_scale"], np.float32), "wz": np.zeros(2, np.int8),
              "ys": np.float32(_QMATMUL["y_scale"]), "yz": np.uint8(_QMATMUL["y_zero_point"])}
    node = helper.make_node("QLinearMatMul", [names[0], "xs", "xz", names[1], "ws", "wz", "ys", "yz"], outs)
    return [node], scales


add("QMatMul", Case("empty rows", [q8(0, 3), q8(3, 2, dtype=np.int8)], dict(_QMATMUL), equivalent=_qmatmul_equivalent),
    Case("empty batch", [q8(2, 0, 3), q8(3, 2, dtype=np.int8)], dict(_QMATMUL), equivalent=_qmatmul_equivalent),
    domain=OPTCLI)

_QADD = {"a_scale": 0.02, "a_zero_point": 7, "b_scale": 0.05, "b_zero_point": 250, "y_scale": 0.06,
         "y_zero_point": 128, "qmin": 0, "qmax": 255, "a_signed": 0, "b_signed": 0, "y_signed": 0}


def _qadd_equivalent(names, outs):
    """optcli.QAdd stands for DequantizeLinear x2 -> Add -> QuantizeLinear (to within a rounding tie)."""
    consts = {k: (np.float32 if k.endswith("scale") else np.uint8)(v) for k, v in _QADD.items()
              if k.endswith(("scale", "zero_point"))}
    nodes = [helper.make_node("DequantizeLinear", [names[0], "a_scale", "a_zero_point"], ["fa"]),
             helper.make_node("DequantizeLinear", [names[1], "b_scale", "b_zero_point"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "y_scale", "y_zero_point"], outs)]
    return nodes, consts


add("QAdd", Case("0-d", [q8(), q8()], dict(_QADD), equivalent=_qadd_equivalent),
    Case("empty", [q8(0, 3), q8(0, 3)], dict(_QADD), equivalent=_qadd_equivalent), domain=OPTCLI)

_TABLE = q8(256)


def _qlookup_equivalent(names, outs):
    """optcli.QLookup of a uint8 tensor is Gather(table, x)."""
    nodes = [helper.make_node("Cast", [names[0]], ["index"], to=TensorProto.INT64),
             helper.make_node("Gather", [names[1], "index"], outs)]
    return nodes, {}


add("QLookup", Case("0-d", [q8(), _TABLE], {}, equivalent=_qlookup_equivalent),
    Case("empty", [q8(0, 3), _TABLE], {}, equivalent=_qlookup_equivalent), domain=OPTCLI)

_QMUL = {"x_scale": 0.02, "x_zero_point": 7, "g_scale": 0.004, "g_zero_point": 0, "y_scale": 0.01,
         "y_zero_point": 128, "qmin": 0, "qmax": 255, "x_signed": 0, "g_signed": 0, "y_signed": 0}


def _se_equivalent(op: str, attrs: dict):
    """optcli.QMul / QGlobalAveragePool stand for DequantizeLinear(s) -> Mul / GlobalAveragePool ->
    QuantizeLinear (to within a rounding tie)."""
    def make(names, outs):
        consts = {k: (np.float32 if k.endswith("scale") else np.uint8)(v) for k, v in attrs.items()
                  if k.endswith(("scale", "zero_point"))}
        floats = [f"f{i}" for i in range(len(names))]
        nodes = [helper.make_node("DequantizeLinear", [n, f"{w}_scale", f"{w}_zero_point"], [fl])
                 for n, w, fl in zip(names, ("x", "g"), floats)]
        nodes += [helper.make_node(op, floats, ["r"]), helper.make_node("QuantizeLinear", ["r", "y_scale",
                                                                                        "y_zero_point"], outs)]
        return nodes, consts
    return make


add("QMul", Case("empty batch", [q8(0, 3, 4, 4), q8(0, 3, 1, 1)], dict(_QMUL),
                 equivalent=_se_equivalent("Mul", _QMUL)), domain=OPTCLI)
_QGAP = {k: v for k, v in _QMUL.items() if not k.startswith("g_")}
add("QGlobalAveragePool", Case("empty batch", [q8(0, 3, 4, 4)], dict(_QGAP),
                               equivalent=_se_equivalent("GlobalAveragePool", _QGAP)), domain=OPTCLI)

# ----------------------------------------------------------------------------- recurrent

def _zeros_of(*shapes: tuple[int, ...]) -> Equivalent:
    """Outputs that are zeros of fixed shapes (what a recurrent layer gives for an empty sequence or
    batch: onnxruntime aborts the process on some of these and onnx.reference fails on them)."""
    def make(inputs: list[str], outputs: list[str]):
        nodes = [helper.make_node("ConstantOfShape", [f"{o}_shape"], [o], value=numpy_helper.from_array(
            np.zeros(1, np.float32))) for o in outputs]
        return nodes, {f"{o}_shape": np.array(s, I64) for o, s in zip(outputs, shapes)}
    return make


for _op, _gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
    _w, _r = f(1, 4 * _gates, 3, lo=-0.5, hi=0.5), f(1, 4 * _gates, 4, lo=-0.5, hi=0.5)
    _n = 3 if _op == "LSTM" else 2
    add(_op, Case("empty sequence", [f(0, 2, 3), _w, _r], {"hidden_size": 4}, opset=14, n_outputs=_n,
                  equivalent=_zeros_of((0, 1, 2, 4), *[(1, 2, 4)] * (_n - 1))),
        Case("empty batch", [f(3, 0, 3), _w, _r], {"hidden_size": 4}, opset=14, n_outputs=_n,
             equivalent=_zeros_of((3, 1, 0, 4), *[(1, 0, 4)] * (_n - 1))))

# ----------------------------------------------------------------------------- what is left out, and why

_RANK_1 = "the ONNX op needs rank >= 1 (its axis must lie in [-rank, rank - 1])"
_SPATIAL = "the ONNX op needs an (N, C, *spatial) input of rank >= 3"
NO_ZERO_D: dict[tuple[str, str], str] = {
    **{("", op): _RANK_1 for op in ["ArgMax", "ArgMin", "Softmax", "LogSoftmax", "CumSum", "Concat", "Split",
                                    "Slice", "TopK", "GatherElements", "ScatterElements", "Scatter"]},
    **{("", op): _SPATIAL for op in ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Conv",
                                     "ConvTranspose", "InstanceNormalization", "ConvInteger", "QLinearConv"]},
    **{(MS, op): _SPATIAL for op in ["QLinearGlobalAveragePool", "QLinearAveragePool"]},
    ("", "DepthToSpace"): "the ONNX op needs a rank-4 input",
    ("", "SpaceToDepth"): "the ONNX op needs a rank-4 input",
    ("", "Trilu"): "the ONNX op needs rank >= 2",
    ("", "BatchNormalization"): "the ONNX op needs (N, C, ...) input; C is axis 1",
    ("", "LayerNormalization"): _RANK_1,
    ("", "Pad"): "onnxruntime and onnx.reference both reject a rank-0 Pad input (pads would have 0 entries)",
    ("", "Resize"): "onnxruntime rejects rank 0 (scales/sizes have one entry per axis; nothing to resize)",
    ("", "Upsample"): "as Resize",
    ("", "Gemm"): "the ONNX op needs 2-D A and B (a 0-d C is covered)",
    (OPTCLI, "FullyConnected"): "X must have rank >= 1 and W is 2-D, so the output has rank >= 1",
    (OPTCLI, "DynamicQuantizeMatMul"): "as FullyConnected: B is a 2-D weight, so the output has rank >= 1",
    (OPTCLI, "ChannelAffine"): "scale and shift apply along axis 1: rank >= 2",
    (OPTCLI, "QConv"): _SPATIAL,
    (OPTCLI, "QMatMul"): "as FullyConnected: w is a 2-D weight [K, M], x [..., K]: the output has rank >= 1",
    (OPTCLI, "QMul"): "the gate is per channel of an (N, C, *spatial) input: rank >= 3",
    (OPTCLI, "QGlobalAveragePool"): _SPATIAL,
    (MS, "QLinearConcat"): _RANK_1,
    (MS, "QGemm"): "the op needs 2-D A and B",
    **{("", op): "X is [sequence, batch, input]: rank 3" for op in ["LSTM", "GRU", "RNN"]},
}
NO_EMPTY: dict[tuple[str, str], str] = {}
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    (MS, "DynamicQuantizeLSTM"): "no reference: onnxruntime returns uninitialised Y_c (1e24) for an empty sequence "
                                 "and aborts on a batch of 0, onnx.reference has no com.microsoft ops; it runs the "
                                 "LSTM kernel, whose empty cases are above",
    ("optcli", "ToBlocked"): "converts [N, C, H, W] images only: tests/passes/test_choose_host_layout.py",
    ("optcli", "FromBlocked"): "converts [N, C, H, W] images only: tests/passes/test_choose_host_layout.py",
}


def attribute_protos(attrs: dict) -> dict:
    """Attributes for ``helper.make_node``: numpy arrays become TensorProto attributes."""
    return {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}
