"""The Plan: the lowered, linear program a `.nb` file stores and the runtime executes.

Steps run in order; each names its kernel by id (``onnx.Conv.depthwise``), its target, the
values it reads and writes, and its attributes.  Weights are numpy arrays (memory-mapped from
the file at load).  The memory plan gives lifetimes and, for static shapes, arena offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optcli.ir import Graph, Value
from optcli.plan_memory_core import MemoryPlan, plan_graph

PRECISIONS = ("fp32", "fp16")
"""A plan's precision (its ``precision`` metadata): how its GPU tensors are stored (float or half);
math is float either way."""


@dataclass
class Step:
    op_type: str
    domain: str
    name: str
    target: str
    kernel: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    proto: bytes | None = None  # serialized NodeProto, only for the reference fallback
    cpu_kernel: str | None = None  # GPU steps: the host kernel used when no GPU is present


@dataclass
class Plan:
    name: str
    inputs: list[Value]
    outputs: list[Value]
    steps: list[Step]
    weights: dict[str, np.ndarray]
    values: dict[str, Value]
    opsets: dict[str, int]
    targets: list[str]
    memory: MemoryPlan
    metadata: dict[str, str] = field(default_factory=dict)
    weight_formats: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (scheme, axis) in the file

    def step_io(self) -> list[tuple[list[str], list[str]]]:
        return [(s.inputs, s.outputs) for s in self.steps]


def _renamed_proto(proto: bytes | None, inputs: list[str], outputs: list[str]) -> bytes | None:
    """The fallback NodeProto with the value names passes gave the node (they rename values
    when they remove identities or keep graph output names)."""
    if proto is None:
        return None
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    explicit = len(node.input)
    if list(node.input) == inputs[:explicit] and list(node.output) == outputs:
        return proto
    del node.input[:]
    node.input.extend(inputs[:explicit])
    del node.output[:]
    node.output.extend(outputs)
    return node.SerializeToString(deterministic=True)


def lower(graph: Graph, targets: list[str], memory: MemoryPlan | None = None,
          weight_formats: dict[str, tuple[str, int]] | None = None) -> Plan:
    """Turn a placed, kernel-selected graph into a Plan."""
    missing = [n.describe() for n in graph.nodes if not n.kernel or not n.target]
    if missing:
        raise RuntimeError(f"lowering needs placed, kernel-selected nodes; not done for {missing[:3]}")
    steps = [Step(n.op_type, n.domain, n.name, n.target, n.kernel, list(n.inputs), list(n.outputs),
                  dict(n.attrs), _renamed_proto(n.proto, n.inputs, n.outputs), n.cpu_kernel) for n in graph.nodes]
    used = {i for s in steps for i in s.inputs} | {v.name for v in graph.outputs}
    weights = {k: v for k, v in graph.initializers.items() if k in used}
    produced = {o for s in steps for o in s.outputs} | {v.name for v in graph.inputs}
    values = {k: v for k, v in graph.values.items() if k in produced and k not in weights}
    for v in [*graph.inputs, *graph.outputs]:
        values.setdefault(v.name, v)
    formats = {k: v for k, v in (weight_formats or {}).items() if k in weights}
    return Plan(graph.name, list(graph.inputs), list(graph.outputs), steps, weights, values,
                dict(graph.opsets), list(targets), memory or plan_graph(graph), dict(graph.metadata), formats)
