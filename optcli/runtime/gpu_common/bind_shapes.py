"""Concrete shapes for the GPU part of a plan with dynamic dims, per input shape.

A plan keeps its symbolic dims (``N``, ``H``, ``unk__3``); its GPU steps are placed on the
device for any size their kernels handle.  At ``run``, with the inputs' concrete shapes, the
runtime needs every device value's shape before it sizes a buffer or a launch grid.  It derives
them itself (``optcli.ops.shape_derivation``: each step's shape function, the plan's inputs pinned,
nothing recorded about intermediate values used), then

* refuses input shapes the model cannot take (the steps' shape rules find them
  inconsistent, e.g. a Conv's input channels against its weight; a device value comes out with a
  negative size; or a value's fixed dim recorded in the plan differs) with an ``InputError`` that
  names the value and the step;
* asks every GPU step's kernel ``check`` again on the real sizes (placement judged nominal ones):
  a kernel that refuses them, or an empty device value, makes this input shape one the device
  cannot serve, and the call runs on the host (the caller decides; with ``require_gpu=True`` it
  is an error);
* lists the device values whose shapes do not follow from the input shapes but from data
  (``Derived.unknown``): the GPU steps that touch them are derived, checked and bound the same
  way once the host steps that make that data have run (``OpenClSteps``' data points).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from optcli.errors import InputError
from optcli.ir import Graph, Node, Value
from optcli.ops.shape_derivation import is_concrete
from optcli.plan import Plan
from optcli.runtime.plan_shapes import Derivation, derive


class GpuRefusal(Exception):
    """This device cannot run the plan's GPU steps (the message says why): they run on the CPU,
    or ``require_gpu=True`` makes it a ``TargetError``."""


class DataPointRefusal(GpuRefusal):
    """At a data point, the sizes the data gave cannot run on the device (a kernel refuses them,
    a value would be empty...): the predictor runs this call again on the host."""


@dataclass
class Derived:
    shapes: dict[str, tuple[int, ...]] | None  # device values' shapes (None: the device cannot serve)
    reason: str = ""  # why the device cannot serve these shapes
    # Device values whose shapes follow from data, not from the input shapes (a Range or Slice
    # bound by a run-time value, NonZero...): ``shapes`` holds the others, and the GPU steps that
    # touch these are bound once the data exists (``OpenClSteps``, at the plan's data point).
    unknown: tuple[str, ...] = ()


def _show(shape) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def describe_inputs(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"'{k}' {_show(v)}" for k, v in shapes.items())


def derive_device_shapes(plan: Plan, input_shapes: dict[str, tuple[int, ...]], device_values: set[str],
                         gpu_indices: list[int], source: str, derivation: Derivation | None = None) -> Derived:
    """Shapes of ``device_values`` for these input shapes (see the module docstring).
    ``derivation``: the plan's shapes already derived for these input shapes (the load's, for a
    plan whose inputs are static), else they are derived here."""
    derived_all = derivation if derivation is not None else derive(plan, input_shapes)
    derived, strict_error = derived_all.shapes, derived_all.strict_error
    writer = {o: s for s in plan.steps for o in s.outputs if o}
    shapes: dict[str, tuple[int, ...]] = {}
    unknown = []
    for name in sorted(device_values):
        shape = input_shapes.get(name) or derived.get(name)
        if not is_concrete(shape):
            unknown.append(name)
            continue
        shape = tuple(int(d) for d in shape)
        where = f"value '{name[:80]}'" + (f" (written by {writer[name].op_type} '{writer[name].name}')"
                                           if name in writer else "")
        if any(d < 0 for d in shape):
            raise InputError(f"{source}: input shapes {describe_inputs(input_shapes)} are too small for the model: "
                             f"{where} would have shape {_show(shape)}; {_hint(plan)}")
        if 0 in shape:
            return Derived(None, f"{where} would be empty ({_show(shape)}), which GPU kernels do not take")
        recorded = plan.values.get(name)
        if recorded is not None and recorded.shape is not None and not _fits(recorded.shape, shape):
            raise InputError(f"{source}: input shapes {describe_inputs(input_shapes)} do not fit the model: "
                             f"{where} would have shape {_show(shape)}, the model has {_show(recorded.shape)}; "
                             f"{_hint(plan)}")
        shapes[name] = shape
    if strict_error:  # the steps disagree about these shapes: nothing may be sized from them
        raise InputError(f"{source}: input shapes {describe_inputs(input_shapes)} do not fit the model: "
                         f"{strict_error}; {_hint(plan)}")
    known_steps = [i for i in gpu_indices if not set(unknown) & {*plan.steps[i].inputs, *plan.steps[i].outputs}]
    refusal = _recheck(plan, shapes, known_steps)
    return Derived(None, refusal) if refusal else Derived(shapes, unknown=tuple(unknown))


def _fits(recorded, shape: tuple[int, ...]) -> bool:
    return len(recorded) == len(shape) and all(not isinstance(r, int) or r == d for r, d in zip(recorded, shape))


def _hint(plan: Plan) -> str:
    dims = [f"'{v.name}' {_show(v.shape)}" for v in plan.inputs if v.shape is not None]
    return f"the model takes {', '.join(dims)}"


def _recheck(plan: Plan, shapes: dict[str, tuple[int, ...]], gpu_indices: list[int]) -> str:
    """Why a GPU step's kernel refuses these sizes ('' when every one takes them)."""
    from optcli.gpu.ops_layout import TRANSFER_OPS
    from optcli.gpu.registry import get_gpu_kernel

    values = {k: Value(k, v.dtype, v.shape) for k, v in plan.values.items()}
    for name, shape in shapes.items():
        dtype = plan.values[name].dtype if name in plan.values else "float32"
        values[name] = Value(name, dtype, shape)
    graph = Graph(plan.name, [], [values.get(v.name, v) for v in plan.inputs],
                  [values.get(v.name, v) for v in plan.outputs], dict(plan.weights), values, dict(plan.opsets))
    for i in gpu_indices:
        step = plan.steps[i]
        if step.op_type in TRANSFER_OPS:
            continue
        kern = get_gpu_kernel(step.kernel)
        if kern is None:
            return f"step {i} '{step.name}' names GPU kernel '{step.kernel}', which this runtime does not have"
        node = Node(step.op_type, list(step.inputs), list(step.outputs), dict(step.attrs), step.name, step.domain)
        reason = kern.check(node, graph)
        if reason:
            return f"its {step.op_type} step '{step.name}' cannot take them on the GPU ({reason})"
    return ""


SMALL_DATA = 4096  # elements: host integer arrays at a data point are given to the derivation by value


def derive_at_data_point(plan: Plan, k: int, env: dict, device_shapes: dict[str, tuple[int, ...]],
                         device_values: set[str], gpu_indices: list[int], source: str) -> Derived:
    """Shapes of the device values of steps ``k`` onwards, now that the steps before ``k`` have run.

    The steps from ``k`` on are derived as a plan of their own whose inputs are the values they
    read that exist now: host arrays in ``env`` (small integer ones by value too: a Reshape target,
    a Range bound) and device values with their bound shapes (``device_shapes``).  The same checks
    as for input shapes apply, except that steps the data makes inconsistent are the input values'
    fault (``StepError``), and the result may list values that follow from later data."""
    from optcli.ir import Value
    from optcli.runtime.host.steps import StepError

    rest = plan.steps[k:]
    written_before = {n for s in plan.steps[:k] for n in s.outputs if n} | {v.name for v in plan.inputs}
    read = ({n for s in rest for n in s.inputs if n} & written_before) - set(plan.weights)
    pinned: dict[str, tuple[int, ...]] = {}
    constants: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for name in read:
        value = env.get(name)
        if isinstance(value, np.ndarray):
            pinned[name], dtypes[name] = tuple(value.shape), value.dtype.name
            if value.dtype.kind in "iub" and value.size <= SMALL_DATA:
                constants[name] = value
        elif name in device_shapes:
            pinned[name] = device_shapes[name]
            described = plan.values.get(name)
            dtypes[name] = described.dtype if described is not None else "float32"
    sub = replace(plan, steps=list(rest), inputs=[Value(n, dtypes[n], s) for n, s in pinned.items()],
                  weights={**plan.weights, **constants})
    later = [i - k for i in gpu_indices if i >= k]
    try:
        # the device values alive across k are the sub-plan's inputs: pinned, and checked with the rest
        alive = {n for n in pinned if n in device_values}
        derived = derive_device_shapes(sub, pinned, (device_values - written_before) | alive, later, source)
    except InputError as exc:
        raise StepError(f"{source}: the values computed at run time do not fit the model's later steps "
                        f"(step {k} onwards): {exc}") from None
    return derived
