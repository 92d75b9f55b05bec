"""The runtime's own shapes for a plan: derived from the inputs, never taken from the file.

At ``load`` (``runtime.load_checks.check_at_load``) the plan's steps are checked against their ops
(``runtime.step_checks``), then every value's shape is derived from the graph inputs' declared
shapes, symbolically (a dim may be a symbol such as ``N``), through the plan's steps
(``ops.shape_derivation.derive_shapes``: each step's own shape function, in step order, with the
inputs pinned and nothing the file records about intermediate values given).  Nothing is
executed: no input is made up, no kernel runs, and the work grows with the number of steps, not
with the sizes the file declares.  The file's recorded shapes are then only compared with the
derivation: a value whose recorded rank, or a fixed dim, differs from what its step computes, or
a step whose shape function finds its inputs inconsistent (a Conv whose weight does not fit its
input), make the file an ``NbFormatError``.  A dim the derivation leaves symbolic (it depends on a dynamic input dim, or
on data: Range, NonZero, a Reshape to a computed shape) is not compared: at ``run`` it is derived
again from the concrete input shapes (GPU plans, ``runtime.bind_shapes``), or computed from the
data by the host step that makes it.

Everything that sizes device memory or a launch (``OpenClSteps``) uses these derived shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from optcli.ir import Node
from optcli.ops.shape_derivation import derive_shapes
from optcli.plan import Plan


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
