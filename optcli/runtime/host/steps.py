"""The host-CPU backend: runs a plan's steps with the numpy kernels (or the reference fallback).

Arrays are dropped right after their last reader (the memory plan's lifetimes), so peak host
memory follows the plan rather than the sum of all activations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optcli.errors import OptError
from optcli.ops import get_kernel
from optcli.ops.control_flow import bound_fallback
from optcli.ops.evaluate import kernel_attrs
from optcli.plan import Step

StepFn = Callable[[list[np.ndarray | None]], list[np.ndarray]]


class StepError(OptError):
    """A step failed at run time because of the input values (e.g. an index out of range): exit 2.
    A kernel that raises on values that are valid is ours instead: ``errors.KernelError``."""


def bind_step(step: Step, opsets: dict[str, int]) -> StepFn:
    """A closure that runs ``step`` on positional numpy inputs.  GPU steps run through their
    host fallback kernel (``cpu_kernel``): this is how a GPU plan runs where no GPU is."""
    kern = get_kernel(step.cpu_kernel or step.kernel)
    if kern is not None:
        attrs = kernel_attrs(step.attrs, len(step.outputs), opsets)
        fn = kern.fn
        return lambda inputs: fn(inputs, attrs)
    proto, names = step.proto, list(step.inputs)
    if proto is None:
        raise OptError(f"step '{step.name}' ({step.op_type}) has no kernel '{step.kernel}' on this machine")
    return bound_fallback(proto, opsets, names)
