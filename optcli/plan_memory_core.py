"""Lifetimes and arena offsets of a plan's activations: what the compiler's memory planning pass
(``passes/plan_memory.py``), the `.nb` reader and the runtime all need.

It sits below both the compiler and the runtime (it imports only ``ir``), so the runtime never
imports a pass.  Lifetimes are derived from the steps alone; offsets are greedy-by-size (as in
TensorFlow Lite's planner): largest tensors first, each at the lowest 64-byte aligned offset that
does not collide with an already placed tensor alive at the same time.  With dynamic dims the
offsets are computed per input shape at run time (``plan_offsets``) and cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optcli.ir import Graph

ALIGN = 64


@dataclass
class MemoryPlan:
    lifetimes: dict[str, tuple[int, int]]  # value -> (first step that needs it, last step that reads it)
    free_after: list[list[str]]  # per step: values no later step reads
    offsets: dict[str, int] = field(default_factory=dict)  # empty when shapes are dynamic
    sizes: dict[str, int] = field(default_factory=dict)
    arena_bytes: int | None = None
    naive_bytes: int | None = None


def lifetimes_of(step_io: list[tuple[list[str], list[str]]], inputs: list[str], outputs: list[str],
                 constants: set[str]) -> tuple[dict[str, tuple[int, int]], list[list[str]]]:
    """Lifetimes of non-constant values over a linear list of (inputs, outputs) steps.

    Graph inputs are born at step -1; graph outputs live to the end.
    """
    last = len(step_io) - 1
    life: dict[str, list[int]] = {name: [-1, -1] for name in inputs}
    for i, (ins, outs) in enumerate(step_io):
        for name in outs:
            if name:
                life.setdefault(name, [i, i])
        for name in ins:
            if name and name not in constants and name in life:
                life[name][1] = i
    for name in outputs:
        if name in life:
            life[name][1] = max(last, life[name][0])
    free_after: list[list[str]] = [[] for _ in step_io]
    keep = set(outputs)
    for name, (_, end) in life.items():
        if end >= 0 and name not in keep:
            free_after[end].append(name)
    return {k: (a, b) for k, (a, b) in life.items()}, free_after


def plan_offsets(lifetimes: dict[str, tuple[int, int]], sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """Greedy-by-size placement; returns (offset per value, arena bytes).

    Which placed tensors collide with a new one is looked up per step (``alive_at``), not by a
    scan of everything placed so far: the cost follows how many tensors are alive at once, so a
    long chain plans in linear time instead of quadratic.
    """
    order = sorted(sizes, key=lambda n: (-sizes[n], lifetimes[n][0], n))
    start = min((first for first, _ in lifetimes.values()), default=0)
    stop = max((last for _, last in lifetimes.values()), default=0)
    alive_at: list[list[int]] = [[] for _ in range(stop - start + 1)]
    placed: list[tuple[int, int]] = []  # (offset, end) by placement order
    offsets: dict[str, int] = {}
    for name in order:
        size = _align(sizes[name])
        first, last = lifetimes[name]
        overlapping = {k for t in range(first - start, last - start + 1) for k in alive_at[t]}
        offset = 0
        for o, e in sorted(placed[k] for k in overlapping):
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[name] = offset
        for t in range(first - start, last - start + 1):
            alive_at[t].append(len(placed))
        placed.append((offset, offset + size))
    return offsets, max((e for _, e in placed), default=0)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_graph(graph: Graph) -> MemoryPlan:
    constants = set(graph.initializers)
    step_io = [(n.inputs, n.outputs) for n in graph.nodes]
    lifetimes, free_after = lifetimes_of(step_io, [v.name for v in graph.inputs],
                                         [v.name for v in graph.outputs], constants)
    plan = MemoryPlan(lifetimes, free_after)
    sizes = {}
    for name in lifetimes:
        shape, dtype = graph.shape_of(name), graph.dtype_of(name)
        if shape is None or dtype in (None, "unknown") or not all(isinstance(d, int) for d in shape):
            return plan  # dynamic: offsets are planned per shape at run time
        sizes[name] = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    plan.sizes = sizes
    plan.offsets, plan.arena_bytes = plan_offsets(lifetimes, sizes)
    plan.naive_bytes = sum(_align(s) for s in sizes.values())
    return plan
