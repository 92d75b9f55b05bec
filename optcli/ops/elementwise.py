"""Element-wise ops: arithmetic, comparisons, logic, unary maths and the small activations.

These kernels are both the reference the GPU targets are checked against and the host-CPU
(`arm`) target's production kernels, so they are vectorised numpy and keep the input dtype:
numpy would otherwise happily promote float32 to float64 (through float64 scalars or mixed
operands), which is both slower and a silent change of the op's output type.  Broadcasting is
numpy's, which is exactly ONNX's multidirectional broadcasting.

Where numpy and ONNX disagree we follow ONNX (and onnxruntime): integer ``Div`` truncates toward
zero like C, ``Pow`` keeps the base's dtype, ``Mod`` switches between Python-style and C-style
remainders on ``fmod``.  ``Erf`` is W. J. Cody's rational Chebyshev approximation evaluated in
float64, accurate to about 1e-16 relative, because float32 models (BERT's GELU) are sensitive
to it and there is no scipy here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.ops.activation import (
    _sigmoid,
    activate,
    apply_output_quant,
    epilogue,
    gelu_reference,
    native_activation,
)
from optcli.ops.erf import erf
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import broadcast_inputs, first_input, shape_fn

Inputs = list[np.ndarray | None]
Attrs = dict[str, Any]

_LOW_FLOATS = (np.dtype(np.float16),)


def _compute_dtype(x: np.ndarray) -> np.dtype:
    """float16 is computed in float32 (as onnxruntime does) and cast back."""
    return np.dtype(np.float32) if x.dtype in _LOW_FLOATS else x.dtype


def _unary_float(fn):
    """Wrap a float ufunc-like ``fn`` into a kernel that keeps the input dtype."""

    def run(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
        x = np.asarray(inputs[0])
        cd = _compute_dtype(x)
        y = fn(x.astype(cd, copy=False), attrs)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    run.__doc__ = fn.__doc__
    return run


# ----------------------------------------------------------------------------- binary arithmetic

def _same(y: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(y).astype(like.dtype, copy=False)


def _with_epilogue(y: np.ndarray, attrs: Attrs) -> np.ndarray:
    """Add/Sub/Mul may carry a fused activation (see fuse_conv_bias_activation) and a fused
    FakeQuant (fuse_fake_quant)."""
    if "activation" in attrs:
        y = activate(y, *epilogue(attrs))
    return apply_output_quant(y, attrs)


_NATIVE_ADD_MIN = 1 << 14  # below this many floats numpy's two quick passes cost less than a native call


@kernel("Add")
def add(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    if (type(a) is np.ndarray and type(b) is np.ndarray and a.shape == b.shape and a.size >= _NATIVE_ADD_MIN
            and a.dtype == b.dtype == np.float32 and a.flags.c_contiguous and b.flags.c_contiguous
            and attrs.get("activation") in native.ACTIVATION_CODES and native.available()):
        # a residual Add (and the Relu fused into it) in one threaded pass over the output
        return [apply_output_quant(native.add(a, b, *epilogue(attrs)), attrs)]
    if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype is _F32 and b.dtype is _F32:
        big, row = (a, b) if a.size >= b.size else (b, a)
        act = attrs.get("activation")
        if row.size < big.size and big.size >= (_NATIVE_ROW_ADD_MIN if act is None else _NATIVE_ROW_ADD_ACT_MIN) \
                and act != "tanh" and act in native.ACTIVATION_CODES and _trailing(big.shape, row.shape) \
                and big.flags.c_contiguous and row.flags.c_contiguous and native.available():
            # a row or block (a bias, an attention mask, a decoder's query) added to every row of the
            # other operand, and the activation, in one pass where numpy's broadcast add and the
            # activation took two calls: relu over [2, 16, 128] 3.0 against 4.3 us, [1, 256, 56, 56]
            # + [56, 56] 39 against 116.  Not tanh: numpy's own is the faster on small arrays
            return [apply_output_quant(native.add_period(big, row, *epilogue(attrs)), attrs)]
    return [_with_epilogue(_same(np.add(a, b), a), attrs)]


_F32 = np.dtype(np.float32)
_NATIVE_ROW_ADD_MIN = 16384  # result elements from which the native broadcast add beats numpy's (~2.6 us a call)
_NATIVE_ROW_ADD_ACT_MIN = 64  # the same with an activation fused, which numpy runs as a second call


def _trailing(big: tuple[int, ...], small: tuple[int, ...]) -> bool:
    """Whether an array of shape ``small`` broadcast to ``big`` (numpy's rules) is its elements
    repeated in order: ``small`` without its leading ones is a suffix of ``big``, and the result
    has ``big``'s shape."""
    if len(small) > len(big):
        return False  # the result would have more dims than big
    k = 0
    while k < len(small) and small[k] == 1:
        k += 1
    rest = small[k:]
    return big[len(big) - len(rest):] == rest


@kernel("Sub")
def sub(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    return [_with_epilogue(_same(np.subtract(a, b), a), attrs)]


@kernel("Mul")
def mul(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    return [_with_epilogue(_same(np.multiply(a, b), a), attrs)]


@kernel("Div")
def div(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """Float division; integer division truncates toward zero (C semantics, as onnxruntime)."""
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    if np.issubdtype(a.dtype, np.integer):
        b = b.astype(a.dtype, copy=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.floor_divide(a, b)
            if np.issubdtype(a.dtype, np.signedinteger):
                # floor -> trunc: bump the quotient where the remainder is non-zero and signs differ.
                r = np.remainder(a, b)
                q = q + ((r != 0) & ((a < 0) != (b < 0))).astype(a.dtype)
        return [_same(q, a)]
    with np.errstate(divide="ignore", invalid="ignore"):
        return [_same(np.divide(a, b), a)]


@kernel("Pow")
def pow_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """Output has the base's dtype whatever the exponent's (ONNX Pow-12+)."""
    x, p = np.asarray(inputs[0]), np.asarray(inputs[1])
    if np.issubdtype(x.dtype, np.floating):
        cd = _compute_dtype(x)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            y = np.power(x.astype(cd, copy=False), p.astype(cd, copy=False))
        return [_same(y, x)]
    if np.issubdtype(p.dtype, np.integer) and (p.size == 0 or p.min() >= 0):
        return [_same(np.power(x.astype(np.int64), p.astype(np.int64)), x)]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = np.power(x.astype(np.float64), p.astype(np.float64))
    return [_same(np.trunc(y), x)]


@kernel("Mod")
def mod(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """fmod=0: remainder takes the divisor's sign (Python); fmod=1: the dividend's (C fmod)."""
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    fn = np.fmod if attrs.get("fmod", 0) else np.mod
    with np.errstate(divide="ignore", invalid="ignore"):
        return [_same(fn(a, b.astype(a.dtype, copy=False)), a)]


def _variadic(fn, inputs: Inputs) -> np.ndarray:
    xs = [np.asarray(x) for x in inputs if x is not None]
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    if len(xs) == 1:
        out = out.copy()
    return _same(out, xs[0])


@kernel("Max")
def max_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_variadic(np.maximum, inputs)]


@kernel("Min")
def min_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_variadic(np.minimum, inputs)]


@kernel("Sum")
def sum_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [_variadic(np.add, inputs)]


@kernel("Mean")
def mean(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    s = _variadic(np.add, inputs)
    n = sum(x is not None for x in inputs)
    return [_same(s / s.dtype.type(n), s)]


# ----------------------------------------------------------------------------- comparisons, logic

@kernel("Equal")
def equal(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.equal(inputs[0], inputs[1]))]


@kernel("Less")
def less(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.less(inputs[0], inputs[1]))]


@kernel("Greater")
def greater(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.greater(inputs[0], inputs[1]))]


@kernel("LessOrEqual")
def less_equal(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.less_equal(inputs[0], inputs[1]))]


@kernel("GreaterOrEqual")
def greater_equal(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.greater_equal(inputs[0], inputs[1]))]


@kernel("And")
def and_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.logical_and(inputs[0], inputs[1]))]


@kernel("Or")
def or_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.logical_or(inputs[0], inputs[1]))]


@kernel("Xor")
def xor(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.logical_xor(inputs[0], inputs[1]))]


@kernel("Not")
def not_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.logical_not(inputs[0]))]


@kernel("Where")
def where(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    c, x, y = (np.asarray(v) for v in inputs[:3])
    return [_same(np.where(c.astype(bool, copy=False), x, y), x)]


@kernel("IsNaN")
def isnan(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.asarray(np.isnan(inputs[0]))]


@kernel("IsInf")
def isinf(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    inf = np.isinf(x)
    if pos and neg:
        return [inf]
    if pos:
        return [inf & (x > 0)]
    if neg:
        return [inf & (x < 0)]
    return [np.zeros(x.shape, dtype=bool)]


# ----------------------------------------------------------------------------- unary maths

@kernel("Neg")
def neg(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.negative(inputs[0])]


@kernel("Abs")
def abs_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.abs(inputs[0])]


@kernel("Sign")
def sign(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.sign(inputs[0])]


@kernel("Floor")
def floor(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.floor(inputs[0])]


@kernel("Ceil")
def ceil(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    return [np.ceil(inputs[0])]


@kernel("Round")
def round_(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """Half to even, which is numpy's rounding."""
    return [np.round(inputs[0])]


def _with_errstate(fn):
    def inner(x: np.ndarray, attrs: Attrs) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return fn(x, attrs)

    inner.__doc__ = fn.__doc__
    return inner


_UNARY = {
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Reciprocal": lambda x, a: np.reciprocal(x),
    "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x),
    "Softsign": lambda x, a: x / (np.abs(x) + 1),
    "Softplus": lambda x, a: np.logaddexp(x.dtype.type(0), x),
    "Elu": lambda x, a: np.where(x > 0, x, np.expm1(x) * x.dtype.type(a.get("alpha", 1.0))),
    "ThresholdedRelu": lambda x, a: np.where(x > x.dtype.type(a.get("alpha", 1.0)), x, x.dtype.type(0)),
}
for _name, _fn in _UNARY.items():
    kernel(_name)(_unary_float(_with_errstate(_fn)))


@kernel("Selu")
@_unary_float
def selu(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    t = x.dtype.type
    alpha = t(attrs.get("alpha", 1.67326319217681884765625))
    gamma = t(attrs.get("gamma", 1.05070102214813232421875))
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel("Celu")
@_unary_float
def celu(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    alpha = x.dtype.type(attrs.get("alpha", 1.0))
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(np.minimum(x, 0) / alpha))


@kernel("Erf")
def erf_kernel(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    return [erf(x).astype(x.dtype, copy=False)]


@kernel("Gelu")
def gelu(inputs: Inputs, attrs: Attrs) -> list[np.ndarray]:
    """Gelu-20: ``approximate`` "none" uses erf, "tanh" the tanh formula; float32 in the native
    library (numpy's float64 erf is ~20x slower), else in float64."""
    x = np.asarray(inputs[0])
    tanh = attrs.get("approximate", "none") == "tanh"
    y = native_activation(x, "gelu_tanh" if tanh else "gelu")
    return [gelu_reference(x, tanh) if y is None else y]


@kernel("Swish", domain="")
@_unary_float
def swish_onnx(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    """ONNX Swish-24: x * sigmoid(alpha * x)."""
    return x * _sigmoid(x * x.dtype.type(attrs.get("alpha", 1.0)))


# Shape functions (``optcli.ops.shape_functions``): element-wise ops keep their input's shape,
# the others broadcast their inputs numpy-style.
shape_fn([*_UNARY, "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Selu", "Celu", "Erf", "Gelu", "Swish",
          "IsNaN", "IsInf", "Not"])(first_input)
shape_fn(["Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater",
          "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where"])(broadcast_inputs)
