"""GPU targets (`opencl`, `metal`): what they can run comes from the GPU kernel library
(``optcli.gpu``), which both share: a node runs on a GPU target when a GPU kernel for its op
exists, that kernel's ``check`` accepts the node (ranks, attributes, sizes: nominal ones where a
dim is symbolic, ``optcli.targets.nominal``), and its
launches fit the target's declared limits (``GpuLimits``: arguments per kernel, threads per
work-group, bytes per buffer).  Limits a target does not declare are the device's business at
load time (OpenCL devices differ too much to fix them ahead of time)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from optcli.ir import Graph, Node
from optcli.targets.base import Target


def _kernels(node: Node):
    from optcli.gpu.registry import gpu_kernels_for

    return gpu_kernels_for(node.op_type, node.domain)


@dataclass(frozen=True)
class GpuLimits:
    max_threadgroup: int | None = None  # work items in one work-group / threadgroup
    max_kernel_args: int | None = None  # argument slots (buffers and scalars) of one kernel
    max_buffer_bytes: int | None = None  # one buffer: a tensor, a re-laid weight, a scratch buffer

    def declared(self) -> bool:
        return any(v is not None for v in (self.max_threadgroup, self.max_kernel_args, self.max_buffer_bytes))


class _SizingContext:
    """A ``LaunchContext`` that allocates nothing: it records what a kernel's launches would
    need, so the limits are checked on the launches the runtime will really make."""

    precision = "fp32"

    def __init__(self, graph: Graph):
        self.graph = graph
        self.buffers: dict[str, int] = {}  # what -> bytes (fp32 storage: the larger precision)

    def shape(self, name: str) -> tuple[int, ...]:
        value = self.graph.const(name)
        return tuple(value.shape) if value is not None else tuple(self.graph.shape_of(name))

    def const(self, name: str):
        return self.graph.const(name) if name else None

    def tensor(self, name: str):
        from optcli.gpu.layout import packed_elements
        from optcli.gpu.registry import TensorRef

        self.buffers[f"tensor '{name}'"] = packed_elements(self.shape(name)) * 4
        return TensorRef(name)

    def weight(self, key: str, array):
        from optcli.gpu.registry import WeightRef

        self.buffers[f"weight {key}"] = int(np.asarray(array).size) * 4
        return WeightRef(key)

    def temp(self, key: str, elements: int):
        from optcli.gpu.registry import TempRef

        self.buffers[f"scratch {key}"] = int(elements) * 4
        return TempRef(key)


_LIMITS_SEEN: dict[tuple, str | None] = {}


def _runtime_index_input(node: Node, graph: Graph, kernels) -> str | None:
    """The first non-float input that is not a constant (axes, shapes, pads, indices...), but for
    the integer inputs every kernel of the op reads as data (``GpuKernel.data_inputs``)."""
    for i, name in enumerate(node.inputs):
        if all(i in k.data_inputs for k in kernels):
            continue
        if name and name not in graph.initializers and graph.dtype_of(name) not in ("float32", "float16", "bool"):
            return name
    return None


# Why a GPU target refuses a node, as a short kind (first match wins).  The patterns follow the
# refusals ``GpuTarget.can_run`` writes and the shared kernel checks (``gpu.registry.common_check``);
# what matches none is a case (attribute, mode, shape relation) the kernel does not handle.
REFUSAL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("no kernel", r"^no \S+ kernel for "),
    ("value computed at run time", r"to be a constant; it is computed at run time"),
    ("device limit", r" at most \d|cannot lay out its launches"),
    ("dynamic shape", r"dynamic shape"),
    ("dtype", r"kernel takes [\w ]+ tensors"),
    ("non-constant parameter", r"not a constant|must be (a )?constant"),
    ("rank", r"\brank\b|rank-\d|\d-D "),
))
UNHANDLED_CASE = "unsupported case"


@dataclass(frozen=True)
class GpuTarget(Target):
    limits: GpuLimits = field(default_factory=GpuLimits)
    precisions: tuple[str, ...] = ("fp32", "fp16")  # storage precisions of GPU tensors
    tensor_dtypes: tuple[str, ...] = ("float32", "bool")  # bool as 0/1 in float storage
    language: str = ""
    # Whether the runtime binds symbolic dims per input shape (OpenCL, ``runtime.bind_shapes``);
    # a target without it takes nodes of static shape only.
    dynamic_shapes: bool = True

    def can_run(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if node.proto is not None:
            return False, f"no {self.name} kernel for {node.op_type} (it needs the generic fallback)"
        kernels = _kernels(node)
        if not kernels:
            return False, f"no {self.name} kernel for {node.op_type}"
        runtime_index = _runtime_index_input(node, graph, kernels)
        if runtime_index:
            # GPU launches are planned from static shapes and constant parameters at load: an
            # axes/shape/pads input computed at run time could change the result under them.
            return False, (f"{self.name} {node.op_type} needs input '{runtime_index}' "
                           f"({graph.dtype_of(runtime_index)}) to be a constant; it is computed at run time")
        graphs, why = self.judged_graphs(node, graph)
        if not graphs:
            return False, f"{self.name} {node.op_type} kernel does not apply: {why}"
        reasons = []
        for k in kernels:
            reason = self._refusal(k, node, graphs)
            if reason is None:
                return True, f"{self.name} kernel"
            reasons.append(reason)
        # The most general variant (lowest priority) refuses only for fundamental reasons.
        return False, f"{self.name} {node.op_type} kernel does not apply: {reasons[-1]}"

    def judged_graphs(self, node: Node, graph: Graph) -> tuple[list[Graph], str]:
        """The graphs whose shapes a kernel's ``check`` judges for ``node``: the graph itself when
        the node's values are static; with symbolic dims, the graph at each nominal size
        (``optcli.targets.nominal``), where the runtime binds the real sizes per input shape.
        An empty list and the reason when the node's sizes cannot be judged."""
        from optcli.targets.nominal import has_symbolic, nominal_views

        names = [*node.inputs, *node.outputs]
        if not has_symbolic(graph, names):
            return [graph], ""
        dynamic = next(n for n in names if has_symbolic(graph, [n]))
        if not self.dynamic_shapes:
            return [], (f"'{dynamic}' has a dynamic shape (the {self.name} runtime binds static shapes only; "
                        "pin it with --input_shapes)")
        views = nominal_views(graph) or []
        if not views or any(has_symbolic(v, names) for v in views):
            return [], (f"'{dynamic}' has a dynamic shape that does not follow from the input shapes "
                        "(computed from data); pin it with --input_shapes")
        return views, ""

    def _refusal(self, kernel, node: Node, graphs: list[Graph]) -> str | None:
        for g in graphs:
            reason = kernel.check(node, g) or self.limit_reason(kernel, node, g)
            if reason:
                return reason
        return None

    def explain_refusal(self, reason: str) -> tuple[str, str]:
        detail = re.sub(rf"^{re.escape(self.name)} \S+ kernel does not apply: ", "", reason)
        kind = next((kind for kind, pattern in REFUSAL_KINDS if pattern.search(detail)), UNHANDLED_CASE)
        return kind, detail

    def select_kernel(self, node: Node, graph: Graph) -> str:
        graphs, _ = self.judged_graphs(node, graph)
        fitting = [k for k in _kernels(node) if self._refusal(k, node, graphs) is None]
        judged = graphs[0]  # nominal sizes (the first assignment) where dims are symbolic
        best = min(fitting, key=lambda k: (k.cost(node, judged) if k.cost else 0.0, -k.priority, k.variant))
        return best.id

    def limit_reason(self, kernel, node: Node, graph: Graph) -> str | None:
        """Why the launches of ``kernel`` for ``node`` exceed this target's limits, or None.
        Launch sizes depend on shapes and attributes only, so results are memoised on those:
        placement and kernel selection ask about the same node several times."""
        if not self.limits.declared():
            return None
        shapes = tuple(tuple(graph.shape_of(n) or ()) if graph.const(n) is None else ("const", graph.const(n).shape)
                       for n in [*node.inputs, *node.outputs] if n)
        key = (self.name, self.limits, kernel.id, node.name, repr(sorted(node.attrs.items())), shapes)
        if key not in _LIMITS_SEEN:
            if len(_LIMITS_SEEN) > 4096:
                _LIMITS_SEEN.clear()
            _LIMITS_SEEN[key] = self._limit_reason(kernel, node, graph)
        return _LIMITS_SEEN[key]

    def _limit_reason(self, kernel, node: Node, graph: Graph) -> str | None:
        lim = self.limits
        from optcli.gpu.dialect import kernel_params, load_source, signature_params
        from optcli.gpu.ops_layout import TRANSFER_OPS

        if kernel.domain == "optcli" and kernel.op_type in TRANSFER_OPS:
            return None  # buffer copies the runtime performs: no kernel, the tensor's own limit applies

        ctx = _SizingContext(graph)
        try:
            launches = kernel.launch(ctx, node)
        except Exception as exc:  # a launch the runtime could not make either
            return f"{kernel.id} cannot lay out its launches ({type(exc).__name__}: {exc})"
        for launch in launches:
            # the rendered kernel's arguments: the declared ones and each buffer's length
            args = len(signature_params(kernel_params(load_source(launch.source))[launch.entry]))
            if lim.max_kernel_args is not None and args > lim.max_kernel_args:
                return (f"kernel {launch.entry} takes {args} arguments; {self.name} binds at most "
                        f"{lim.max_kernel_args} per kernel")
            threads = int(np.prod(launch.local_size)) if launch.local_size else 0
            if lim.max_threadgroup is not None and threads > lim.max_threadgroup:
                return (f"kernel {launch.entry} asks for {threads} threads per group; {self.name} allows at most "
                        f"{lim.max_threadgroup}")
        if lim.max_buffer_bytes is not None:
            for what, nbytes in ctx.buffers.items():
                if nbytes > lim.max_buffer_bytes:
                    return (f"{what} needs {nbytes / 2**20:.0f} MiB; one {self.name} buffer holds at most "
                            f"{lim.max_buffer_bytes / 2**20:.0f} MiB")
        return None

    def supported_ops(self) -> list[tuple[str, str]]:
        from optcli.gpu.registry import gpu_ops

        hidden = {("optcli", op) for op in ("Upload", "Download", "Pack", "Unpack")}
        return [op for op in gpu_ops() if op not in hidden]


OPENCL = GpuTarget(name="opencl", device="gpu", description="OpenCL 1.2+ devices through pyopencl",
                   language="OpenCL C")
# Metal's limits hold on every Apple GPU family: 31 argument-table buffer slots per kernel
# (scalars are bound with setBytes into a slot too), 1024 threads per threadgroup, and 256 MiB
# per buffer (the smallest maxBufferLength of any family; Macs allow more, but a plan must load
# everywhere).
METAL = GpuTarget(name="metal", device="gpu", description="Apple GPUs through Metal (PyObjC)",
                  language="Metal Shading Language",
                  limits=GpuLimits(max_threadgroup=1024, max_kernel_args=31, max_buffer_bytes=256 * 2**20),
                  dynamic_shapes=False)
