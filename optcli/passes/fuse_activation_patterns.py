"""Recognise activations that exporters spell out as several elementwise nodes.

* ``x * Sigmoid(x)`` becomes ``optcli.Swish(x)`` (SiLU, as written by PyTorch before opset 22).
* hard-swish, ``x * Clip(x + 3, 0, 6) / 6`` in its usual spellings (``/ 6`` or ``* (1/6)``,
  applied before or after the product, operands in either order) and
  ``x * HardSigmoid(x, alpha=1/6, beta=0.5)``, becomes ``HardSwish(x)``.

One node instead of three to five means fewer launches and buffers, and lets
``fuse_conv_bias_activation`` put the activation into the preceding conv's epilogue.
``Clip(x, 0, 6)`` (relu6) is already one node and stays as it is.
"""

from __future__ import annotations

from typing import Any

from optcli.ir import OPTCLI_DOMAIN, Graph, Node
from optcli.passes._helpers.graph_queries import become, consumers, is_close, scalar_const, sole_consumer

NAME = "fuse_activation_patterns"
DESCRIPTION = "x*Sigmoid(x) -> Swish; x*Clip(x+3,0,6)/6 and x*HardSigmoid(x) -> HardSwish"


class _Matcher:
    """Pattern queries over one snapshot of the graph; ``used`` collects the matched nodes."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = consumers(graph)

    def inner(self, name: str, op_types: tuple[str, ...]) -> Node | None:
        """The producer of ``name`` when it is one of ``op_types`` and only feeds the pattern."""
        node = self.producers.get(name)
        if node is None or node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            return None
        return node if sole_consumer(self.graph, self.consumers, name) is not None else None

    def replaced(self, inner: list[Node], node: Node, old_inputs: list[str]) -> None:
        """Keep the maps current after ``inner`` went and ``node`` (once reading ``old_inputs``)
        became the fused op: cheaper than rebuilding them after every fusion."""
        for n, inputs in [*((n, n.inputs) for n in inner), (node, old_inputs)]:
            for out in n.outputs:
                if self.producers.get(out) is n:
                    del self.producers[out]
            for name in set(inputs):
                if name in self.consumers:
                    self.consumers[name] = [r for r in self.consumers[name] if r is not n]
        self.producers[node.outputs[0]] = node
        self.consumers.setdefault(node.inputs[0], []).append(node)

    def scalar(self, name: str) -> float | None:
        """A constant of one element that cannot grow the shape it is broadcast with."""
        c = self.graph.const(name)
        return scalar_const(self.graph, name) if c is not None and c.ndim <= 1 else None

    def operands(self, node: Node) -> list[tuple[str, str]]:
        """(a, b) and (b, a) for a commutative binary node."""
        a, b = node.input(0), node.input(1)
        return [(a, b), (b, a)]

    def relu6_shift(self, name: str) -> tuple[str, list[Node]] | None:
        """x when ``name`` is Clip(x + 3, 0, 6)."""
        clip = self.inner(name, ("Clip",))
        if clip is None:
            return None
        lo = scalar_const(self.graph, clip.input(1)) if clip.input(1) else clip.attrs.get("min")
        hi = scalar_const(self.graph, clip.input(2)) if clip.input(2) else clip.attrs.get("max")
        if not (is_close(lo, 0.0) and is_close(hi, 6.0)):
            return None
        add = self.inner(clip.input(0), ("Add",))
        if add is None:
            return None
        for x, c in self.operands(add):
            if is_close(self.scalar(c), 3.0) and not self.graph.is_constant(x):
                return x, [add, clip]
        return None

    def divided_by_six(self, node: Node) -> str | None:
        """v when ``node`` computes v / 6 or v * (1/6)."""
        if node.op_type == "Div" and is_close(self.scalar(node.input(1)), 6.0):
            return node.input(0)
        if node.op_type == "Mul":
            for v, c in self.operands(node):
                if is_close(self.scalar(c), 1.0 / 6.0):
                    return v
        return None

    def hard_sigmoid(self, name: str) -> tuple[str, list[Node]] | None:
        """x when ``name`` is HardSigmoid(x, 1/6, 0.5) or Clip(x + 3, 0, 6) / 6."""
        hs = self.inner(name, ("HardSigmoid",))
        if hs is not None:
            ok = is_close(hs.attrs.get("alpha", 0.2), 1.0 / 6.0) and is_close(hs.attrs.get("beta", 0.5), 0.5)
            return (hs.input(0), [hs]) if ok else None
        scale = self.inner(name, ("Div", "Mul"))
        v = self.divided_by_six(scale) if scale is not None else None
        found = self.relu6_shift(v) if v else None
        return (found[0], [*found[1], scale]) if found else None

    def hard_swish(self, node: Node) -> tuple[str, list[Node]] | None:
        """(x, nodes to remove) when ``node`` ends a hard-swish pattern."""
        if node.op_type == "Mul":
            for x, other in self.operands(node):
                found = self.hard_sigmoid(other)
                if found and found[0] == x:
                    return found
        v = self.divided_by_six(node) if node.op_type in ("Div", "Mul") else None
        prod = self.inner(v, ("Mul",)) if v else None
        if prod is not None:
            for x, other in self.operands(prod):
                found = self.relu6_shift(other)
                if found and found[0] == x:
                    return x, [*found[1], prod]
        return None

    def swish(self, node: Node) -> tuple[str, list[Node]] | None:
        if node.op_type != "Mul":
            return None
        for x, other in self.operands(node):
            sig = self.inner(other, ("Sigmoid",))
            if sig is not None and sig.input(0) == x:
                return x, [sig]
        return None


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"swish": 0, "hard_swish": 0}
    changed = True
    while changed:
        changed = False
        m = _Matcher(graph)
        removed: set[int] = set()
        for node in list(graph.nodes):
            if node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx"):
                continue
            if id(node) in removed:
                continue
            found, kind = m.swish(node), "swish"
            if found is None:
                found, kind = m.hard_swish(node), "hard_swish"
            if found is None:
                continue
            x, inner = found
            old_inputs = list(node.inputs)
            op, domain = ("Swish", OPTCLI_DOMAIN) if kind == "swish" else ("HardSwish", "")
            become(node, op, [x], domain)
            removed.update(id(n) for n in inner)
            for n in inner:
                graph.values.pop(n.outputs[0], None)
            counts[kind] += 1
            changed = True
            m.replaced(inner, node, old_inputs)
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return counts
