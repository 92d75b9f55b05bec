"""Give a Reshape whose target is assembled from run-time dims a constant target with 0 / -1.

PyTorch traces ``x.view(B, N, heads, -1)`` with a dynamic batch or sequence length as

    Shape(t) -> Gather(0) -> Unsqueeze -+
    Shape(t) -> Gather(1) -> Unsqueeze -+-> Concat(.., [heads], [-1]) -> Reshape(x, .)

three to seven nodes per view, several views per attention block, all recomputed at run time
although each piece only says "the same size as before".  When every piece of the Concat is a
constant or a dim read back from some tensor's shape, the target becomes a constant: a static
dim is written as its number; a dynamic dim that shape inference proves equal to the reshaped
tensor's dim at the same position is written ``0`` (Reshape copies it, ``allowzero`` being 0); at
most one other dynamic dim is written ``-1`` (Reshape infers it from the element count, which the
original target preserved too).  Otherwise the node is left as it is.  The shape chain becomes
dead and ``remove_dead_nodes`` takes it.  onnxruntime does the same (ReshapeFusion).

Dim sources understood: ``Unsqueeze(Gather(Shape(t), i))``, ``Gather(Shape(t), [i, ...])``,
``Slice(Shape(t), a, b)`` with unit steps, ``Shape(t, start, end)`` itself, and each of those
through ``Cast`` to int64 or ``Unsqueeze``/``Reshape`` to one dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Dim, Graph, Names, Node

NAME = "fold_dynamic_reshape_shapes"
DESCRIPTION = "Reshape(x, Concat(Shape/Gather dims, constants)) -> Reshape(x, constant target with 0/-1)"

Source = tuple[str, int]  # (tensor whose shape it is, dim index, normalised)


class _Dims:
    """Which tensor dims a small int64 value holds, element by element, when it can be told."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()

    def ints(self, name: str) -> list[int] | None:
        c = self.graph.const(name)
        if c is None or not np.issubdtype(c.dtype, np.integer) or c.ndim > 1:
            return None
        return [int(v) for v in c.reshape(-1)]

    def rank(self, name: str) -> int | None:
        shape = self.graph.shape_of(name)
        return None if shape is None else len(shape)

    def of(self, name: str) -> list[Source] | None:
        node = self.producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        op = node.op_type
        if op == "Shape":
            rank = self.rank(node.input(0))
            if rank is None:
                return None
            indices = range(rank)[slice(node.attrs.get("start", 0), node.attrs.get("end", rank))]
            return [(node.input(0), i) for i in indices]
        if op == "Cast":
            return self.of(node.input(0)) if node.attrs.get("to") == 7 else None  # int64 only
        if op in ("Unsqueeze", "Reshape", "Squeeze"):
            # A one-element value keeps its one element whatever the rank it is given.
            inner = self.of(node.input(0))
            return inner if inner is not None and len(inner) == 1 else None
        if op == "Gather":
            return self._gather(node)
        if op == "Slice":
            return self._slice(node)
        return None

    def _gather(self, node: Node) -> list[Source] | None:
        if int(node.attrs.get("axis", 0)) != 0:
            return None
        whole = self.of(node.input(0))
        indices = self.ints(node.input(1))
        if whole is None or indices is None:
            return None
        n = len(whole)
        if any(not -n <= i < n for i in indices):
            return None
        return [whole[i] for i in indices]

    def _slice(self, node: Node) -> list[Source] | None:
        whole = self.of(node.input(0))
        starts, ends = self.ints(node.input(1)), self.ints(node.input(2))
        axes = self.ints(node.input(3)) if node.input(3) else [0]
        steps = self.ints(node.input(4)) if node.input(4) else [1]
        if whole is None or starts is None or ends is None or axes not in ([0], [-1]) or steps != [1]:
            return None
        if len(starts) != 1 or len(ends) != 1:
            return None
        return whole[slice(starts[0], ends[0])]


def _same_dim(graph: Graph, source: Source, data: str, position: int, data_shape: tuple[Dim, ...] | None) -> bool:
    """Is dim ``position`` of ``data`` provably the dim ``source`` names?"""
    if source == (data, position):
        return True
    src_shape = graph.shape_of(source[0])
    if data_shape is None or src_shape is None or position >= len(data_shape):
        return False
    a, b = src_shape[source[1]], data_shape[position]
    return isinstance(a, str) and a == b  # one symbol, one size: shape inference's promise


def target(graph: Graph, dims: _Dims, reshape: Node) -> list[int] | None:
    """The constant target for ``reshape``, or None when its Concat cannot be read."""
    concat = dims.producers.get(reshape.input(1))
    if concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx"):
        return None
    if int(concat.attrs.get("axis", 0)) not in (0, -1):
        return None
    data = reshape.input(0)
    data_shape = graph.shape_of(data)
    spec: list[int] = []
    free: list[int] = []  # positions of dynamic dims that are not provably copies
    for part in concat.inputs:
        values = dims.ints(part)
        if values is not None:
            spec.extend(values)
            free.extend(len(spec) - len(values) + i for i, v in enumerate(values) if v == -1)
            continue
        sources = dims.of(part)
        if sources is None:
            return None
        for source in sources:
            position = len(spec)
            d = graph.shape_of(source[0])[source[1]]
            if isinstance(d, int):
                if d <= 0:
                    return None  # an empty dim: 0 in the target would mean "copy"
                spec.append(d)
            elif _same_dim(graph, source, data, position, data_shape):
                spec.append(0)
            else:
                spec.append(-1)
                free.append(position)
    if len(free) > 1:
        return None
    out_shape = graph.shape_of(reshape.outputs[0])
    if out_shape is not None and len(out_shape) != len(spec):
        return None
    return spec


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    dims = _Dims(graph)
    names = Names(graph)
    folded = 0
    for node in graph.nodes:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        if int(node.attrs.get("allowzero", 0)) or graph.is_constant(node.input(1)):
            continue
        spec = target(graph, dims, node)
        if spec is None:
            continue
        node.inputs = [node.inputs[0], names.initializer(f"{node.name or 'reshape'}_shape",
                                                         np.array(spec, dtype=np.int64))]
        node.proto = None
        folded += 1
    return {"folded": folded}
