"""Performance advice: what in an optimized plan will be slow on its GPU target, why, and roughly
what it costs, naming the nodes.

Works on a ``Plan`` (so ``opt --advise``, the ``--report`` and ``optcli inspect`` all give the same
items).  Costs come from the rough device model of ``keep_small_islands_on_host`` (a mobile GPU
against one big CPU core) plus a per-launch overhead: they rank the items and say how much of the
model's estimated GPU time each is, they are not measurements (``optcli bench`` measures).
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from optcli.gpu.layout import c4, dims4
from optcli.plan import Plan, Step
from optcli.targets import TARGETS
from optcli.targets.costs import (
    BUS_BYTES_PER_S,
    COPY_LATENCY_S,
    GPU_ELEMENTS_PER_S,
    GPU_MACS_PER_S,
)

LAUNCH_S = 10e-6  # one kernel launch on a mobile GPU driver: dispatch and a pass over the grid
SHAPE_OPS = ("Reshape", "Transpose", "SpaceToDepth", "DepthToSpace", "Flatten", "Squeeze", "Unsqueeze")
MEMORY_BOUND_OPS = ("Concat", "Slice", "Split")
COPY_OPS = ("Upload", "Download", "Pack", "Unpack")
MIN_PADDED_SHARE = 0.01  # below this the padding is not worth a line
MAX_REASONS = 4
MAX_NODES = 8  # nodes named per item (the JSON report has them all)


def _shape(plan: Plan, name: str) -> tuple | None:
    if name in plan.weights:
        return tuple(plan.weights[name].shape)
    v = plan.values.get(name)
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)


def _elements(plan: Plan, name: str) -> int:
    shape = _shape(plan, name) if name else None
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


def _is_gpu(step: Step) -> bool:
    return TARGETS[step.target].device == "gpu"


def _is_copy(step: Step) -> bool:
    return step.domain == "optcli" and step.op_type in COPY_OPS


def _macs(plan: Plan, step: Step) -> float:
    out = sum(_elements(plan, o) for o in step.outputs if o)
    if step.op_type in ("Conv", "ConvTranspose") and len(step.inputs) > 1:
        w = _shape(plan, step.inputs[1])
        return float(out * int(np.prod(w[1:]))) if w else 0.0
    if step.op_type in ("Gemm", "MatMul", "FullyConnected") and len(step.inputs) > 1:
        w = _shape(plan, step.inputs[1])
        if w:
            # the contraction axis: B's rows ([.., K, N]; a batched MatMul's leading axes are not K)
            k = w[-1] if step.op_type == "Gemm" and step.attrs.get("transB") else w[-2] if len(w) > 1 else w[0]
            return float(out * k)
    return 0.0


def _touched(plan: Plan, step: Step) -> int:
    """Activation elements a step reads and writes (weights excluded)."""
    names = [*step.outputs, *(i for i in step.inputs if i not in plan.weights)]
    return sum(_elements(plan, n) for n in names if n)


def step_seconds(plan: Plan, step: Step) -> float:
    """Estimated GPU time of one step (copies: bus latency and bandwidth)."""
    if step.op_type in ("Upload", "Download"):
        return COPY_LATENCY_S + _elements(plan, step.inputs[0]) * 4 / BUS_BYTES_PER_S
    return LAUNCH_S + max(_macs(plan, step) / GPU_MACS_PER_S, _touched(plan, step) / GPU_ELEMENTS_PER_S)


def _item(rule: str, title: str, why: str, nodes: list[str], seconds: float, total: float,
          reasons: dict[str, int] | None = None) -> dict:
    item = {"rule": rule, "title": title, "why": why, "nodes": nodes, "est_us": round(seconds * 1e6, 1),
            "share": round(seconds / total, 4) if total else 0.0}
    if reasons:
        item["reasons"] = reasons
    return item


def advise(plan: Plan, report: dict | None = None) -> list[dict]:
    """Advice items, costliest first.  ``report`` (from ``opt``) adds the placement reasons."""
    gpu = [(i, s) for i, s in enumerate(plan.steps) if _is_gpu(s)]
    items: list[dict] = []
    if gpu:
        total = sum(step_seconds(plan, s) for _, s in gpu) or 1e-9
        items += _shape_ops(plan, gpu, total) + _padded_channels(plan, gpu, total) + _rgb_inputs(plan, total)
        items += _large_kernels(plan, gpu, total) + _memory_bound(plan, gpu, total)
        items += _host_steps(plan, report, total)
    elif any(TARGETS[t].device == "gpu" for t in plan.targets):
        items += _host_steps(plan, report, 1e-9)
    items += _reference_fallback(plan)
    return sorted(items, key=lambda it: -it["est_us"])


def _chains(plan: Plan, steps: list[tuple[int, Step]]) -> list[list[Step]]:
    """Group steps into chains where one reads another's output."""
    chains: list[list[Step]] = []
    owner: dict[str, list[Step]] = {}
    for _, s in steps:
        chain = next((owner[i] for i in s.inputs if i in owner), None)
        if chain is None:
            chain = []
            chains.append(chain)
        chain.append(s)
        for o in s.outputs:
            owner[o] = chain
    return chains


def _shape_ops(plan, gpu, total) -> list[dict]:
    found = [(i, s) for i, s in gpu if s.op_type in SHAPE_OPS]
    if not found:
        return []
    chains = _chains(plan, found)
    names = [" -> ".join(s.name for s in c) for c in chains]
    secs = sum(step_seconds(plan, s) for _, s in found)
    ops = sorted({s.op_type for _, s in found})
    return [_item("shape_ops_on_gpu", f"{len(found)} shape-only op(s) on the GPU path ({', '.join(ops)}) in "
                  f"{len(chains)} chain(s)",
                  "On the GPU a shape-only op is a full read and write of its tensor to re-lay the channel-packed "
                  "layout, plus a launch; the passes could not fold these chains away. Export the model without "
                  "them (e.g. do the reshuffle in the weights) or keep the tensors 4-D NCHW.",
                  names, secs, total)]


def _padded_channels(plan, gpu, total) -> list[dict]:
    padded = work = 0
    secs = 0.0
    nodes = []
    for _, s in gpu:
        if _is_copy(s) or not s.outputs or _shape(plan, s.outputs[0]) is None:
            continue
        shape = _shape(plan, s.outputs[0])
        if len(shape) > 4:
            continue
        n, c, h, w = dims4(shape)
        full = n * c4(c) * 4 * h * w
        waste = full - n * c * h * w
        work += full
        if waste:
            padded += waste
            share = waste / full
            secs += step_seconds(plan, s) * share
            nodes.append((share, f"{s.name} ({s.op_type}, {c} channels: {share:.0%} padded)"))
    if not nodes or not work or padded / work < MIN_PADDED_SHARE:
        return []
    nodes.sort(key=lambda t: -t[0])
    return [_item("channels_not_multiple_of_4", f"{len(nodes)} GPU op(s) produce channel counts that are not "
                  f"multiples of 4: {padded / work:.1%} of the packed output work is padding",
                  "The GPU layout stores channels in slices of 4 (NC4HW4); a tensor with C channels costs "
                  "ceil(C/4)*4. Channel counts that are multiples of 4 (better 8 or 16) waste nothing.",
                  [n for _, n in nodes], secs, total)]


def _rgb_inputs(plan, total) -> list[dict]:
    out = []
    for v in plan.inputs:
        packs = [s for s in plan.steps if s.op_type == "Upload" and s.inputs[0] == v.name and _is_gpu(s)]
        shape = _shape(plan, v.name)
        if not packs or shape is None or len(shape) != 4 or shape[1] != 3:
            continue
        pack = next((s for s in plan.steps if s.op_type == "Pack" and s.inputs[0] == packs[0].outputs[0]), None)
        secs = step_seconds(plan, packs[0]) + (step_seconds(plan, pack) if pack else 0.0)
        out.append(_item("rgb_input", f"input '{v.name}' is a 3-channel image {list(shape)}",
                         "It is uploaded as planar NCHW and converted to the channel-packed layout by a Pack "
                         "kernel, with one of every 4 lanes padding. A 4-channel (RGBA) input fills the slices "
                         "exactly and is what cameras and textures deliver, so the app's RGBA->RGB copy goes too.",
                         [s.name for s in (packs[0], pack) if s is not None], secs, total))
    return out


def _large_kernels(plan, gpu, total) -> list[dict]:
    found = []
    for _, s in gpu:
        if s.op_type not in ("Conv", "ConvTranspose") or len(s.inputs) < 2:
            continue
        w = _shape(plan, s.inputs[1])
        if w and len(w) == 4 and (w[2] > 3 or w[3] > 3):
            found.append((s, w[2], w[3]))
    if not found:
        return []
    secs = sum(step_seconds(plan, s) * (1 - 9 / (kh * kw)) for s, kh, kw in found)
    return [_item("kernels_larger_than_3x3", f"{len(found)} convolution(s) with kernels larger than 3x3",
                  "A kxk kernel costs k*k/9 times the multiply-adds of a 3x3 (5x5: 2.8x, 7x7: 5.4x) and has no "
                  "Winograd variant; two stacked 3x3 convolutions see as far for less. The estimate is the "
                  "share above a 3x3's cost.",
                  [f"{s.name} ({kh}x{kw})" for s, kh, kw in found], secs, total)]


def _memory_bound(plan, gpu, total) -> list[dict]:
    producer = {o: s for s in plan.steps for o in s.outputs}
    readers: dict[str, list[Step]] = {}
    for s in plan.steps:
        for i in s.inputs:
            readers.setdefault(i, []).append(s)
    found = []
    for _, s in gpu:
        if s.op_type not in MEMORY_BOUND_OPS:
            continue
        before = [producer[i] for i in s.inputs if i in producer]
        after = [r for o in s.outputs for r in readers.get(o, [])]
        if any(_is_gpu(p) and not _is_copy(p) for p in before) and any(_is_gpu(r) and not _is_copy(r) for r in after):
            found.append(s)
    if not found:
        return []
    secs = sum(step_seconds(plan, s) for s in found)
    return [_item("memory_bound_between_gpu_ops", f"{len(found)} cheap memory-bound op(s) between GPU ops "
                  f"({', '.join(sorted({s.op_type for s in found}))})",
                  "They compute nothing but read and write whole tensors: on a GPU each costs a launch and a "
                  "round trip through memory, often more than the convolution next to it on small tensors.",
                  [f"{s.name} ({s.op_type})" for s in found], secs, total)]


def _host_reason(step: Step, report: dict | None) -> str:
    if report:
        for r in report.get("steps", []):
            if r["name"] == step.name and r.get("reason"):
                return r["reason"]
    from optcli.gpu.registry import gpu_kernels_for

    if not gpu_kernels_for(step.op_type, step.domain):
        return f"no GPU kernel for {step.op_type}"
    return "the GPU kernel does not apply or the copies would cost more (opt --report has the reason)"


def _reasons(host: list[Step], report: dict | None) -> dict[str, int]:
    """Why the host steps are there: each distinct reason with how many ops it holds for."""
    counts: dict[str, int] = {}
    for s in host:
        reason = _host_reason(s, report)
        inner = re.search(r"\((?:opencl|metal): (.*)\)$", reason)  # the arm reason quotes the GPU's refusal
        reason = inner.group(1) if inner else reason
        reason = "cost-aware: the GPU island was too small for its copies" if reason.startswith("cost-aware") \
            else re.sub(r"'[^']*'", "a tensor", reason)
        counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _host_steps(plan, report, total) -> list[dict]:
    host = [s for s in plan.steps if not _is_gpu(s)]
    if not host:
        return []
    gpu_names = [t for t in plan.targets if TARGETS[t].device == "gpu"]
    if not any(_is_gpu(s) for s in plan.steps):
        return [_item("ops_on_cpu", f"every op runs on the CPU although the plan targets {', '.join(gpu_names)}",
                      "No op was placed on the GPU: either it has no kernel there, or the GPU islands were so small "
                      "that copying their data over and back would cost more than they save (opt "
                      "--disable_pass=keep_small_islands_on_host keeps them on the GPU).",
                      [f"{s.name} ({s.op_type})" for s in host], 0.0, total, _reasons(host, report))]
    graph_in = {v.name for v in plan.inputs}
    graph_out = {v.name for v in plan.outputs}
    border = [s for s in plan.steps if s.op_type in ("Upload", "Download") and _is_gpu(s)
              and not (s.op_type == "Upload" and s.inputs[0] in graph_in)
              and not (s.op_type == "Download" and s.outputs[0] in graph_out)]
    secs = sum(step_seconds(plan, s) for s in border)
    moved = sum(_elements(plan, s.inputs[0]) * 4 for s in border)
    return [_item("ops_on_cpu", f"{len(host)} op(s) run on the CPU, costing {len(border)} host<->device copies "
                  f"({moved / 1e3:.1f} kB) per run",
                  "Every crossing between the GPU and the host is a blocking copy and a layout conversion. "
                  "Where a GPU kernel is missing the op could be replaced in the model; --placement_config can "
                  "move ops to one side to merge islands.",
                  [f"{s.name} ({s.op_type})" for s in host], secs, total, _reasons(host, report))]


def _reference_fallback(plan) -> list[dict]:
    found = [s for s in plan.steps if TARGETS[s.target].uses_fallback(s.kernel)]
    if not found:
        return []
    return [{"rule": "generic_fallback", "title": f"{len(found)} op(s) run on the generic onnx reference fallback",
             "why": "The fallback is the onnx reference implementation in Python: correct but often 10-100x slower "
                    "than a native kernel; no cost estimate is possible.",
             "nodes": [f"{s.name} ({s.op_type})" for s in found], "est_us": 0.0, "share": 0.0}]


def format_advice(items: list[dict], width: int = 80) -> str:
    """The advice as text for a terminal of ``width`` columns."""
    if not items:
        return "advice: nothing stands out"
    lines = ["advice (estimated costs from a rough mobile-GPU model; `optcli bench` measures):"]
    for k, it in enumerate(items, 1):
        cost = f" [~{it['est_us']:.0f} us, {it['share']:.0%} of est. GPU time]" if it["est_us"] else ""
        lines += textwrap.wrap(f"{k}. {it['title']}{cost}", width, subsequent_indent="   ")
        lines += textwrap.wrap(it["why"], width, initial_indent="   ", subsequent_indent="   ")
        for reason, count in list(it.get("reasons", {}).items())[:MAX_REASONS]:
            lines += textwrap.wrap(f"- {reason} ({count} op{'s' if count > 1 else ''})", width, initial_indent="   ",
                                   subsequent_indent="     ")
        shown = it["nodes"][:MAX_NODES]
        more = f" (+{len(it['nodes']) - len(shown)} more)" if len(it["nodes"]) > len(shown) else ""
        lines += textwrap.wrap("nodes: " + "; ".join(shown) + more, width, initial_indent="   ",
                               subsequent_indent="     ")
    return "\n".join(lines)
