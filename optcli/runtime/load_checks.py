"""Everything the runtime checks in a plan before it runs anything: the one entry point
(``check_at_load``) that ``optcli.load`` and ``opt`` (reading back the bytes it is about to write,
``compiler._check_readable``) both call.

The reader (``optcli/nb/``) checks the file's form only: types, ranges, extents, dataflow, the
memory plan.  What needs this optcli's kernel libraries and targets is checked here, in order:

1. the file's targets are ones this optcli knows, and each step's kernel is one this optcli has
   (host kernels from ``ops``, GPU kernels from ``gpu.registry``) and implements the step's op; a
   GPU step names a valid host kernel to fall back on;
2. values cross between the host and a GPU only through ``Upload`` and ``Download``;
3. each step is what its op allows (``runtime.step_checks``: opset, slots, attribute types,
   layouts);
4. every value's shape is derived from the inputs (``runtime.plan_shapes``) and the shapes the
   file records are only compared with the derivation.

Anything wrong is an ``NbFormatError``: a kernel never meets a step it cannot read.
"""

from __future__ import annotations

from optcli.errors import NbFormatError
from optcli.gpu.registry import get_gpu_kernel
from optcli.ir import Graph, Value
from optcli.ops import get_kernel
from optcli.plan import Plan, Step
from optcli.runtime.plan_shapes import Derivation, derive, plan_nodes
from optcli.runtime.step_checks import check_steps
from optcli.targets import TARGETS
from optcli.targets.arm import fallback_kernel_id


def check_at_load(plan: Plan, source: str) -> Derivation:
    """Check the plan (see the module docstring); returns the derivation for the predictor (GPU
    steps are sized from it)."""
    _check_kernels(plan, source)
    _check_borders(plan, source)
    check_steps(plan, source)
    derived = _check_recorded_shapes(plan, source)
    _check_blocked_kernels_apply(plan, derived, source)
    return derived


def _malformed(source: str, where: str, what: str) -> NbFormatError:
    return NbFormatError(f"{source}: malformed .nb body at {where}: {what}; the file is corrupted "
                         "or was not written by optcli")


def _check_kernels(plan: Plan, source: str) -> None:
    for t in plan.targets:
        if t not in TARGETS:
            raise _malformed(source, "targets", f"unknown target '{t}'")
    for i, step in enumerate(plan.steps):
        if TARGETS[step.target].device == "gpu":
            _check_gpu_step(step, i, source)
        else:
            _check_host_step(step, i, source)


def _check_host_step(step: Step, i: int, source: str) -> None:
    where = f"steps[{i}]"
    if step.cpu_kernel is not None and step.cpu_kernel != step.kernel:
        raise _malformed(source, where, "a host step names a second host kernel")
    kern = get_kernel(step.kernel)
    if kern is not None:
        if (kern.op_type, kern.domain) != (step.op_type, step.domain):
            raise _malformed(source, where, f"kernel '{step.kernel}' does not implement op {step.op_type}")
    elif step.proto is not None and step.kernel == fallback_kernel_id(step.op_type, step.domain):
        pass  # the onnx reference runs the proto (parsed and matched to the step by the reader)
    else:
        raise NbFormatError(f"{source}: step {i} ({step.name}, {step.op_type}) needs kernel '{step.kernel}', which "
                            "this optcli does not have; the file was made by another optcli version")


def _check_gpu_step(step: Step, i: int, source: str) -> None:
    where = f"steps[{i}]"
    kern = get_gpu_kernel(step.kernel)
    if kern is None:
        raise NbFormatError(f"{source}: step {i} ({step.name}, {step.op_type}) needs GPU kernel '{step.kernel}', "
                            "which this optcli does not have; the file was made by another optcli version")
    if (kern.op_type, kern.domain) != (step.op_type, step.domain):
        raise _malformed(source, where, f"kernel '{step.kernel}' does not implement op {step.op_type}")
    host = get_kernel(step.cpu_kernel) if step.cpu_kernel else None
    if host is None or (host.op_type, host.domain) != (step.op_type, step.domain):
        raise _malformed(source, where, "GPU step without a valid host fallback kernel")


def _check_borders(plan: Plan, source: str) -> None:
    """Values cross between the host and a GPU only through ``Upload`` and ``Download``: a GPU
    step's output lives in a device buffer, a host step's in host memory, and a step reading the
    other side's value would find nothing there (or a buffer nobody wrote)."""
    where_is: dict[str, str] = {}  # value -> "host" or the GPU target holding it; unlisted: inputs
    for i, s in enumerate(plan.steps):
        gpu = TARGETS[s.target].device == "gpu"
        wanted = "host" if not gpu or s.op_type == "Upload" else s.target
        for name in s.inputs:
            if name and name not in plan.weights and where_is.get(name, "host") != wanted:
                side = "the host" if wanted == "host" else f"the {wanted} device"
                raise _malformed(source, f"steps[{i}]", f"reads '{name:.60}' on {side}, where it never is (values "
                                 "cross only through Upload and Download)")
        for name in s.outputs:
            where_is[name] = "host" if not gpu or s.op_type == "Download" else s.target
    for v in plan.outputs:
        if where_is.get(v.name, "host") != "host":
            raise _malformed(source, "outputs", f"output '{v.name:.60}' stays on the device (no Download)")


def _check_recorded_shapes(plan: Plan, source: str) -> Derivation:
    """The derivation from the inputs' declared shapes; a step it finds inconsistent, or a recorded
    shape that disagrees with it (rank, or a dim fixed on both sides), is an ``NbFormatError``."""
    derived = derive(plan, {v.name: v.shape for v in plan.inputs})
    if derived.strict_error:
        raise NbFormatError(f"{source}: the plan's steps do not fit their declared input shapes "
                            f"({derived.strict_error}); the file is corrupted or crafted")
    writer = {o: (i, s) for i, s in enumerate(plan.steps) for o in s.outputs if o}
    for value in [*plan.values.values(), *plan.inputs, *plan.outputs]:  # a name may be described in each
        name = value.name
        shape = derived.shapes.get(name)
        if value.shape is None or shape is None or _agrees(value.shape, shape):
            continue
        where = f"value '{name[:60]}'"
        if name in writer:
            i, step = writer[name]
            where += f" (written by step {i} '{step.name[:40]}', {step.op_type})"
        raise NbFormatError(f"{source}: {where} is recorded as {_show(value.shape)} but its step computes "
                            f"{_show(shape)} from the inputs; the file is corrupted or crafted")
    return derived


def _check_blocked_kernels_apply(plan: Plan, derived: Derivation, source: str) -> None:
    """A kernel of the channel-blocked host layout combines lanes as the plain kernel combines
    channels only where its ``applies`` rule holds (equal shapes or a per-channel operand, a
    per-channel slope...); ``opt`` checks it when it picks the kernel, and here it is checked again
    on the shapes derived from the inputs, so a file cannot pick one where it would compute
    something else (a blocked Add of [1, 16, 8, 8] and [1, 1, 8, 8] added lane by lane: issue 23)."""
    steps = [(i, s, get_kernel(s.kernel)) for i, s in enumerate(plan.steps) if TARGETS[s.target].device != "gpu"]
    steps = [(i, s, k) for i, s, k in steps if k is not None and k.is_blocked and k.applies is not None]
    if not steps:
        return
    values = {name: Value(name, plan.values[name].dtype if name in plan.values else "unknown", shape)
              for name, shape in derived.shapes.items()}
    for v in plan.inputs:
        values.setdefault(v.name, v)
    view = Graph(plan.name, plan_nodes(plan), list(plan.inputs), list(plan.outputs), dict(plan.weights), values,
                 dict(plan.opsets))
    for i, step, kern in steps:
        if not kern.applies(view.nodes[i], view):
            raise NbFormatError(f"{source}: step {i} '{step.name[:60]}' ({step.op_type}) uses kernel '{step.kernel}' "
                                "of the channel-blocked layout where its rule does not hold for the shapes derived "
                                "from the inputs; the file is corrupted or crafted")


def _agrees(recorded: tuple, derived: tuple) -> bool:
    """Same rank, and no dim fixed on both sides that differs (symbols and unknowns are not compared)."""
    if len(recorded) != len(derived):
        return False
    return all(not (isinstance(r, int) and isinstance(d, int)) or r == d for r, d in zip(recorded, derived))


def _show(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
