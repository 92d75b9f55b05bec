"""The in-memory graph every pass reads and rewrites.

A deliberately small IR (see docs/design.md for why not onnx-ir): values are named strings,
nodes list their input and output names, constants live in ``Graph.initializers`` as numpy
arrays.  An empty input name means "optional input not given", as in ONNX.

Fused ops produced by passes live in the ``optcli`` domain, or keep their ONNX op type with
extra ``activation*`` attributes (the fused epilogue, see ``optcli.ops.activation``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None
"""A dimension: a fixed size, a symbolic name (dynamic, bound at run time) or unknown."""

OPTCLI_DOMAIN = "optcli"


@dataclass
class Value:
    """Type and shape of a named tensor.  ``shape`` is None when the rank is unknown."""

    name: str
    dtype: str = "float32"
    shape: tuple[Dim, ...] | None = None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def nbytes(self) -> int | None:
        """Bytes this tensor takes when its shape is static, else None."""
        if not self.is_static:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(eq=False)  # nodes are compared by identity: two ops with equal fields are still two ops
class Node:
    """One operation.  ``target`` and ``kernel`` are filled by placement and kernel selection.

    ``proto`` keeps the serialized ONNX NodeProto for ops that run through the generic
    reference fallback (it may hold subgraphs, which the IR does not model).
    """

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    target: str | None = None
    kernel: str | None = None
    proto: bytes | None = None
    cpu_kernel: str | None = None  # for GPU-placed nodes: the host kernel used when no GPU is present

    def input(self, i: int) -> str:
        """Name of input ``i``, or "" when it is absent."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def describe(self) -> str:
        return f"node '{self.name}' ({self.op_type})" if self.name else f"unnamed {self.op_type} node"


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries
    def producers(self) -> dict[str, Node]:
        """Map value name -> node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Map value name -> nodes that read it (a node reading twice appears once)."""
        result: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in dict.fromkeys(i for i in n.inputs if i):
                result.setdefault(name, []).append(n)
        return result

    def output_names(self) -> set[str]:
        return {v.name for v in self.outputs}

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def const(self, name: str) -> np.ndarray | None:
        """The constant value of ``name``, or None when it is computed at run time."""
        return self.initializers.get(name) if name else None

    def shape_of(self, name: str) -> tuple[Dim, ...] | None:
        if name in self.initializers:
            return tuple(self.initializers[name].shape)
        v = self.values.get(name)
        return v.shape if v else None

    def dtype_of(self, name: str) -> str | None:
        if name in self.initializers:
            return str(self.initializers[name].dtype)
        v = self.values.get(name)
        return v.dtype if v else None

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return dict(sorted(counts.items()))

    # ---------------------------------------------------------------- rewriting
    def unique_name(self, base: str) -> str:
        """A value or node name not used anywhere in the graph yet (one scan of the graph per call:
        a pass that makes many names takes a ``Names`` instead)."""
        return Names(self).fresh(base)

    def add_initializer(self, base: str, array: np.ndarray) -> str:
        name = self.unique_name(base)
        self.initializers[name] = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
        return name

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` read ``new`` instead (graph outputs included)."""
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        for v in self.outputs:
            if v.name == old:
                # Graph outputs keep their public name: rename the producer's output instead.
                raise ValueError("replace_uses cannot rename a graph output; use bypass()")

    def bypass(self, node: Node, src: str) -> bool:
        """Remove ``node`` whose single output equals ``src`` in value.

        Readers of the output read ``src`` instead.  When the output is a graph output, the
        producer of ``src`` is renamed to produce it instead (only possible when ``src`` is not
        itself a graph input, initializer or read elsewhere).  Returns False when impossible.
        """
        out = node.outputs[0]
        if out in self.output_names():
            prod = self.producers().get(src)
            others = [c for c in self.consumers().get(src, []) if c is not node]
            if prod is None or others or src in self.output_names():
                return False
            prod.outputs = [out if o == src else o for o in prod.outputs]
            self.nodes.remove(node)
            return True
        self.nodes.remove(node)
        self.replace_uses(out, src)
        return True

    def remove_unused_initializers(self) -> int:
        used = {i for n in self.nodes for i in n.inputs} | self.output_names()
        dead = [k for k in self.initializers if k not in used]
        for k in dead:
            del self.initializers[k]
        return len(dead)

    def toposort(self) -> None:
        """Order nodes so that each runs after its producers (stable for sorted input)."""
        available = {v.name for v in self.inputs} | set(self.initializers) | {""}
        pending = list(self.nodes)
        ordered: list[Node] = []
        while pending:
            rest = []
            for n in pending:
                if all(i in available for i in n.inputs):
                    ordered.append(n)
                    available.update(n.outputs)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                names = ", ".join(n.describe() for n in rest[:3])
                from optcli.errors import ModelError

                raise ModelError(
                    f"graph '{self.name}' has a cycle or reads a value nobody produces "
                    f"(at {names}); check the model with onnx.checker"
                )
            pending = rest
        self.nodes = ordered


@functools.lru_cache(maxsize=4096)
def subgraph_outer_refs(proto: bytes) -> frozenset[str]:
    """Values of the enclosing graph that a node's subgraphs (If/Loop/Scan bodies) read by name."""
    import onnx  # only nodes with subgraphs get here

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    used: set[str] = set()
    defined: set[str] = set()

    def walk(g: onnx.GraphProto) -> None:
        defined.update(v.name for v in g.input)
        defined.update(t.name for t in g.initializer)
        defined.update(t.values.name for t in g.sparse_initializer)
        used.update(v.name for v in g.output)
        for n in g.node:
            used.update(i for i in n.input if i)
            defined.update(n.output)
            visit(n.attribute)

    def visit(attributes) -> None:
        for a in attributes:
            if a.type == onnx.AttributeProto.GRAPH:
                walk(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    walk(g)

    visit(node.attribute)
    # Over-approximates when a nested scope defines a name an outer one reads: safe.
    return frozenset(used - defined)


class Names:
    """Fresh value and node names for one pass run: scans the graph once and remembers what it
    handed out (``Graph.unique_name`` rescans the whole graph per call, which turns a pass over a
    big model quadratic)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        taken = set(graph.initializers) | set(graph.values)
        taken |= {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
        for n in graph.nodes:
            taken.update(n.inputs)
            taken.update(n.outputs)
            taken.add(n.name)
        self.taken = taken

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def initializer(self, base: str, array: np.ndarray) -> str:
        """Add ``array`` as a new initializer under a fresh name and return the name."""
        name = self.fresh(base)
        self.graph.initializers[name] = array if array.flags.c_contiguous else array.copy(order="C")
        return name
