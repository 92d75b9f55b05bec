"""Auto-tuning: time the candidate kernel variants and work-group sizes of each GPU step on this
device, keep the fastest, and remember it.

``optcli.load(..., tune="fast"|"normal"|"exhaustive")`` and ``opt --tune=...`` (run on the
machine whose device it tunes) use it.  Winners are stored in the tuning cache, one file per
device (keyed by device name, driver, platform and optcli version) under the per-user cache
directory; entries are keyed by the op, its attributes, its shapes and the precision, so a later
tuned load of any model with the same layer reuses them without timing anything.

Levels: ``fast`` tries the kernel variants with the driver's work-group size; ``normal`` also a
few work-group shapes; ``exhaustive`` a wide grid of them.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass

import numpy as np

from optcli.errors import UsageError
from optcli.gpu.ops_layout import TRANSFER_OPS
from optcli.gpu.registry import gpu_kernels_for
from optcli.ir import Graph, Node, Value
from optcli.progress import progress
from optcli.runtime.gpu_common.disk_cache import cache_root, private_dir, read_entry, write_entry
from optcli.runtime.opencl.program_cache import device_key
from optcli.runtime.opencl.waits import drain

LEVELS = ("fast", "normal", "exhaustive")
_LOCAL_SIZES = {
    "fast": [None],
    "normal": [None, (8, 8, 1), (16, 4, 1), (4, 4, 4)],
    "exhaustive": [None, (4, 4, 1), (8, 4, 1), (8, 8, 1), (16, 4, 1), (16, 8, 1), (32, 4, 1), (4, 4, 4),
                   (8, 8, 2), (2, 2, 16), (1, 1, 64), (64, 1, 1), (128, 1, 1), (256, 1, 1)],
}


@dataclass
class Choice:
    kernel: str
    local_size: tuple[int, ...] | None
    time_us: float


class TuningCache:
    """Winners per (op, attributes, shapes, precision) for one device."""

    def __init__(self, device, root=None):
        folder = private_dir((root or cache_root()) / "tuning") if private_dir(root or cache_root()) else None
        name = hashlib.sha256(device_key(device).encode()).hexdigest()[:24]
        self.path = folder / f"{name}.json" if folder else None
        self.entries: dict[str, dict] = {}
        if self.path is not None:
            payload = read_entry(self.path)
            if payload is not None:
                try:
                    loaded = json.loads(payload)
                    self.entries = loaded if isinstance(loaded, dict) else {}
                except ValueError:
                    self.entries = {}

    def get(self, key: str) -> Choice | None:
        e = self.entries.get(key)
        if not isinstance(e, dict) or not isinstance(e.get("kernel"), str):
            return None
        local, time_us = e.get("local_size"), e.get("time_us", 0)
        # An entry of the wrong shape (another version's file) is ignored and tuned again.
        if local is not None and not (isinstance(local, list) and 1 <= len(local) <= 3 and all(
                isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 4096 for n in local)):
            return None
        if not isinstance(time_us, (int, float)) or isinstance(time_us, bool):
            return None
        return Choice(e["kernel"], tuple(local) if local is not None else None, float(time_us))

    def put(self, key: str, choice: Choice) -> None:
        self.entries[key] = {"kernel": choice.kernel, "local_size": list(choice.local_size) if choice.local_size
                             else None, "time_us": round(choice.time_us, 2)}

    def save(self) -> None:
        """Keep the winners for the next load; a read-only or full cache only loses that."""
        if self.path is not None and not write_entry(self.path, json.dumps(self.entries, sort_keys=True).encode()):
            warnings.warn(f"optcli: cannot write the tuning cache {self.path}; the tuning results are used "
                          "for this load only", stacklevel=2)


def step_signature(step, shapes: dict, precision: str) -> str:
    attrs = {k: (list(v.shape) if isinstance(v, np.ndarray) else v) for k, v in sorted(step.attrs.items())}
    ins = [list(shapes.get(i, ())) for i in step.inputs]
    outs = [list(shapes.get(o, ())) for o in step.outputs]
    text = json.dumps([step.op_type, step.domain, attrs, ins, outs, precision], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def plan_graph(plan) -> Graph:
    """A read-only Graph view of a plan, enough for GPU kernels' ``check`` functions."""
    return Graph(plan.name, [], list(plan.inputs), list(plan.outputs), dict(plan.weights), dict(plan.values),
                 dict(plan.opsets))


def _time(bound, queue, repeats: int) -> float:
    for b in bound:
        b.enqueue(queue)
    drain(queue)
    start = time.perf_counter()
    for _ in range(repeats):
        for b in bound:
            b.enqueue(queue)
    drain(queue)
    return (time.perf_counter() - start) / repeats * 1e6


def tune(gpu_steps, level: str, repeats: int = 5, cache: TuningCache | None = None) -> dict[int, Choice]:
    """Tune every GPU compute step of a prepared plan in place; returns the choice per step."""
    if level not in LEVELS:
        raise UsageError(f"tune must be one of {', '.join(LEVELS)}, got '{level}'")
    plan, queue = gpu_steps.plan, gpu_steps.queue
    # Tuning times bound launches: bind now (static inputs: their one binding, perhaps not made at
    # load; dynamic dims: the nominal input sizes placement judged, targets/nominal.py; other
    # shapes run the chosen variants with the default work-group size).
    from optcli.errors import OptError
    from optcli.targets.nominal import nominal_input_shapes

    try:
        if gpu_steps.bind_inputs(getattr(gpu_steps, "static_inputs", None) or nominal_input_shapes(plan)):
            return {}
    except OptError:
        return {}
    cache = cache or TuningCache(gpu_steps.dev.device)
    graph = plan_graph(plan)
    for name, shape in gpu_steps.shapes.items():  # the bound sizes (the nominal ones for dynamic dims)
        if name in graph.values:
            graph.values[name] = Value(name, graph.values[name].dtype, tuple(shape))
    steps = [i for i in gpu_steps.gpu_indices if plan.steps[i].op_type not in TRANSFER_OPS]
    choices: dict[int, Choice] = {}
    for i in progress(steps, desc=f"tuning ({level})", total=len(steps)):
        step = plan.steps[i]
        key = step_signature(step, gpu_steps.shapes, gpu_steps.precision)
        known = cache.get(key)
        node = Node(step.op_type, list(step.inputs), list(step.outputs), dict(step.attrs), step.name, step.domain)
        candidates = [k for k in gpu_kernels_for(step.op_type, step.domain) if k.check(node, graph) is None]
        if known is not None and any(k.id == known.kernel for k in candidates):
            trials = [(next(k for k in candidates if k.id == known.kernel), known.local_size)]
        else:
            trials = [(k, ls) for k in candidates for ls in _LOCAL_SIZES[level]]
        best: tuple[float, object, tuple | None, list] | None = None
        for kern, local in trials:
            try:
                bound = gpu_steps.bind_step(i, kern, local)
                t = _time(bound, queue, repeats) if len(trials) > 1 else 0.0
            except Exception:  # a work-group size the device or kernel refuses: not a candidate
                continue
            if best is None or t < best[0]:
                best = (t, kern, local, bound)
        if best is None:
            continue
        gpu_steps.bound[i] = best[3]
        step.kernel = best[1].id
        choices[i] = Choice(best[1].id, best[2], best[0] if known is None else known.time_us)
        cache.put(key, choices[i])
    cache.save()
    return choices
