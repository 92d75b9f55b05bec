"""Cost-aware placement: a small group of GPU nodes stranded between host nodes ("island") goes
back to the host when copying its data over and back costs more than the GPU would save.

An island is a connected group of GPU-placed nodes. Its transfer cost is a fixed latency per
crossing plus the bytes that would cross divided by a bus bandwidth; its saving is the work it
does (multiply-adds, or elements for memory-bound ops) times the difference between host and GPU
throughput. The constants (``optcli/targets/costs.py``) are deliberately rough (a mobile GPU
against one big CPU core): the point is to avoid the obvious losses, e.g. a lone Relu between
two host-only ops costing two copies and two layout conversions. Symbolic dims count at nominal
sizes (a batch as 1, any other dynamic dim as 64; ``optcli.targets.nominal``), or at
``--input_shapes`` when given (the frontend pins them). Off with ``opt
--disable_pass=keep_small_islands_on_host``.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Graph, Node
from optcli.passes.base import PassContext
from optcli.targets.costs import (
    BUS_BYTES_PER_S,
    COPY_LATENCY_S,
    GPU_ELEMENTS_PER_S,
    GPU_MACS_PER_S,
    HOST_ELEMENTS_PER_S,
    HOST_MACS_PER_S,
)
from optcli.targets.nominal import nominal_views

NAME = "keep_small_islands_on_host"
DESCRIPTION = "move GPU islands whose host<->device copies cost more than they save back to the host"



def _shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    shape = graph.shape_of(name)
    if shape is not None and not all(isinstance(d, int) for d in shape):
        # Symbolic dims count at their nominal sizes (batch 1, other dims 64: targets/nominal.py).
        views = nominal_views(graph)
        shape = views[0].shape_of(name) if views else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _elements(graph: Graph, name: str) -> int:
    shape = _shape(graph, name)
    return 0 if shape is None else int(np.prod(shape, dtype=np.int64))


def node_work(graph: Graph, node: Node) -> tuple[float, float]:
    """(multiply-adds, elements touched): a rough size of what a node computes."""
    out = sum(_elements(graph, o) for o in node.outputs if o)
    if node.op_type in ("Conv", "ConvTranspose"):
        w = graph.shape_of(node.input(1))
        if w and all(isinstance(d, int) for d in w):
            per_output = int(np.prod(w[1:]))
            return float(out * per_output), float(out)
    if node.op_type in ("Gemm", "MatMul", "FullyConnected"):
        w = _shape(graph, node.input(1))  # a run-time right operand may have symbolic dims
        if w:
            # the contraction axis: B's rows ([.., K, N]; a batched MatMul's leading axes are not K)
            k = w[-1] if node.op_type == "Gemm" and node.attrs.get("transB") else w[-2] if len(w) > 1 else w[0]
            return float(out * k), float(out)
    return 0.0, float(out + sum(_elements(graph, i) for i in node.inputs if i and i not in graph.initializers))


def _islands(graph: Graph, gpu: set[str]) -> list[list[Node]]:
    """Connected components of GPU-placed nodes (through values both produce/consume)."""
    on_gpu = [n for n in graph.nodes if n.target in gpu]
    parent = {id(n): id(n) for n in on_gpu}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    producers = graph.producers()
    for n in on_gpu:
        for name in n.inputs:
            p = producers.get(name)
            if p is not None and p.target in gpu:
                parent[find(id(n))] = find(id(p))
    groups: dict[int, list[Node]] = {}
    for n in on_gpu:
        groups.setdefault(find(id(n)), []).append(n)
    return list(groups.values())


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """Counts, and the estimates behind the moves (so ``opt`` can say why a model ended up on the
    host): ``gpu_nodes`` GPU-placed nodes before, ``nodes_moved`` of them moved, and the summed
    estimated per-run ``saving_ns`` (what the GPU would have saved) and ``copy_ns`` (what its
    copies would have cost) of the islands moved."""
    gpu = {t.name for t in ctx.targets if t.device == "gpu"}
    host = next((t for t in ctx.targets if t.device == "cpu"), None)
    if not gpu or host is None:
        return {"islands_moved": 0}
    overrides = ctx.placement_overrides
    consumers = graph.consumers()
    outputs = graph.output_names()
    moved = nodes_moved = 0
    moved_saving_s = moved_transfer_s = 0.0
    islands = _islands(graph, gpu)
    for island in islands:
        members = {id(n) for n in island}
        if any(overrides.get(n.name) or overrides.get(n.op_type) for n in island):
            continue  # the user placed these by hand
        if not all(host.can_run(n, graph)[0] for n in island):
            continue
        crossing_in = {i for n in island for i in n.inputs
                       if i and i not in graph.initializers
                       and not any(id(p) in members for p in [graph.producers().get(i)] if p is not None)}
        crossing_out = {o for n in island for o in n.outputs if o and (
            o in outputs or any(id(r) not in members for r in consumers.get(o, [])))}
        crossings = len(crossing_in) + len(crossing_out)
        moved_bytes = 4 * sum(_elements(graph, v) for v in crossing_in | crossing_out)
        transfer_s = crossings * COPY_LATENCY_S + moved_bytes / BUS_BYTES_PER_S
        macs = sum(node_work(graph, n)[0] for n in island)
        elements = sum(node_work(graph, n)[1] for n in island)
        saving_s = (macs * (1 / HOST_MACS_PER_S - 1 / GPU_MACS_PER_S)
                    + elements * (1 / HOST_ELEMENTS_PER_S - 1 / GPU_ELEMENTS_PER_S))
        if transfer_s > saving_s:
            decisions = ctx.results.placement
            for n in island:
                n.target = host.name
                decisions[n.name] = {"target": host.name, "reason": (
                    f"cost-aware: island of {len(island)} GPU node(s) saves {saving_s * 1e6:.0f} us but its "
                    f"{crossings} host<->device crossing(s) cost {transfer_s * 1e6:.0f} us")}
            moved += 1
            nodes_moved += len(island)
            moved_saving_s += saving_s
            moved_transfer_s += transfer_s
            ctx.warn(f"{len(island)} node(s) ({', '.join(sorted({n.op_type for n in island}))}) run on {host.name}: "
                     f"copying their data to the GPU and back would cost more than it saves (estimated "
                     f"{_us(transfer_s)} against {_us(saving_s)} per run; keep them on the GPU with "
                     f"--disable_pass={NAME})")
    return {"islands_moved": moved, "nodes_moved": nodes_moved, "gpu_nodes": sum(len(i) for i in islands),
            "saving_ns": round(moved_saving_s * 1e9), "copy_ns": round(moved_transfer_s * 1e9)}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"
