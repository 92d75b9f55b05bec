"""Recognise layer normalisation spelled out as elementwise nodes and make it one
``LayerNormalization``.

Exporters below opset 17 (where ONNX gained LayerNormalization) write ``nn.LayerNorm`` as

    mean = ReduceMean(x, axes);  d = x - mean;  var = ReduceMean(Pow(d, 2), axes)
    y = d / Sqrt(var + eps)  [* gamma]  [+ beta]

nine nodes, three full passes over the activation and two reductions, in every transformer
block (twice).  One LayerNormalization computes the same statistics in one kernel; onnxruntime
fuses it the same way (LayerNormFusion).  ``Pow(d, 2)`` may also be ``d * d``, and ``/ Sqrt``
may be ``* Reciprocal(Sqrt)``.  ``gamma`` and ``beta`` are optional (an identity scale or a zero
shift was already removed by ``eliminate_identity``); missing, the scale is ones and there is
no bias.

Only when the reduced axes are the trailing ones (LayerNormalization normalises ``[axis, rank)``),
both reductions agree and keep dims, the normalised dims are static (the scale must be a
constant of that shape), gamma and beta only vary along those dims, and every intermediate is
read only by the pattern (``d`` exactly by its two readers).  Channels-first forms (mean over
axis 1 of NCHW) do not match: LayerNormalization cannot express them without transposes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Names, Node
from optcli.passes._helpers.graph_queries import become, consumers, drop_values, is_close, scalar_const, sole_consumer

NAME = "fuse_layer_norm"
DESCRIPTION = "ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] -> LayerNormalization"

FLOATS = ("float32", "float16", "float64")


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = consumers(graph)

    def readers(self, name: str) -> list[Node]:
        return [] if name in self.graph.output_names() else self.consumers.get(name, [])

    def reader(self, name: str, *op_types: str) -> Node | None:
        """The only reader of ``name`` when it is one of ``op_types`` without an epilogue."""
        node = sole_consumer(self.graph, self.consumers, name)
        ok = node is not None and node.op_type in op_types and node.domain in ("", "ai.onnx")
        return node if ok and not node.attrs.get("activation") and len(node.outputs) == 1 else None

    def axes(self, node: Node) -> tuple[int, ...] | None:
        """The reduced axes of a ReduceMean that keeps dims, or None (all axes, or not constant)."""
        if not int(node.attrs.get("keepdims", 1)):
            return None
        if node.input(1):
            c = self.graph.const(node.input(1))
            values = None if c is None else c.reshape(-1).tolist()
        else:
            values = node.attrs.get("axes")
        return tuple(int(a) for a in values) if values else None

    def normalized_axis(self, x: str, axes: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        """(LayerNormalization axis, normalised shape) when ``axes`` are x's trailing dims, static."""
        shape = self.graph.shape_of(x)
        if shape is None:
            return None
        rank = len(shape)
        norm = sorted(a + rank if a < 0 else a for a in axes)
        if len(set(norm)) != len(norm) or norm != list(range(rank - len(norm), rank)) or not norm:
            return None
        dims = shape[norm[0]:]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            return None
        return norm[0] - rank, tuple(int(d) for d in dims)

    def param(self, node: Node, x: str, dims: tuple[int, ...]) -> np.ndarray | None:
        """The constant operand of ``node`` (the other one being ``x``) as an array of shape
        ``dims`` when it only varies along those trailing dims."""
        if x not in node.inputs or len(node.inputs) != 2:
            return None
        other = node.input(1) if node.input(0) == x else node.input(0)
        c = self.graph.const(other)
        if c is None or not np.issubdtype(c.dtype, np.floating):
            return None
        shape = self.graph.shape_of(x)
        if shape is None or c.ndim > len(shape):
            return None
        lead = c.shape[: max(c.ndim - len(dims), 0)]
        tail = c.shape[len(lead):]
        if any(d != 1 for d in lead) or any(t not in (1, d) for t, d in zip(reversed(tail), reversed(dims))):
            return None
        return np.broadcast_to(c.reshape(tail), dims)

    def match(self, mean1: Node) -> dict | None:
        x = mean1.input(0)
        axes = self.axes(mean1)
        found = self.normalized_axis(x, axes) if axes else None
        if found is None or self.graph.dtype_of(x) not in FLOATS:
            return None
        axis, dims = found
        sub = self.reader(mean1.outputs[0], "Sub")
        if sub is None or sub.inputs != [x, mean1.outputs[0]]:
            return None
        d = sub.outputs[0]
        readers = self.readers(d)
        if len(readers) != 2:
            return None
        square = next((n for n in readers if n.domain in ("", "ai.onnx") and (
            (n.op_type == "Pow" and n.input(0) == d and is_close(self._scalar(n.input(1)), 2.0))
            or (n.op_type == "Mul" and n.inputs == [d, d]))), None)
        if square is None:
            return None
        mean2 = self.reader(square.outputs[0], "ReduceMean")
        if mean2 is None or self.axes(mean2) != axes:
            return None
        add_eps = self.reader(mean2.outputs[0], "Add")
        if add_eps is None:
            return None
        eps_name = add_eps.input(1) if add_eps.input(0) == mean2.outputs[0] else add_eps.input(0)
        eps = self._scalar(eps_name)
        if eps is None or eps < 0:
            return None
        sqrt = self.reader(add_eps.outputs[0], "Sqrt")
        if sqrt is None:
            return None
        inner = [mean1, sub, square, mean2, add_eps, sqrt]
        last = self.reader(sqrt.outputs[0], "Div", "Reciprocal")
        if last is not None and last.op_type == "Reciprocal":
            inner.append(last)
            last = self.reader(last.outputs[0], "Mul")
            if last is not None and set(last.inputs) != {d, inner[-1].outputs[0]}:
                return None
        elif last is not None and last.inputs != [d, sqrt.outputs[0]]:
            return None
        if last is None or next(n for n in readers if n is not square) is not last:
            return None
        scale = bias = None
        mul = self.reader(last.outputs[0], "Mul")
        scale = self.param(mul, last.outputs[0], dims) if mul is not None else None
        if scale is not None:
            inner.append(last)
            last = mul
        add = self.reader(last.outputs[0], "Add")
        bias = self.param(add, last.outputs[0], dims) if add is not None else None
        if bias is not None:
            inner.append(last)
            last = add
        return {"x": x, "axis": axis, "dims": dims, "eps": eps, "scale": scale, "bias": bias,
                "last": last, "inner": inner}

    def _scalar(self, name: str) -> float | None:
        c = self.graph.const(name)
        return scalar_const(self.graph, name) if c is not None and c.ndim <= 1 else None


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    m = _Matcher(graph)
    names = Names(graph)
    removed: set[int] = set()
    fused = 0
    for node in graph.nodes:
        if node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx") or id(node) in removed:
            continue
        found = m.match(node)
        if found is None or any(id(n) in removed for n in (found["last"], *found["inner"])):
            continue
        dtype = np.dtype(graph.dtype_of(found["x"]))
        base = found["last"].name or "layer_norm"
        scale = found["scale"] if found["scale"] is not None else np.ones(found["dims"])
        inputs = [found["x"], names.initializer(f"{base}_scale", np.ascontiguousarray(scale, dtype=dtype))]
        if found["bias"] is not None:
            inputs.append(names.initializer(f"{base}_bias", np.ascontiguousarray(found["bias"], dtype=dtype)))
        become(found["last"], "LayerNormalization", inputs,
               attrs={"axis": found["axis"], "epsilon": float(found["eps"])})
        removed.update(id(n) for n in found["inner"])
        drop_values(graph, *(n.outputs[0] for n in found["inner"]))
        fused += 1
    if removed:
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return {"fused": fused}
