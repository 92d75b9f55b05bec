"""Validate a decoded `.nb` body and build the Plan from it.

Hostile files are expected (apps download `.nb` files): every field's type and range is checked
here before anything uses it.  This is the file's form only (types, ranges, extents, dataflow, the
memory plan), so the format can be read and tested without the kernel libraries; what needs them
(known targets and kernel ids, host/GPU borders, each step against its op, the derived shapes) is
checked by the runtime before it runs anything (``optcli/runtime/load_checks.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.errors import NbFormatError
from optcli.ir import Value
from optcli.nb.layout import ALIGN, SUPPORTED_DTYPES
from optcli.ops.weight_quant import SCHEMES, dequantize
from optcli.plan import Plan, Step
from optcli.plan_memory_core import MemoryPlan, lifetimes_of

MAX_RANK = 64
MAX_ELEMENTS = 2**62  # per declared shape: its byte size still fits an int64 (no dim beyond int64 either)


def _elements_bound(dims: list[int]) -> int:
    """The product of the non-zero dims: a shape with a zero dim holds nothing, but numpy still
    refuses to form it (``reshape`` raises) when the other dims overflow its index type, so the
    bound on elements applies to them too."""
    count = 1
    for d in dims:
        count *= d or 1
    return count


class _Checker:
    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, what: str) -> NbFormatError:
        return NbFormatError(f"{self.source}: malformed .nb body at {where}: {what}; the file is corrupted "
                             "or was not written by optcli")

    def get(self, d: dict, key: str, kind: type | tuple, where: str, optional: bool = False) -> Any:
        if key not in d:
            if optional:
                return None
            raise self.fail(where, f"missing field '{key}'")
        value = d[key]
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"{where}.{key}", f"expected {getattr(kind, '__name__', kind)}, "
                            f"got {type(value).__name__}")
        return value

    def str_list(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(where, "expected a list of strings")
        return value

    def value(self, d: Any, where: str) -> Value:
        if not isinstance(d, dict):
            raise self.fail(where, "expected a map")
        name = self.get(d, "name", str, where)
        dtype = self.get(d, "dtype", str, where)
        if dtype not in SUPPORTED_DTYPES and dtype != "unknown":
            raise self.fail(where, f"unsupported dtype '{dtype}'")
        shape = self.get(d, "shape", list, where, optional=True)
        if shape is not None:
            if len(shape) > MAX_RANK or not all(
                    d is None or isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
                    for d in shape):
                raise self.fail(where, f"bad shape {shape!r:.80}")
            if _elements_bound([d for d in shape if isinstance(d, int)]) > MAX_ELEMENTS:
                raise self.fail(where, f"shape {shape!r:.80} has more than 2^62 elements")
            shape = tuple(shape)
        return Value(name, dtype, shape)

    def tensor(self, d: dict, blob: memoryview, where: str) -> np.ndarray:
        dtype = self.get(d, "dtype", str, where)
        if dtype not in SUPPORTED_DTYPES:
            raise self.fail(where, f"unsupported dtype '{dtype}'")
        shape = self.get(d, "shape", list, where)
        if len(shape) > MAX_RANK or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                            for s in shape):
            raise self.fail(where, "bad shape")
        offset = self.get(d, "offset", int, where)
        nbytes = self.get(d, "nbytes", int, where)
        itemsize = np.dtype(dtype).itemsize
        if _elements_bound(shape) > MAX_ELEMENTS:  # zero dims included: numpy must be able to form the shape
            raise self.fail(where, f"shape {shape!r:.80} has more than 2^62 elements")
        count = 1
        for s in shape:
            count *= s
        if offset < 0 or offset % ALIGN or nbytes != count * itemsize or offset + nbytes > len(blob):
            raise self.fail(where, f"tensor extent (offset {offset}, {nbytes} bytes) is outside the weight "
                            "blob or misaligned")
        arr = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
        return arr

    def attr(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > 4:
            raise self.fail(where, "attribute nested too deeply")
        if isinstance(value, dict):
            if set(value) != {"$tensor"} or not isinstance(value["$tensor"], dict):
                raise self.fail(where, "attribute maps must be tagged tensors")
            t = value["$tensor"]
            data = self.get(t, "data", bytes, where)
            arr = self.tensor({**t, "offset": 0, "nbytes": len(data)}, memoryview(data), where)
            return arr.copy()
        if isinstance(value, list):
            return [self.attr(v, where, depth + 1) for v in value]
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        raise self.fail(where, f"unsupported attribute type {type(value).__name__}")


def plan_from_body(body: dict, blob: memoryview, source: str) -> Plan:
    c = _Checker(source)
    name = c.get(body, "name", str, "body")
    targets = c.str_list(c.get(body, "targets", list, "body"), "targets")
    opsets = c.get(body, "opsets", dict, "body")
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10_000
               for k, v in opsets.items()):
        raise c.fail("opsets", "expected a map of domain -> version")
    inputs = [c.value(v, f"inputs[{i}]") for i, v in enumerate(c.get(body, "inputs", list, "body"))]
    outputs = [c.value(v, f"outputs[{i}]") for i, v in enumerate(c.get(body, "outputs", list, "body"))]
    raw_values = c.get(body, "values", list, "body")
    described = [c.value(x, f"values[{i}]") for i, x in enumerate(raw_values)]
    values = {v.name: v for v in described}
    weights: dict[str, np.ndarray] = {}
    formats: dict[str, tuple[str, int]] = {}
    for i, w in enumerate(c.get(body, "weights", list, "body")):
        if not isinstance(w, dict):
            raise c.fail(f"weights[{i}]", "expected a map")
        wname = c.get(w, "name", str, f"weights[{i}]")
        if wname in weights:
            raise c.fail(f"weights[{i}]", f"duplicate weight '{wname}'")
        weights[wname] = c.tensor(w, blob, f"weights[{i}]")
        quant = c.get(w, "quant", dict, f"weights[{i}]", optional=True)
        if quant is not None:
            scheme, axis = _check_quant(c, quant, weights[wname], f"weights[{i}].quant")
            weights[wname] = dequantize(weights[wname], scheme, axis, quant["scales"])
            formats[wname] = (scheme, axis)
    steps = [_step(c, s, i, targets) for i, s in enumerate(c.get(body, "steps", list, "body"))]
    if any(s.domain in ("", "ai.onnx") for s in steps) and not ({"", "ai.onnx"} & set(opsets)):
        raise c.fail("opsets", "the default ONNX domain's version is missing")
    _check_names(c, inputs, outputs, described, weights)
    _check_dataflow(c, inputs, outputs, weights, steps)
    memory = _memory(c, c.get(body, "memory", dict, "body"), inputs, outputs, weights, steps)
    metadata = c.get(body, "metadata", dict, "body")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise c.fail("metadata", "expected a map of strings")
    return Plan(name, inputs, outputs, steps, weights, values, opsets, targets, memory, metadata, formats)


def _check_quant(c: _Checker, quant: dict, stored: np.ndarray, where: str) -> tuple[str, int]:
    scheme = c.get(quant, "scheme", str, where)
    if scheme not in SCHEMES or stored.dtype != np.dtype(SCHEMES[scheme]):
        raise c.fail(where, f"scheme '{scheme:.20}' does not match stored dtype {stored.dtype}")
    axis = c.get(quant, "axis", int, where)
    scales = c.get(quant, "scales", list, where)
    if scheme == "fp16":
        if scales:
            raise c.fail(where, "fp16 weights take no scales")
        return scheme, 0
    if not 0 <= axis < stored.ndim or len(scales) != stored.shape[axis] or not all(
            isinstance(s, float) and np.isfinite(s) and s > 0 for s in scales):
        raise c.fail(where, "per-channel scales do not match the weight")
    return scheme, axis


def _step(c: _Checker, s: Any, i: int, targets: list[str]) -> Step:
    where = f"steps[{i}]"
    if not isinstance(s, dict):
        raise c.fail(where, "expected a map")
    op, domain = c.get(s, "op", str, where), c.get(s, "domain", str, where)
    target, kid = c.get(s, "target", str, where), c.get(s, "kernel", str, where)
    if target not in targets:
        raise c.fail(where, f"target '{target}' is not among the file's targets")
    attrs_raw = c.get(s, "attrs", dict, where)
    attrs = {k: c.attr(v, f"{where}.attrs.{k}") for k, v in attrs_raw.items()}
    proto = c.get(s, "proto", bytes, where, optional=True)
    cpu_kernel = c.get(s, "cpu_kernel", str, where, optional=True)
    step = Step(op, domain, c.get(s, "name", str, where), target, kid,
                c.str_list(c.get(s, "inputs", list, where), f"{where}.inputs"),
                c.str_list(c.get(s, "outputs", list, where), f"{where}.outputs"), attrs, proto, cpu_kernel)
    if proto is not None:
        _check_proto(c, step, where)
    return step


def _check_proto(c: _Checker, step: Step, where: str) -> None:
    """A step's NodeProto (the fallback's, or a native op's subgraphs) parses and is this step's node."""
    import onnx  # only files with protos need protobuf parsing
    from google.protobuf.message import DecodeError

    node = onnx.NodeProto()
    try:
        node.ParseFromString(step.proto)
    except (DecodeError, ValueError, RuntimeError):
        raise c.fail(where, "fallback node proto does not parse") from None
    explicit = len(node.input)
    domain = "" if node.domain == "ai.onnx" else node.domain
    if node.op_type != step.op_type or domain != ("" if step.domain == "ai.onnx" else step.domain) or \
            list(node.input) != step.inputs[:explicit] or list(node.output) != step.outputs:
        raise c.fail(where, "fallback node proto does not match its step")


def _check_names(c: _Checker, inputs, outputs, described, weights) -> None:
    """Graph inputs and outputs are named, once each; a value is described once; no input is a weight."""
    for kind, values in (("inputs", inputs), ("outputs", outputs)):
        seen: set[str] = set()
        for i, v in enumerate(values):
            if not v.name:
                raise c.fail(f"{kind}[{i}]", "empty name")
            if v.name in seen:
                raise c.fail(f"{kind}[{i}]", f"'{v.name:.60}' is listed twice")
            seen.add(v.name)
    clash = {v.name for v in inputs} & set(weights)
    if clash:
        raise c.fail("inputs", f"'{sorted(clash)[0]:.60}' is both a graph input and a weight")
    if len(described) != len({v.name for v in described}):
        raise c.fail("values", "a value is described twice")


def _check_dataflow(c: _Checker, inputs, outputs, weights, steps) -> None:
    """Single assignment: every value is written once (a graph input, a weight, or one output of one
    step) and read only after it is written.  A second writer would make the value's shape (and
    its buffer) depend on which write a reader sees."""
    known = {v.name for v in inputs} | set(weights) | {""}
    for i, s in enumerate(steps):
        for name in s.inputs:
            if name not in known:
                raise c.fail(f"steps[{i}]", f"reads '{name:.60}', which no earlier step produces")
        written = [o for o in s.outputs if o]
        for name in written:
            if name in known:
                raise c.fail(f"steps[{i}]", f"writes '{name:.60}', which already has a value (a graph input, a "
                             "weight or an earlier step's output)")
        if len(set(written)) != len(written):
            raise c.fail(f"steps[{i}]", "writes one value twice")
        if not written:
            raise c.fail(f"steps[{i}]", "writes no value")
        known.update(written)
    for v in outputs:
        if v.name not in known:
            raise c.fail("outputs", f"output '{v.name:.60}' is never produced")


def _memory(c: _Checker, m: dict, inputs, outputs, weights, steps) -> MemoryPlan:
    # Lifetimes are derived again from the steps rather than trusted: a wrong one would free an
    # array before its last reader.
    lifetimes, free_after = lifetimes_of([(s.inputs, s.outputs) for s in steps], [v.name for v in inputs],
                                         [v.name for v in outputs], set(weights))
    offsets = c.get(m, "offsets", dict, "memory")
    if not all(isinstance(k, str) and k in lifetimes and isinstance(v, int) and v >= 0
               for k, v in offsets.items()):
        raise c.fail("memory.offsets", "expected a map of planned values -> non-negative offsets")
    arena = c.get(m, "arena_bytes", int, "memory", optional=True)
    naive = c.get(m, "naive_bytes", int, "memory", optional=True)
    return MemoryPlan(lifetimes, free_after, dict(offsets), {}, arena, naive)
