"""Input-shape pinning (``--input_shapes``) and ONNX shape inference.

Pinning replaces symbolic dims of graph inputs with the sizes given, so shape inference can
make every downstream shape static (and the passes can fold shape arithmetic).  Dims left
symbolic stay symbolic: the runtime binds them per call.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx

from optcli.errors import ModelError, UsageError

MAX_ELEMENTS = 1 << 36  # 64 Gi elements: beyond any device; a typo like 1,3,2240000,224


def normalize_negative_dims(model: onnx.ModelProto) -> int:
    """Turn negative ``dim_value``s (paddle2onnx and older exporters write ``-1`` for "any size")
    into symbolic dims, on inputs, outputs and value_info of the main graph and every subgraph.

    onnxruntime and ``onnx.checker`` accept ``-1``; to us it is simply a dynamic dim, so
    ``--input_shapes`` can pin it and nothing downstream ever sees a negative size.  Each such dim
    gets its own symbol: two ``-1``s say nothing about being equal.  Returns how many were fixed.
    """
    fixed = 0
    for graph in _all_graphs(model.graph):
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            for i, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    d.Clear()
                    d.dim_param = f"{_identifier(vi.name)}_dim{i}"
                    fixed += 1
    return fixed


def _all_graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_graphs(g)


def _identifier(name: str) -> str:
    """A symbol-friendly spelling of a value name (symbols show up in messages and reports)."""
    return re.sub(r"\W", "_", name)[:40] or "value"


def parse_input_shapes(spec: str | None) -> dict[str, list[int]]:
    """Parse ``"x:1,3,224,224;y:1,10"`` into ``{"x": [1, 3, 224, 224], "y": [1, 10]}``."""
    result: dict[str, list[int]] = {}
    if not spec:
        return result
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--input_shapes: '{part}' is not NAME:D1,D2,...; e.g. x:1,3,224,224")
        try:
            shape = [int(d) for d in dims.replace(" ", "").split(",") if d != ""]
        except ValueError:
            raise UsageError(f"--input_shapes: dims of '{name}' must be whole numbers, got '{dims}'") from None
        if not shape and dims.strip():
            raise UsageError(f"--input_shapes: no dims given for '{name}'")
        if any(d <= 0 for d in shape):
            raise UsageError(f"--input_shapes: dims of '{name}' must be positive, got {shape}")
        if name in result:
            raise UsageError(f"--input_shapes: '{name}' is given twice")
        result[name] = shape
    return result


def apply_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], path: Path) -> None:
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    inputs = {vi.name: vi for vi in graph.input if vi.name not in inits}
    for name, shape in shapes.items():
        if name not in inputs:
            raise UsageError(f"--input_shapes names '{name}', which is not an input of {path}; "
                             f"inputs are: {', '.join(inputs) or '(none)'}")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) and len(dims) != len(shape):
            raise UsageError(f"--input_shapes: '{name}' has rank {len(dims)} in {path}, got {len(shape)} dims")
        if not len(dims):
            for _ in shape:
                inputs[name].type.tensor_type.shape.dim.add()
            dims = inputs[name].type.tensor_type.shape.dim
        for i, (d, size) in enumerate(zip(dims, shape)):
            if d.HasField("dim_value") and d.dim_value != size:
                raise UsageError(f"--input_shapes: dim {i} of '{name}' is fixed to {d.dim_value} in the "
                                 f"model; got {size}")
            d.Clear()
            d.dim_value = size
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        count = 1
        for d in dims:
            if d.HasField("dim_value"):  # negative dims were made symbolic by normalize_negative_dims
                count *= max(d.dim_value, 1)
        if count > MAX_ELEMENTS:
            raise ModelError(f"{path}: input '{name}' has an absurd shape "
                             f"{[d.dim_value or d.dim_param for d in dims]} ({count} elements); fix the model "
                             "or pin smaller dims with --input_shapes")


def infer_shapes(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False, data_prop=True)
    except Exception as exc:  # InferenceError / ValidationError: the model contradicts itself
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: shape inference fails: {first}; check the model with onnx.checker "
                         "and the dims given to --input_shapes") from None
