"""The runtime's own shapes for a plan: derived from the inputs, never taken from the file.

At ``load`` (``check_at_load``) the plan's steps are checked against their ops
(``runtime.plan_check``), then every value's shape is derived from the graph inputs' declared
shapes, symbolically (a dim may be a symbol such as ``N``), through the plan's steps
(``ops.shape_rules.derive_shapes``: onnx's inference over the steps with the inputs pinned and
nothing the file records about intermediate values given).  Nothing is executed: no input is
made up, no kernel runs, and the work grows with the number of steps, not with the sizes the
file declares.  The file's recorded shapes are then only compared with the derivation: a value
whose recorded rank, or a fixed dim, differs from what its step computes, or steps that onnx's
inference finds inconsistent (a Conv whose weight does not fit its input), make the file an
``NbFormatError``.  A dim the derivation leaves symbolic (it depends on a dynamic input dim, or
on data: Range, NonZero, a Reshape to a computed shape) is not compared: at ``run`` it is derived
again from the concrete input shapes (GPU plans, ``runtime.bind_shapes``), or computed from the
data by the host step that makes it.

Everything that sizes device memory or a launch (``GpuSteps``) uses these derived shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from optcli.errors import NbFormatError
from optcli.ir import Node
from optcli.ops.shape_rules import ShapeDerivationError, derive_shapes
from optcli.plan import Plan
from optcli.runtime.plan_check import check_steps


@dataclass
class Derivation:
    shapes: dict[str, tuple]  # every value the derivation reached: dims are ints, symbols or None
    strict_error: str = ""  # onnx's inference found the steps inconsistent (the message names the node)


def plan_nodes(plan: Plan) -> list[Node]:
    return [Node(s.op_type, list(s.inputs), list(s.outputs), dict(s.attrs), s.name, s.domain, proto=s.proto)
            for s in plan.steps]


def derive(plan: Plan, input_shapes: dict[str, tuple | None]) -> Derivation:
    """Every value's shape for these input shapes (symbolic or concrete).  Inference runs strict
    first; when that finds the steps inconsistent it runs again leniently, so the caller gets
    what could be derived together with the reason."""
    nodes = plan_nodes(plan)
    inputs = {v.name: (v.dtype, input_shapes.get(v.name)) for v in plan.inputs}
    outputs = [v.name for v in plan.outputs]
    try:
        return Derivation(derive_shapes(nodes, inputs, plan.weights, plan.opsets, outputs, strict=True))
    except ShapeDerivationError as exc:
        lenient = derive_shapes(nodes, inputs, plan.weights, plan.opsets, outputs)
        return Derivation(lenient, str(exc) if _attributable(plan, str(exc)) else "")


def _attributable(plan: Plan, message: str) -> bool:
    """Whether a strict inference error is the steps' fault.  onnx infers an op defined by a
    function (MeanVarianceNormalization...) through its body, and some bodies fail onnx's own
    inference whatever the inputs: such an error says nothing about the file."""
    import onnx.defs

    match = re.search(r"\(op_type:([A-Za-z0-9_]+), node name: ([^)]*)\)", message)
    if match is None:
        return True
    op_type = match.group(1)
    step = next((s for s in plan.steps if s.name == match.group(2) and s.op_type == op_type), None)
    if step is None or step.domain not in ("", "ai.onnx"):
        return True
    try:
        schema = onnx.defs.get_schema(op_type, onnx.defs.onnx_opset_version(), "")
    except onnx.defs.SchemaError:
        return True
    return not (schema.has_function or schema.has_context_dependent_function)


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
