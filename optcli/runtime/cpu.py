"""The host-CPU backend: runs a plan's steps with the numpy kernels (or the reference fallback).

Arrays are dropped right after their last reader (the memory plan's lifetimes), so peak host
memory follows the plan rather than the sum of all activations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optcli.errors import OptError
from optcli.ops import get_kernel
from optcli.plan import Plan, Step
from optcli.runtime.evaluate import kernel_attrs
from optcli.runtime.reference import run_reference

StepFn = Callable[[list[np.ndarray | None]], list[np.ndarray]]


class StepError(OptError):
    """A step failed at run time (bad input values for this op, e.g. an index out of range)."""


def bind_step(step: Step, opsets: dict[str, int]) -> StepFn:
    """A closure that runs ``step`` on positional numpy inputs."""
    kern = get_kernel(step.kernel)
    if kern is not None:
        attrs = kernel_attrs(step.attrs, len(step.outputs), opsets)
        fn = kern.fn
        return lambda inputs: fn(inputs, attrs)
    proto, names = step.proto, list(step.inputs)
    if proto is None:
        raise OptError(f"step '{step.name}' ({step.op_type}) has no kernel '{step.kernel}' on this machine")
    return lambda inputs: run_reference(proto, opsets, inputs, names)


class CpuExecutor:
    """Executes every step of a plan on the host CPU."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.fns = [bind_step(s, plan.opsets) for s in plan.steps]
        self.free_after = plan.memory.free_after

    def run(self, feeds: dict[str, np.ndarray], record_sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = dict(self.plan.weights)
        env.update(feeds)
        for i, (step, fn) in enumerate(zip(self.plan.steps, self.fns)):
            args = [env[n] if n else None for n in step.inputs]
            try:
                outs = fn(args)
            except OptError:
                raise
            except Exception as exc:
                raise StepError(f"step {i} {step.name} ({step.op_type}) failed: {type(exc).__name__}: {exc}") from exc
            wanted = step.outputs
            used = 1 + max((k for k, n in enumerate(wanted) if n), default=-1)
            if len(outs) < used:
                raise StepError(f"step {i} {step.name} ({step.op_type}): kernel {step.kernel} gave {len(outs)} "
                                f"outputs, the model uses {used}")
            for name, arr in zip(wanted, outs):
                if name:
                    # Sequences (lists) and optionals (None) from the fallback pass through as they are.
                    env[name] = arr if isinstance(arr, (np.ndarray, list)) or arr is None else np.asarray(arr)
                    if record_sizes is not None and isinstance(env[name], np.ndarray):
                        record_sizes[name] = env[name].nbytes
            for name in self.free_after[i]:
                env.pop(name, None)
        return {v.name: env[v.name] for v in self.plan.outputs}
