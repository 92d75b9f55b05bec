"""What a plan's steps may say, checked at load against the ops' own definitions.

The reader (``optcli/nb/schema.py``) checks the file's form: types, ranges, extents, dataflow.
This checks each step against its op: the opset is one this onnx knows; inputs fill the op's
required slots and no more slots than it has; attributes have the type the op's ONNX schema gives
them (standard ops) or our own table (``optcli`` ops), the fused epilogue names a known
activation, and window attributes (pads, strides, dilations, kernel sizes, groups) are in range.
A fallback step's NodeProto goes through onnx's checker (``check_node``: attribute types,
arity, subgraphs).  Anything else is an ``NbFormatError`` at load, so a kernel never meets an
attribute it cannot read (before this, such a file loaded and its run raised a ``KernelError``
that blamed optcli).  Nothing is executed; the work is one pass over the steps.

Attributes an op does not define are left alone: kernels read only the ones they know.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from optcli.activation_codes import ACTIVATIONS
from optcli.errors import NbFormatError
from optcli.ops.activation import QUANT_ATTR
from optcli.plan import Plan, Step

INT64 = (-(2**63), 2**63 - 1)
INT32_MAX = 2**31 - 1
MIN_OPSET = 7
STANDARD = ("", "ai.onnx")
EPILOGUE = ("activation", "activation_alpha", "activation_beta", QUANT_ATTR)
# Ops whose window attributes size loops and launch grids (int32 kernel arguments on the GPU).
WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "QConv", "MaxPool", "AveragePool",
                        "LpPool", "MaxUnpool", "QLinearAveragePool"})
# Recurrent ops own attributes named like the fused epilogue's floats: their activation_alpha /
# activation_beta are lists (one per activation), checked against the op's schema instead.
RECURRENT_OPS = frozenset({("", "LSTM"), ("", "GRU"), ("", "RNN"), ("ai.onnx", "LSTM"), ("ai.onnx", "GRU"),
                           ("ai.onnx", "RNN"), ("com.microsoft", "DynamicQuantizeLSTM")})
WINDOW_LOW = {"pads": 0, "output_padding": 0, "output_shape": 0, "strides": 1, "dilations": 1, "kernel_shape": 1,
              "group": 1}
# optcli's own ops: (required input slots, most input slots, attributes: name -> type).
OPTCLI_OPS: dict[str, tuple[int, int, dict[str, str]]] = {
    **{op: (1, 1, {}) for op in ("Upload", "Download", "Pack", "Unpack", "Swish", "ToBlocked")},
    "FromBlocked": (1, 1, {"channels": "INT"}),
    "FakeQuant": (1, 1, {"scale": "FLOAT", "zero_point": "FLOAT", "qmin": "FLOAT", "qmax": "FLOAT"}),
    "ChannelAffine": (2, 3, {}),
    "FullyConnected": (2, 3, {}),
    "DynamicQuantizeMatMul": (3, 5, {}),
    "QConv": (2, 3, {"strides": "INTS", "pads": "INTS", "dilations": "INTS", "group": "INT", "kernel_shape": "INTS",
                     "auto_pad": "STRING", "x_scale": "FLOAT", "x_zero_point": "INT", "w_scale": "FLOATS",
                     "y_scale": "FLOAT", "y_zero_point": "INT", "qmin": "INT", "qmax": "INT", "x_signed": "INT",
                     "y_signed": "INT"}),
}
OPTCLI_OPS["QMatMul"] = (2, 3, {k: v for k, v in OPTCLI_OPS["QConv"][2].items()
                                if k.startswith(("x_", "w_", "y_", "q"))})  # QConv's, less the window
_QADD_ATTRS = ("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale", "y_zero_point", "qmin", "qmax")
OPTCLI_OPS["QAdd"] = (2, 2, {**{k: "FLOAT" if k.endswith("scale") else "INT" for k in _QADD_ATTRS},
                             "a_signed": "INT", "b_signed": "INT", "y_signed": "INT"})
_QGAP_ATTRS = ("x_scale", "x_zero_point", "y_scale", "y_zero_point", "qmin", "qmax")
_QMUL_ATTRS = (*_QGAP_ATTRS, "g_scale", "g_zero_point")
OPTCLI_OPS["QGlobalAveragePool"] = (1, 1, {**{k: "FLOAT" if k.endswith("scale") else "INT" for k in _QGAP_ATTRS},
                                           "x_signed": "INT", "y_signed": "INT"})
OPTCLI_OPS["QMul"] = (2, 2, {**{k: "FLOAT" if k.endswith("scale") else "INT" for k in _QMUL_ATTRS},
                             "x_signed": "INT", "g_signed": "INT", "y_signed": "INT"})
OPTCLI_OPS["QLookup"] = (2, 2, {})  # its table, a constant input: _constants_problem
_QDENSE_REQUIRED = frozenset({"x_scale", "x_zero_point", "w_scale", "y_scale", "y_zero_point", "qmin", "qmax"})
REQUIRED_ATTRS = {"QConv": _QDENSE_REQUIRED, "QMatMul": _QDENSE_REQUIRED,
                  "QAdd": frozenset(_QADD_ATTRS), "QGlobalAveragePool": frozenset(_QGAP_ATTRS),
                  "QMul": frozenset(_QMUL_ATTRS)}


def check_steps(plan: Plan, source: str) -> None:
    """Raise ``NbFormatError`` for the first step its op does not allow (see the module docstring)."""
    import onnx.defs

    newest = onnx.defs.onnx_opset_version()
    version = next((plan.opsets[d] for d in STANDARD if d in plan.opsets), None)
    if version is not None and not MIN_OPSET <= version <= newest:
        raise NbFormatError(f"{source}: the plan's ONNX opset is {version}; this optcli runs opsets {MIN_OPSET} to "
                            f"{newest}. Rebuild the file with this optcli's opt")
    for i, step in enumerate(plan.steps):
        where = f"{source}: step {i} '{step.name[:60]}' ({step.op_type})"
        problem = _problem(step, plan.opsets, version or newest) or _constants_problem(step, plan)
        if problem:
            raise NbFormatError(f"{where}: {problem}; the file is corrupted or was not written by optcli")
    _check_layouts(plan, source)


def _constants_problem(step, plan: Plan) -> str:
    """A QLookup's table is a constant uint8 / int8 tensor of 256 values (ops/qlookup.py).
    A QConv's weight and bias are constants of the plan, made by optcli's pass: int8 [M, C/g, KH, KW]
    and int32 [M], with 1 or M weight scales; a QMatMul's int8 [K, M] and int32 [M], 1 or M scales.  A
    crafted file's other dtypes would otherwise reach the kernel (a uint8 or bool weight read as int8) and
    fail there as a bug of ours."""
    if step.domain == "optcli" and step.op_type == "QLookup" and len(step.inputs) == 2:
        from optcli.ops.qlookup import check_table

        return check_table(plan.weights.get(step.inputs[1]))
    if step.domain != "optcli" or step.op_type not in ("QConv", "QMatMul") or len(step.inputs) < 2:
        return ""
    op, rank, m_axis = (step.op_type, 4, 0) if step.op_type == "QConv" else (step.op_type, 2, 1)
    w = plan.weights.get(step.inputs[1])
    if w is None or w.dtype != np.int8 or w.ndim != rank:
        return f"a {op}'s weight must be a constant int8 tensor of rank {rank}"
    m = w.shape[m_axis]
    if len(step.inputs) > 2 and step.inputs[2]:
        b = plan.weights.get(step.inputs[2])
        if b is None or b.dtype != np.int32 or b.shape != (m,):
            return f"a {op}'s bias must be a constant int32 tensor of {m} values"
    scales = step.attrs.get("w_scale")
    if isinstance(scales, (list, tuple)) and len(scales) not in (1, m):
        return f"{op} has {len(scales)} weight scales for {m} output channels"
    return ""


def _check_layouts(plan: Plan, source: str) -> None:
    """Every value is read in the layout it was written in: a kernel of the channel-blocked host
    layout (ops/blocked.py) reads blocked values where it says it does, every other kernel and
    the graph's outputs plain ones.  A blocked array handed to a plain kernel (or the reverse)
    would be read as a tensor of another shape."""
    from optcli.ops import get_kernel

    blocked: set[str] = set()
    for i, step in enumerate(plan.steps):
        kern = get_kernel(step.kernel)
        wants = kern.blocked_inputs if kern is not None else ()
        for k, name in enumerate(step.inputs):
            if name and (k in wants) != (name in blocked):
                have, want = ("blocked", "plain") if name in blocked else ("plain", "blocked")
                raise NbFormatError(f"{source}: step {i} '{step.name[:60]}' ({step.op_type}) reads value "
                                    f"'{name[:60]}' as {want}, but it is {have} (channel-blocked layout); the "
                                    "file is corrupted or was not written by optcli")
        if kern is not None and kern.blocked_outputs:
            blocked.update(o for o in step.outputs if o)
    for v in plan.outputs:
        if v.name in blocked:
            raise NbFormatError(f"{source}: output '{v.name[:60]}' is left in the channel-blocked layout; the file "
                                "is corrupted or was not written by optcli")


def _problem(step: Step, opsets: dict[str, int], version: int) -> str:
    if step.proto is not None:
        from optcli.runtime.body_checks import checked_copy

        proto, problem = checked_copy(step.proto, version, lambda s: _problem(s, opsets, version))
        reads = tuple(dict.fromkeys(n for n in step.inputs if n))
        return problem or _proto_problem(proto, tuple(sorted(opsets.items())), reads)
    problem = "" if (step.domain, step.op_type) in RECURRENT_OPS else _epilogue_problem(step.attrs)
    if problem:
        return problem
    if step.domain == "optcli":
        spec = OPTCLI_OPS.get(step.op_type)
        if spec is None:
            return ""  # the reader already refused ops without a kernel of ours
        need, most, types = spec
        slots = ["Single"] * need + ["Optional"] * (most - need)
        problem = _inputs_problem(step.inputs, slots, variadic=False)
        return problem or _attrs_problem(step, types, REQUIRED_ATTRS.get(step.op_type, set()))
    if step.domain not in STANDARD:
        return ""  # contrib ops (com.microsoft) have no schema in onnx; their kernels check their inputs
    schema = _schema(step.op_type, version)
    if schema is None:
        return f"op {step.op_type} is not an ONNX op this optcli knows"
    slots = [p.option.name for p in schema.inputs]
    variadic = bool(slots) and slots[-1] == "Variadic"
    problem = _inputs_problem(step.inputs, slots, variadic)
    if problem:
        return problem
    if len(step.outputs) > schema.max_output:
        return f"it has {len(step.outputs)} outputs, the op at most {schema.max_output}"
    types = {name: a.type.name for name, a in schema.attributes.items()}
    required = {name for name, a in schema.attributes.items() if a.required}
    return _attrs_problem(step, types, required)


@lru_cache(maxsize=512)
def _schema(op_type: str, version: int):
    """The op's ONNX schema at the plan's opset, else its newest one (fusion makes ops newer than a
    model's opset: Gelu, LayerNormalization, HardSwish), else None."""
    import onnx.defs

    for at in (version, onnx.defs.onnx_opset_version()):
        try:
            return onnx.defs.get_schema(op_type, at, "")
        except onnx.defs.SchemaError:
            continue
    return None


def _inputs_problem(inputs: list[str], slots: list[str], variadic: bool) -> str:
    if len(inputs) > len(slots) and not variadic:
        return f"it has {len(inputs)} inputs, the op at most {len(slots)}"
    for k, name in enumerate(inputs):
        slot = slots[min(k, len(slots) - 1)] if slots else "Optional"
        if not name and slot != "Optional":
            return f"its input {k} is required but absent"
    missing = [k for k, slot in enumerate(slots) if slot == "Single" and k >= len(inputs)]
    if missing:
        return f"its input {missing[0]} is required but absent"
    return ""


def _attrs_problem(step: Step, types: dict[str, str], required: set[str]) -> str:
    for name in sorted(required - set(step.attrs)):
        return f"required attribute '{name}' is missing"
    for name, value in step.attrs.items():
        kind = types.get(name)
        if kind is None:
            continue
        if not _of_type(value, kind):
            return f"attribute '{name[:40]}' must be {kind}, got {_describe(value)}"
        if step.op_type in WINDOW_OPS and name in WINDOW_LOW:
            values = value if isinstance(value, list) else [value]
            if not all(WINDOW_LOW[name] <= v <= INT32_MAX for v in values):
                return f"attribute '{name}' {_describe(value)} is out of range ({WINDOW_LOW[name]} to {INT32_MAX})"
    if step.domain == "optcli" and step.op_type == "FakeQuant":
        return _fake_quant_problem(step.attrs)
    if step.domain == "optcli" and step.op_type in ("QConv", "QMatMul", "QAdd", "QMul", "QGlobalAveragePool"):
        return _quantized_problem(step.attrs, step.op_type)
    return ""


def _quantized_problem(attrs: dict, op: str) -> str:
    """Scales positive, finite and normal in float32, with requantization ratios (QConv, QMatMul: x_scale *
    w_scale / y_scale; QAdd: a_scale / y_scale, b_scale / y_scale) that are positive normal float32 (a huge or
    tiny scale would make them inf or 0: every output one value); zero points and clamp bounds inside their
    dtypes."""
    if op in ("QConv", "QMatMul"):
        ins, scales = ("x",), [attrs["x_scale"], attrs["y_scale"], *attrs["w_scale"]]
        if not attrs["w_scale"]:
            return "QConv needs positive finite scales (x_scale, y_scale and one or more w_scale)"
    elif op == "QMul":
        ins, scales = ("x", "g"), [attrs["x_scale"], attrs["g_scale"], attrs["y_scale"]]
    elif op == "QGlobalAveragePool":
        ins, scales = ("x",), [attrs["x_scale"], attrs["y_scale"]]
    else:
        ins, scales = ("a", "b"), [attrs["a_scale"], attrs["b_scale"], attrs["y_scale"]]
    tiny = np.finfo(np.float32).tiny
    with np.errstate(all="ignore"):
        if not all(math.isfinite(s) and s > 0 and np.isfinite(np.float32(s)) and np.float32(s) >= tiny
                   for s in scales):
            return f"{op} needs positive finite scales" + (
                " (x_scale, y_scale and one or more w_scale)" if op in ("QConv", "QMatMul") else "")
        f32 = np.float32
        if op in ("QConv", "QMatMul"):
            ratios = f32(attrs["x_scale"]) * np.asarray(attrs["w_scale"], f32) / f32(attrs["y_scale"])
        elif op == "QMul":
            ratios = np.array([f32(attrs["x_scale"]) * f32(attrs["g_scale"]) / f32(attrs["y_scale"])])
        elif op == "QGlobalAveragePool":  # (divided by the pixel count at run time: a tiny result is exact)
            ratios = np.array([f32(attrs["x_scale"]) / f32(attrs["y_scale"])])
        else:
            ratios = np.array([f32(attrs["a_scale"]) / f32(attrs["y_scale"]),
                               f32(attrs["b_scale"]) / f32(attrs["y_scale"])])
    if not np.all(np.isfinite(ratios) & (ratios >= tiny)):
        return f"{op}'s scales give a requantization multiplier out of float32's range"
    for which in (*ins, "y"):
        signed = attrs.get(f"{which}_signed", 0)
        if signed not in (0, 1):
            return f"{op}'s '{which}_signed' must be 0 or 1"
        lo, hi = (-128, 127) if signed else (0, 255)
        if not lo <= attrs[f"{which}_zero_point"] <= hi:
            return f"{op}'s '{which}_zero_point' {attrs[f'{which}_zero_point']} is outside its dtype ({lo} to {hi})"
        if which == "y" and not lo <= attrs["qmin"] <= attrs["qmax"] <= hi:
            return f"{op}'s qmin and qmax must lie in {lo} to {hi} with qmin <= qmax"
    return ""


def _fake_quant_problem(attrs: dict) -> str:
    scale = attrs.get("scale")
    if scale is None or not (math.isfinite(scale) and scale > 0):
        return "FakeQuant needs a positive finite 'scale'"
    bounds = [attrs.get(k, d) for k, d in (("zero_point", 0.0), ("qmin", -128.0), ("qmax", 127.0))]
    if not all(math.isfinite(b) for b in bounds) or bounds[1] > bounds[2]:
        return "FakeQuant's zero point and bounds must be finite, with qmin <= qmax"
    return ""


def _epilogue_problem(attrs: dict) -> str:
    name = attrs.get("activation")
    if "activation" in attrs and name not in ACTIVATIONS:
        return f"fused activation {_describe(name)} is not one of {', '.join(ACTIVATIONS)}"
    for key in ("activation_alpha", "activation_beta"):
        if key in attrs and not (_of_type(attrs[key], "FLOAT") and not math.isnan(attrs[key])):
            return f"attribute '{key}' must be a number, got {_describe(attrs[key])}"
    if QUANT_ATTR in attrs:
        q = attrs[QUANT_ATTR]
        if not (_of_type(q, "FLOATS") and len(q) == 4):
            return f"attribute '{QUANT_ATTR}' must be [scale, zero_point, qmin, qmax], got {_describe(q)}"
        return _fake_quant_problem(dict(zip(("scale", "zero_point", "qmin", "qmax"), q)))
    return ""


def _int(v: Any) -> bool:
    return isinstance(v, int) and INT64[0] <= v <= INT64[1]  # bools are ints, as in ONNX (0/1)


def _float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPES = {
    "INT": _int,
    "FLOAT": _float,
    "STRING": lambda v: isinstance(v, (str, bytes)),
    "TENSOR": lambda v: isinstance(v, np.ndarray),
    "INTS": lambda v: isinstance(v, list) and all(_int(x) for x in v),
    "FLOATS": lambda v: isinstance(v, list) and all(_float(x) for x in v),
    "STRINGS": lambda v: isinstance(v, list) and all(isinstance(x, (str, bytes)) for x in v),
    "TENSORS": lambda v: isinstance(v, list) and all(isinstance(x, np.ndarray) for x in v),
}


def _of_type(value: Any, kind: str) -> bool:
    check = _TYPES.get(kind)
    return check is None or check(value)  # graphs and type protos live in the step's proto


def _describe(value: Any) -> str:
    text = repr(value.shape) if isinstance(value, np.ndarray) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@lru_cache(maxsize=256)
def _proto_problem(proto: bytes, opsets: tuple[tuple[str, int], ...], reads: tuple[str, ...]) -> str:
    """onnx's checker on a fallback step's node: attribute types, arity, subgraphs.  The node is
    checked inside a one-node graph whose inputs are every value the step reads, so subgraphs
    may refer to the outer values they use."""
    import onnx
    from onnx import checker, helper

    from optcli.runtime.body_checks import PLACEHOLDER_DOMAIN

    node = onnx.NodeProto()
    node.ParseFromString(proto)  # parsed once by the reader already
    imports = {("" if d == "ai.onnx" else d): v for d, v in opsets}
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in imports:
        return f"its node's domain '{node.domain[:40]}' has no opset in the file"
    ctx = checker.C.CheckerContext()
    ctx.ir_version = onnx.IR_VERSION
    ctx.opset_imports = {**imports, PLACEHOLDER_DOMAIN: 1}  # body nodes step checks judged (body_checks.py)
    def typed(name: str):
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [])  # the checker needs a type

    graph = helper.make_graph([node], "step", [typed(n) for n in reads], [typed(n) for n in node.output if n])
    try:
        checker.check_graph(graph, ctx, checker.C.LexicalScopeContext())
    except checker.ValidationError as exc:
        if "No Op registered" in str(exc) and domain == "" and _schema(node.op_type, imports[""]) is not None:
            return ""  # an op fusion made newer than the model's opset
        return f"its ONNX node is invalid ({' '.join(str(exc).split())[:160]})"
    except Exception as exc:  # noqa: BLE001 - whatever else the checker raises on hostile protobuf
        return f"its ONNX node cannot be checked ({type(exc).__name__})"
    return ""
