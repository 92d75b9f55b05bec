"""Recognise GELU spelled out as elementwise nodes and make it one ``Gelu`` node.

PyTorch exports ``nn.GELU`` at opsets below 20 (where ONNX has no Gelu) as five nodes,
``x * 0.5 * (1 + Erf(x / sqrt(2)))``, and the tanh approximation as eight or nine,
``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``.  Every transformer MLP and every
ConvNeXt block has one; as one node it is one pass over a large activation instead of five to
nine, and the exact form runs on the GPU (``map4`` with the Gelu code).  onnxruntime fuses the
same patterns (GeluFusion, FastGeluFusion).

The node made is ONNX ``Gelu`` (opset 20 semantics, ``approximate`` "none" or "tanh"); the
runtime has its own kernel for it whatever opset the model declares.  Matched spellings: the
erf argument as ``x / sqrt(2)`` or ``x * (1/sqrt(2))``; the cube as ``Pow(x, 3)``, ``x * x * x``
or ``x * (x * x)``; the outer half applied to ``x``, to the product, or to ``1 + f(...)``;
operands of Add/Mul in either order.  Constants must be single values equal to the formula's
to float32 precision, and every intermediate must be read only by the pattern.
"""

from __future__ import annotations

import math
from typing import Any

from optcli.ir import Graph, Node
from optcli.passes._helpers.graph_queries import become, consumers, drop_values, is_close, scalar_const, sole_consumer

NAME = "fuse_gelu"
DESCRIPTION = "x*0.5*(1+Erf(x/sqrt2)) -> Gelu; 0.5*x*(1+Tanh(sqrt(2/pi)*(x+0.044715*x^3))) -> Gelu(tanh)"

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = consumers(graph)

    def inner(self, name: str, op_type: str) -> Node | None:
        """The producer of ``name`` when it is ``op_type`` and ``name`` is read only once."""
        node = self.producers.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        if len(node.outputs) != 1 or node.attrs.get("activation"):
            return None
        return node if sole_consumer(self.graph, self.consumers, name) is not None else None

    def reader(self, name: str, op_type: str) -> Node | None:
        """The only reader of ``name`` when it is ``op_type``."""
        node = sole_consumer(self.graph, self.consumers, name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        return None if node.attrs.get("activation") or len(node.inputs) != 2 else node

    def scalar(self, name: str) -> float | None:
        """A constant single value that cannot grow the shape it is broadcast with."""
        c = self.graph.const(name)
        return scalar_const(self.graph, name) if c is not None and c.ndim <= 1 else None

    def times_const(self, node: Node | None, value: float) -> str | None:
        """v when ``node`` is ``Mul(v, value)`` in either order."""
        if node is None or node.op_type != "Mul":
            return None
        for v, c in ((node.input(0), node.input(1)), (node.input(1), node.input(0))):
            if is_close(self.scalar(c), value) and not self.graph.is_constant(v):
                return v
        return None

    def plus_one(self, name: str) -> Node | None:
        """The ``Add(name, 1)`` that is the only reader of ``name``."""
        add = self.reader(name, "Add")
        if add is None:
            return None
        other = add.input(1) if add.input(0) == name else add.input(0)
        return add if is_close(self.scalar(other), 1.0) else None

    def tail(self, x: str, one_plus: Node) -> tuple[Node, list[Node]] | None:
        """(last node, other nodes) of ``0.5 * x * one_plus`` in any association."""
        a = one_plus.outputs[0]
        m1 = self.reader(a, "Mul")
        if m1 is None:
            return None
        other = m1.input(1) if m1.input(0) == a else m1.input(0)
        if other == x:  # (x * a) * 0.5
            m2 = self.reader(m1.outputs[0], "Mul")
            if m2 is not None and self.times_const(m2, 0.5) == m1.outputs[0]:
                return m2, [m1]
            return None
        half_x = self.inner(other, "Mul")  # (x * 0.5) * a
        if half_x is not None and self.times_const(half_x, 0.5) == x:
            return m1, [half_x]
        if self.times_const(m1, 0.5) == a:  # x * (a * 0.5)
            m2 = self.reader(m1.outputs[0], "Mul")
            if m2 is not None and x in m2.inputs and set(m2.inputs) == {x, m1.outputs[0]}:
                return m2, [m1]
        return None

    def erf_form(self, erf: Node) -> tuple[str, Node, list[Node]] | None:
        arg = self.producers.get(erf.input(0))
        if arg is None or self.inner(erf.input(0), arg.op_type) is None:
            return None
        if arg.op_type == "Div" and is_close(self.scalar(arg.input(1)), SQRT2):
            x = arg.input(0)
        else:
            x = self.times_const(arg, 1.0 / SQRT2)
        if x is None or self.graph.is_constant(x):
            return None
        add = self.plus_one(erf.outputs[0])
        found = self.tail(x, add) if add is not None else None
        return (x, found[0], [arg, erf, add, *found[1]]) if found else None

    def cube(self, name: str, x: str) -> list[Node] | None:
        """The nodes computing ``x^3`` as ``name``: Pow(x, 3), (x*x)*x or x*(x*x)."""
        node = self.producers.get(name)
        if node is None or self.inner(name, node.op_type) is None:
            return None
        if node.op_type == "Pow":
            return [node] if node.input(0) == x and is_close(self.scalar(node.input(1)), 3.0) else None
        if node.op_type != "Mul" or x not in node.inputs:
            return None
        other = node.input(1) if node.input(0) == x else node.input(0)
        square = self.inner(other, "Mul")
        if square is not None and square.inputs == [x, x]:
            return [square, node]
        return None

    def tanh_form(self, tanh: Node) -> tuple[str, Node, list[Node]] | None:
        scaled = self.inner(tanh.input(0), "Mul")
        s = self.times_const(scaled, SQRT_2_OVER_PI)
        add = self.inner(s, "Add") if s else None
        if add is None:
            return None
        for x, q in ((add.input(0), add.input(1)), (add.input(1), add.input(0))):
            if self.graph.is_constant(x):
                continue
            qn = self.inner(q, "Mul")
            x3 = self.times_const(qn, CUBIC)
            cube = self.cube(x3, x) if x3 else None
            if cube is None:
                continue
            one_plus = self.plus_one(tanh.outputs[0])
            found = self.tail(x, one_plus) if one_plus is not None else None
            if found:
                return x, found[0], [*cube, qn, add, scaled, tanh, one_plus, *found[1]]
        return None


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"erf": 0, "tanh": 0}
    m = _Matcher(graph)
    removed: set[int] = set()
    for node in graph.nodes:
        if node.op_type not in ("Erf", "Tanh") or node.domain not in ("", "ai.onnx") or id(node) in removed:
            continue
        found = m.erf_form(node) if node.op_type == "Erf" else m.tanh_form(node)
        if found is None:
            continue
        x, last, inner = found
        if any(id(n) in removed for n in (last, *inner)) or graph.dtype_of(x) not in (None, "float32",
                                                                                    "float16", "float64"):
            continue
        kind = "erf" if node.op_type == "Erf" else "tanh"
        # The last node keeps its place and output; its readers are untouched.  The maps are
        # not updated: the nodes removed here are never looked at again (each is read only by
        # its own pattern), and ``last`` is only ever the end of one pattern.
        become(last, "Gelu", [x], attrs={"approximate": "none" if kind == "erf" else "tanh"})
        removed.update(id(n) for n in inner)
        drop_values(graph, *(n.outputs[0] for n in inner))
        counts[kind] += 1
    if removed:
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return counts
