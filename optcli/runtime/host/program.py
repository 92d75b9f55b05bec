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
        body = [f"i, step = {k}, s{k}",
                f"if stop.stopped: halt(stop, {k})",
                f"o = f{k}([{', '.join(args)}{',' if len(args) == 1 else ''}])"]
        if used:
            body.append(f"if len(o) < {used}: short({k}, s{k}, o, {used})")
        for j, name in enumerate(step.outputs):
            if name:
                var = local[name] = f"v{len(local)}"
                body += [f"{var} = o[{j}]", f"if type({var}) is not nd: {var} = as_value({var})"]
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
