"""A host-only plan's steps as one generated Python function: the executor's fast path.

The executor's loop over its step records paid ~1-2 us a step around the kernels (unpacking the
record, an argument list built by a comprehension, a dict environment filled and emptied name by
name, the outputs stored through zip): as much as a small kernel, and tens of steps make a face
detector's or a decoder's run.  Here the plan becomes one function with every value a local
variable and every step written out: ``o = f3([v1, c2])``, a check that the kernel gave the
outputs the model uses, one store per output and ``v1 = None`` where the memory plan frees a
value (so peak memory follows the plan as before).  Weights, kernels and names are the function's
globals; the source holds only identifiers of this module's making and numbers
(``generated_code.function`` refuses anything else).

Shape arithmetic runs once per input shape: a step whose inputs are all weights or values that
follow from tensors' shapes alone (``Shape``/``Size`` outputs, and what steps make of them: the
Gather -> Unsqueeze -> Concat -> Reshape chains, position-id Slices, mask Ranges that torch's
exports of dynamic-shape models carry) is a function of those shapes.  Its results are kept per
shape (``_ShapeMemo``), keyed by the shape tuples of the ``Shape``/``Size`` steps it derives from,
and the next run with the same shapes takes them instead of running the kernel: ~0.2 us where
the step cost 1-4 us (BERT-tiny with a dynamic sequence: 30 of its 94 steps).  The kept arrays
are read-only, as weights are.

What the loop did, this does too: the stop flag (cancel, deadline) is read before each step, the
running step is the frame's ``step`` local (the progress lines read it, ``progress.current_op``),
a kernel's exception becomes the same ``OptError`` (``executor._kernel_failure``), a result that is
not an array is made one.  Plans this cannot write (GPU steps, a value read before any step makes
it, thousands of steps) keep the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from optcli import generated_code
from optcli.errors import OptError
from optcli.runtime.host.steps import StepError

MAX_STEPS = 4000  # beyond this the source (and its one-time compile) grows past what the loop costs
SHAPE_ROOTS = frozenset({"Shape", "Size"})  # ops whose output depends on their input's shape alone
_NOT_DERIVED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                          "Bernoulli"})  # a new draw every run
MEMO_SHAPES = 16  # input shapes a step keeps results for (a dynamic dim can bring a new one every run)
MEMO_BYTES = 1 << 20  # results larger than this are made every run, not kept


class _ShapeMemo:
    """One shape-derived step's results by the shapes they follow from (see the module's doc)."""

    __slots__ = ("kept",)

    def __init__(self):
        self.kept: dict = {}

    def get(self, key):
        return self.kept.get(key)

    def keep(self, key, outs: tuple) -> None:
        if not all(type(v) is np.ndarray and v.nbytes <= MEMO_BYTES for v in outs):
            return  # a sequence, an optional, a large array: made every run
        for v in outs:
            v.setflags(write=False)  # shared by every later run with these shapes, as weights are
        if len(self.kept) >= MEMO_SHAPES:
            self.kept.clear()
        self.kept[key] = outs


def shape_derived(plan) -> dict[int, tuple[int, ...]]:
    """The steps whose results follow from tensors' shapes alone: step index -> the ``Shape``/``Size``
    steps (indices, sorted) whose inputs' shapes they follow from.  A step qualifies when every
    input is empty, a weight or the output of a ``Shape``/``Size`` step or of a qualifying step,
    its op draws no random numbers, it is no control-flow or onnx.reference node, and it gives
    no graph output (the caller gets an array of its own)."""
    roots: dict[str, frozenset[int]] = {}  # value -> the root steps its value follows from
    returned = {v.name for v in plan.outputs}
    derived: dict[int, tuple[int, ...]] = {}
    for k, step in enumerate(plan.steps):
        plain = step.domain in ("", "ai.onnx") and step.proto is None
        if plain and step.op_type in SHAPE_ROOTS:
            for name in step.outputs:
                if name:
                    roots[name] = frozenset((k,))
            continue
        if not plain and step.domain in ("", "ai.onnx"):
            continue
        if step.op_type in _NOT_DERIVED or step.proto is not None or any(n in returned for n in step.outputs):
            continue
        if not all(not n or n in plan.weights or n in roots for n in step.inputs):
            continue
        from_roots = frozenset().union(*(roots.get(n, frozenset()) for n in step.inputs))
        if not from_roots:
            continue  # weights only: constant folding's work, left to the kernel
        derived[k] = tuple(sorted(from_roots))
        for name in step.outputs:
            if name:
                roots[name] = from_roots
    return derived


def as_value(arr: Any) -> Any:
    """A kernel's result as the environment keeps it: arrays (and subclasses), sequences (lists)
    and optionals (None) from the reference fallback as they are, anything else through asarray."""
    if isinstance(arr, np.ndarray) or arr is None or isinstance(arr, list):
        return arr
    return np.asarray(arr)


def straight_line(plan, fns: list, free_after: list, failure: Callable) -> Callable | None:
    """``run(feeds, stop)`` giving the plan's outputs by name, for a plan whose every step has a
    host function in ``fns``; None where the plan cannot be written so.  ``failure(index, step,
    exc)`` is the OptError a kernel's exception becomes."""
    steps = plan.steps
    if len(steps) > MAX_STEPS or any(fn is None for fn in fns):
        return None
    space: dict[str, Any] = {"nd": np.ndarray, "as_value": as_value, "OptError": OptError, "failure": failure,
                             "short": _short, "halt": _halt}
    local: dict[str, str] = {}  # value name -> its local variable
    const: dict[str, str] = {}  # weight name -> its global

    def read(name: str) -> str | None:
        if not name:
            return "None"
        if name in local:
            return local[name]
        if name in plan.weights:
            if name not in const:
                const[name] = f"c{len(const)}"
                space[const[name]] = plan.weights[name]
            return const[name]
        return None

    returned = {v.name for v in plan.outputs}
    derived = shape_derived(plan)
    root_steps = {r for from_roots in derived.values() for r in from_roots}
    lines = ["def run(feeds, stop):", "    i, step = -1, None"]
    for k, v in enumerate(plan.inputs):
        local[v.name] = f"v{len(local)}"
        space[f"n{k}"] = v.name
        lines.append(f"    {local[v.name]} = feeds[n{k}]")
    lines.append("    try:")
    for k, (step, fn) in enumerate(zip(steps, fns)):
        args = [read(n) for n in step.inputs]
        if any(a is None for a in args):
            return None  # a value no earlier step makes: the loop raises what it raises
        space[f"f{k}"], space[f"s{k}"] = fn, step
        used = 1 + max((j for j, n in enumerate(step.outputs) if n), default=-1)
        head = [f"i, step = {k}, s{k}", f"if stop.stopped: halt(stop, {k})"]
        run = [f"o = f{k}([{', '.join(args)}{',' if len(args) == 1 else ''}])"]
        if used:
            run.append(f"if len(o) < {used}: short({k}, s{k}, o, {used})")
        made = []
        for j, name in enumerate(step.outputs):
            if name:
                var = local[name] = f"v{len(local)}"
                made.append(var)
                run += [f"{var} = o[{j}]", f"if type({var}) is not nd: {var} = as_value({var})"]
        if k in root_steps:  # its input's shape, which the steps derived from it are kept by
            run.append(f"t{k} = {args[0]}.shape if type({args[0]}) is nd else object()")
        if k in derived and made:
            space[f"m{k}"] = _ShapeMemo()
            key = ", ".join(f"t{r}" for r in derived[k]) + ("," if len(derived[k]) == 1 else "")
            outs = ", ".join(made) + ("," if len(made) == 1 else "")
            run = [f"h = m{k}.get(({key}))",
                   "if h is None:",
                   *("    " + line for line in run),
                   f"    m{k}.keep(({key}), ({outs}))",
                   "else:",
                   f"    {outs} = h"]
        body = head + run
        body += [f"{local[n]} = None" for n in free_after[k] if n in local and n not in returned]
        lines += ["        " + line for line in body]
    outs = []
    for k, v in enumerate(plan.outputs):
        src = read(v.name)
        if src is None:
            return None
        space[f"o{k}"] = v.name
        outs.append(f"o{k}: {src}")
    lines += [f"        return {{{', '.join(outs)}}}",
              "    except OptError:",
              "        raise",
              "    except Exception as exc:",
              "        raise failure(i, step, exc) from exc"]
    return generated_code.function(lines, space, "run")


def _halt(stop, index: int) -> None:
    stop.check(f"before step {index}")


def _short(index: int, step, outs: list, used: int) -> None:
    raise StepError(f"step {index} {step.name} ({step.op_type}): kernel {step.kernel} gave {len(outs)} outputs, "
                    f"the model uses {used}")
