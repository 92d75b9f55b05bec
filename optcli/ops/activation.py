"""Activation functions: the stand-alone ops and the fused epilogue shared by Conv, Gemm,
FullyConnected and friends.

A fused epilogue is three attributes on the fused node: ``activation`` (a name from
``ACTIVATIONS``), ``activation_alpha`` and ``activation_beta`` (floats whose meaning depends on
the activation, as in the ONNX op it came from).  GPU kernels will receive the same triple as a
define, so the names here are part of the `.nb` format.
"""

from __future__ import annotations

import math

import numpy as np

from optcli import native
from optcli.ops.erf import erf
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import broadcast_inputs, first_input, shape_fn


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows, and stay in the input's dtype.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


_F32 = np.dtype(np.float32)
_SMALL_ACTIVATION = 1024  # elements: below this a sigmoid is one native call in place, not numpy's passes


def _sigmoid_in_place(y: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-y)) of a small float32 array in place (a GRU cell's gates each step of a
    decoder's Loop): five ufunc passes, where ``_sigmoid``'s masks cost ~15 us on 96 values.
    exp's argument is capped at 88 (exp(88) < float32's max: no overflow), which moves a result
    below 6e-39 (y < -88) to 6e-39; NaN stays NaN."""
    np.negative(y, out=y)
    np.minimum(y, 88.0, out=y)
    np.exp(y, out=y)
    np.add(y, 1.0, out=y)
    return np.reciprocal(y, out=y)


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype, copy=False)


def gelu_reference(x: np.ndarray, tanh: bool = False) -> np.ndarray:
    """GELU in float64 (Gelu-20: ``approximate`` "tanh" takes the tanh formula), returned in x's dtype."""
    xd = x.astype(np.float64)
    if tanh:
        inner = np.sqrt(2.0 / np.pi) * (xd + 0.044715 * xd * xd * xd)
        y = 0.5 * xd * (1.0 + np.tanh(inner))
    else:
        y = 0.5 * xd * (1.0 + erf(xd * np.sqrt(0.5)))
    return y.astype(x.dtype, copy=False)


def native_activation(x: np.ndarray, name: str, alpha: float = 0.0, beta: float = 0.0,
                      in_place: bool = False) -> np.ndarray | None:
    """``name`` over float32 ``x`` in the native library (one threaded pass, where numpy's erf or
    masked sigmoid take several), in ``x`` itself when ``in_place`` and it is writable and
    contiguous; None where the library is absent or ``x`` is not float32."""
    if x.dtype != np.float32 or not native.available():
        native.note_unavailable()
        return None
    if in_place and type(x) is np.ndarray and x.flags.c_contiguous and x.flags.writeable:
        return native.activation_(x, name, alpha, beta)
    y = np.ascontiguousarray(x) if not x.flags.c_contiguous else None  # a non-contiguous x: one copy
    return native.activation(x, name, alpha, beta) if y is None else native.activation(y, name, alpha, beta, out=y)


def activate(y: np.ndarray, name: str | None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """A kernel's fused epilogue: ``apply_activation``, in the native library where it runs (float32:
    one threaded pass in place, where numpy's erf or masked sigmoid make several)."""
    if name and name not in ("relu", "clip") and y.size:  # numpy's relu and clip are one in-place pass
        if name == "tanh" and type(y) is np.ndarray and y.dtype is _F32 and y.flags.writeable:
            # numpy's float32 tanh is vectorised (AVX2/AVX-512, NEON) and beat the library's tanh8 at
            # every size measured (EPYC, AVX-512: 6144 floats, a decoder Loop's attention Add + Tanh
            # each step, 1.2 against 4.8 us; 1M floats 165 against 546 us)
            return np.tanh(y, out=y)
        if y.size <= _SMALL_ACTIVATION and name == "sigmoid" and type(y) is np.ndarray \
                and y.dtype is _F32 and y.flags.writeable:
            # a native call with nothing converted (native.activation_) costs less than numpy's passes
            if not (native.available() and y.flags.c_contiguous):
                return _sigmoid_in_place(y)
        done = native_activation(y, name, alpha, beta, in_place=True)
        if done is not None:
            return done
    return apply_activation(y, name, alpha, beta)


def apply_activation(y: np.ndarray, name: str | None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """Apply a fused epilogue in place where possible and return the result: numpy, the reference
    the native epilogues are tested against."""
    if not name:
        return y
    if name == "relu":
        return np.maximum(y, 0, out=y)
    if name == "clip":
        return np.clip(y, alpha, beta, out=y)
    if name == "leaky_relu":
        return np.where(y >= 0, y, y * y.dtype.type(alpha))
    if name == "sigmoid":
        return _sigmoid(y)
    if name == "tanh":
        return np.tanh(y, out=y)
    if name == "hard_sigmoid":
        return _hard_sigmoid(y, alpha, beta)
    if name == "hard_swish":
        return y * _hard_sigmoid(y, 1.0 / 6.0, 0.5)
    if name == "swish":
        return y * _sigmoid(y)
    if name in ("gelu", "gelu_tanh"):
        return gelu_reference(y, name == "gelu_tanh")
    raise ValueError(f"unknown fused activation '{name}'")


_SIMPLE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish"}


def activation_as_epilogue(node, const) -> tuple[str, float, float] | None:
    """The (name, alpha, beta) epilogue a stand-alone activation node amounts to, or None.

    ``const(name)`` gives a constant input's value (Clip's bounds must be constant scalars).
    Used by the fusion pass and by the GPU kernel of stand-alone activations alike.
    """
    if node.domain == "optcli":
        return ("swish", 0.0, 0.0) if node.op_type == "Swish" else None
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in _SIMPLE:
        return _SIMPLE[node.op_type], 0.0, 0.0
    if node.op_type == "Gelu":
        return ("gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu"), 0.0, 0.0
    if node.op_type == "LeakyRelu":
        return "leaky_relu", float(node.attrs.get("alpha", 0.01)), 0.0
    if node.op_type == "HardSigmoid":
        return "hard_sigmoid", float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    if node.op_type == "Clip":
        bounds = []
        for index, attr, default in ((1, "min", -np.inf), (2, "max", np.inf)):
            name = node.inputs[index] if index < len(node.inputs) else ""
            if name:
                value = const(name)
                if value is None or value.size != 1:
                    return None
                bounds.append(float(np.asarray(value).reshape(-1)[0]))
            else:
                bounds.append(float(node.attrs.get(attr, default)))
        return "clip", bounds[0], bounds[1]
    return None


def epilogue(attrs: dict) -> tuple[str | None, float, float]:
    """The (name, alpha, beta) epilogue recorded on a fused node, or (None, 0, 0)."""
    return attrs.get("activation"), float(attrs.get("activation_alpha", 0.0)), float(attrs.get("activation_beta", 0.0))


QUANT_ATTR = "activation_quant"
"""The last stage of a fused epilogue: ``[scale, zero_point, qmin, qmax]`` of the optcli.FakeQuant
that followed the node (``passes/fuse_fake_quant.py``), applied after the activation and after
the result is cast to the output dtype, exactly where the stand-alone FakeQuant would run."""


def output_quant(attrs: dict) -> tuple[float, float, float, float] | None:
    q = attrs.get(QUANT_ATTR)
    return None if q is None else tuple(float(v) for v in q)  # type: ignore[return-value]


def fake_quantize(x: np.ndarray, scale: float, zero_point: float, qmin: float, qmax: float) -> np.ndarray:
    """Quantize to [qmin, qmax] (float32 division, round half to even) and dequantize, in x's dtype:
    onnxruntime's QuantizeLinear -> DequantizeLinear, bit for bit."""
    s = np.float32(scale)
    q = np.clip(np.rint(x.astype(np.float32, copy=False) / s) + np.float32(zero_point), qmin, qmax)
    return ((q - np.float32(zero_point)) * s).astype(x.dtype, copy=False)


def apply_output_quant(y: np.ndarray, attrs: dict) -> np.ndarray:
    """The fused FakeQuant of ``attrs``, if any (call on the result in its output dtype)."""
    q = output_quant(attrs)
    return y if q is None else fake_quantize(y, *q)


@kernel("Relu")
def relu(inputs, attrs):
    return [np.maximum(inputs[0], 0).astype(inputs[0].dtype, copy=False)]


def _native_or(x: np.ndarray, name: str, numpy_fn, alpha: float = 0.0, beta: float = 0.0) -> list[np.ndarray]:
    """A stand-alone activation: the native pass for float32, else ``numpy_fn()``."""
    y = native_activation(np.asarray(x), name, alpha, beta)
    return [numpy_fn() if y is None else y]


@kernel("Sigmoid")
def sigmoid(inputs, attrs):
    return _native_or(inputs[0], "sigmoid", lambda: _sigmoid(np.asarray(inputs[0])))


NUMPY_TANH_BELOW = 1024
"""Elements under which Tanh stays in numpy: np.tanh is one vectorised call (~1 us for 64 floats),
where a native call pays ~5-10 us of ctypes and array-address overhead (a decoder's Loop body runs
Tanh on one state row per iteration)."""


@kernel("Tanh")
def tanh(inputs, attrs):
    x = np.asarray(inputs[0])
    if x.size < NUMPY_TANH_BELOW:
        return [np.tanh(x)]
    return _native_or(x, "tanh", lambda: np.tanh(x))


@kernel("LeakyRelu")
def leaky_relu(inputs, attrs):
    x, alpha = inputs[0], float(attrs.get("alpha", 0.01))
    return _native_or(x, "leaky_relu", lambda: np.where(x >= 0, x, x * x.dtype.type(alpha)), alpha)


@kernel("HardSigmoid")
def hard_sigmoid(inputs, attrs):
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return _native_or(inputs[0], "hard_sigmoid", lambda: _hard_sigmoid(inputs[0], alpha, beta), alpha, beta)


@kernel("HardSwish")
def hard_swish(inputs, attrs):
    x = inputs[0]
    return _native_or(x, "hard_swish", lambda: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5))


@kernel("Clip")
def clip(inputs, attrs):
    x = inputs[0]
    # Opset < 11 carries min/max as attributes, later opsets as optional inputs.
    lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi, dtype=x.dtype))
    # Never alias the input; np.asarray also turns the numpy scalar a 0-d input gives back into an
    # array (np.array(..., copy=False) raises on it under numpy 2).
    return [x.copy() if out is x else np.asarray(out, dtype=x.dtype)]


@kernel("PRelu")
def prelu(inputs, attrs):
    """``x`` where x >= 0, ``slope * x`` elsewhere.  Where every slope is at most 1 that is
    ``max(x, slope * x)`` (at least 1: the min), one product and one in-place pass instead of
    np.where's mask and two temporaries: face detectors (MTCNN, BlazeFace) put a PRelu after
    every conv of small maps, where the where-form took ~30 us a step.  NaNs stay NaN either way."""
    x, slope = inputs
    done = _native_prelu(x, slope, attrs)
    if done is not None:
        return [done]
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        y = np.multiply(x, slope)
        if type(y) is np.ndarray and y.shape == x.shape and y.dtype == x.dtype:  # (a 0-d x gives a scalar)
            side = _slope_side(attrs, slope)
            if side is not None:
                return [(np.maximum if side < 0 else np.minimum)(x, y, out=y)]
    return [np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False)]


def prelu_layout(xshape: tuple[int, ...], sshape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """x of ``xshape`` as the [N, C, HW, lanes] of the native channel PRelu (kernels/host/epilogue.c)
    where a slope of ``sshape`` varies along one axis of x only (or none: one slope), or along one
    axis and the last with unit axes between (a blocked slope [1, Cb, 1, 1, B]); then the slope,
    flattened, is the kernel's [C * lanes].  None for any other broadcast (a slope along H and W),
    a slope with more dimensions than x, or an empty x."""
    if len(sshape) > len(xshape) or not all(xshape) or not xshape:
        return None
    full = (1,) * (len(xshape) - len(sshape)) + tuple(sshape)
    axes = [i for i, (d, e) in enumerate(zip(full, xshape)) if d != 1]
    if any(full[i] != xshape[i] for i in axes):
        return None
    if not axes:
        return 1, 1, math.prod(xshape), 1
    last = len(xshape) - 1
    if len(axes) == 1 and axes[0] == last:  # a dense layer's [rows, N]: a slope per column
        return 1, 1, math.prod(xshape[:-1]), xshape[-1]
    if len(axes) == 1:
        a = axes[0]
        return math.prod(xshape[:a]), xshape[a], math.prod(xshape[a + 1:]), 1
    if len(axes) == 2 and axes[1] == last:
        a = axes[0]
        return math.prod(xshape[:a]), xshape[a], math.prod(xshape[a + 1:last]), xshape[last]
    return None


NATIVE_PRELU_FROM = 4096
"""Elements of x from which PRelu takes the native pass: measured at 1 thread, numpy's product and
max in place 8.3 -> 6.4 us on [1, 28, 22, 22], 55 -> 38 us on [1, 10, 150, 150] (a face detector's
first map), a tie on [1, 48, 9, 9] (3888) and 0.3-0.8 us lost below (the native call's fixed cost)."""


def _native_prelu(x, slope, attrs) -> np.ndarray | None:
    """PRelu of float32 in the native library's one pass (a slope per channel, per column or one),
    or None where it does not apply (another dtype or broadcast, under ``NATIVE_PRELU_FROM``
    elements, no library).  The prepared call is kept in a bound step's memo while the same slope
    and x's shape come back."""
    if type(x) is not np.ndarray or x.dtype is not _F32 or x.size < NATIVE_PRELU_FROM \
            or not isinstance(slope, np.ndarray) or slope.dtype != _F32 or not native.available():
        return None
    memo = getattr(attrs, "memo", None)
    hit = memo.get("native prelu") if memo is not None else None
    if hit is None or hit[0] is not slope or hit[1] != x.shape:
        layout = prelu_layout(x.shape, slope.shape)
        flat = None if layout is None else np.ascontiguousarray(slope).reshape(-1)
        hit = (slope, x.shape, None if layout is None else native.prepared_channel_prelu(flat, layout, x.shape))
        if memo is not None:
            memo["native prelu"] = hit
    if hit[2] is None:
        return None
    return hit[2](x if x.flags.c_contiguous else np.ascontiguousarray(x))


def _slope_side(attrs, slope) -> int | None:
    """-1 where every slope is <= 1, 1 where every slope is >= 1, None otherwise (mixed, NaN, zero,
    infinite, empty);
    kept in a bound step's memo while the same slope array comes back (a plan's constant)."""
    memo = getattr(attrs, "memo", None)
    hit = memo.get("prelu side") if memo is not None else None
    if hit is not None and hit[0] is slope:
        return hit[1]
    s = np.asarray(slope)
    # a zero or infinite slope times an infinite or zero x is NaN, which the max/min would return
    # where x >= 0 wants x: those slopes take the where-form
    usable = s.size and bool(np.isfinite(s).all()) and not bool((s == 0).any())
    side = None if not usable else -1 if bool((s <= 1).all()) else 1 if bool((s >= 1).all()) else None
    if memo is not None:
        memo["prelu side"] = (slope, side)
    return side


# Shape functions (``optcli.ops.shape_functions``): PRelu's slope broadcasts against x (as its kernel does).
shape_fn(["Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Clip"])(first_input)
shape_fn("PRelu")(broadcast_inputs)
