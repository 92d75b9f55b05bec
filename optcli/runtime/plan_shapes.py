"""The runtime's own shapes for a plan: derived from the inputs, never taken from the file.

At ``load`` (``check_at_load``) the plan's steps are checked against their ops
(``runtime.plan_check``), then every value's shape is derived from the graph inputs' declared
shapes, symbolically (a dim may be a symbol such as ``N``), through the plan's steps
(``ops.shape_rules.derive_shapes``: each step's own shape function, in step order, with the
inputs pinned and nothing the file records about intermediate values given).  Nothing is
executed: no input is made up, no kernel runs, and the work grows with the number of steps, not
with the sizes the file declares.  The file's recorded shapes are then only compared with the
derivation: a value whose recorded rank, or a fixed dim, differs from what its step computes, or
a step whose shape function finds its inputs inconsistent (a Conv whose weight does not fit its
input), make the file an ``NbFormatError``.  A dim the derivation leaves symbolic (it depends on a dynamic input dim, or
on data: Range, NonZero, a Reshape to a computed shape) is not compared: at ``run`` it is derived
again from the concrete input shapes (GPU plans, ``runtime.bind_shapes``), or computed from the
data by the host step that makes it.

Everything that sizes device memory or a launch (``GpuSteps``) uses these derived shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from optcli.errors import NbFormatError
from optcli.ir import Node
from optcli.ops.shape_rules import derive_shapes
from optcli.plan import Plan
from optcli.runtime.plan_check import check_steps


@dataclass
class Derivation:
    shapes: dict[str, tuple]  # every value the derivation reached: dims are ints, symbols or None
    strict_error: str = ""  # the first step found inconsistent (the message names the node), '' if none


def plan_nodes(plan: Plan) -> list[Node]:
    return [Node(s.op_type, list(s.inputs), list(s.outputs), dict(s.attrs), s.name, s.domain, proto=s.proto)
            for s in plan.steps]


def derive(plan: Plan, input_shapes: dict[str, tuple | None]) -> Derivation:
    """Every value's shape for these input shapes (symbolic or concrete), in one pass: a step
    found inconsistent leaves its outputs unknown, and the first such step is the reason."""
    inputs = {v.name: (v.dtype, input_shapes.get(v.name)) for v in plan.inputs}
    problems: list[str] = []
    shapes = derive_shapes(plan_nodes(plan), inputs, plan.weights, plan.opsets, [v.name for v in plan.outputs],
                           problems=problems)
    return Derivation(shapes, problems[0] if problems else "")


def check_at_load(plan: Plan, source: str) -> Derivation:
    """Check the steps against their ops and the recorded shapes against the derivation (see the
    module docstring); returns the derivation for the predictor (GPU steps are sized from it)."""
    check_steps(plan, source)
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


def _agrees(recorded: tuple, derived: tuple) -> bool:
    """Same rank, and no dim fixed on both sides that differs (symbols and unknowns are not compared)."""
    if len(recorded) != len(derived):
        return False
    return all(not (isinstance(r, int) and isinstance(d, int)) or r == d for r, d in zip(recorded, derived))


def _show(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
