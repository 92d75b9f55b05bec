"""Runs a plan's steps in order: host steps with numpy, GPU steps through the prepared device
steps (or, when no GPU is in use, through their host fallback kernels).

Host arrays are dropped right after their last reader (the memory plan's lifetimes), so peak
host memory follows the plan rather than the sum of all activations.

The loop is the runtime's per-step overhead (issue 11 asks for at most 1 us a step outside the
kernels, issue 25 for 0.6 us), so everything a step needs that does not change between runs is
worked out once, in ``__init__``: the bound kernel, the input and output names, how many outputs
the model uses, the values to drop after it, and whether an input may be a device array (only
graph inputs can be, and only when the plan has a GPU).  Errors are sorted out only when one is
raised.  A plan whose steps all run on the host goes further: its steps become one generated
function (``host/program.py``) with no loop at all; the loop stays for GPU plans and for the
first run of a new input shape, which records the values' sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from optcli.errors import KernelError, OptError
from optcli.ops import get_kernel
from optcli.ops.reference import RUN_STOP
from optcli.ops.spatial import WindowDoesNotFit
from optcli.plan import Plan
from optcli.runtime.host.memory import keep_freed_memory
from optcli.runtime.host.program import as_value, straight_line
from optcli.runtime.host.steps import StepError, StepFn, bind_step
from optcli.runtime.run_control import RunStop

_NEVER = RunStop()  # the stop flag of a run nobody can stop (a caller that passed none)
_READ_RUN_STOP = frozenset({"Loop", "Scan", "If"})  # ops whose kernels may run a Loop or Scan (ops/control_flow.py)


def _host(value):
    return value.get() if type(value).__module__.startswith("pyopencl") and hasattr(value, "get") else value


class _Step(NamedTuple):
    index: int
    fn: StepFn | None  # None: a GPU step (OpenClSteps.run_step)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    used: int  # outputs the model uses (the kernel must give at least this many)
    free: tuple[str, ...]  # values no later step reads
    device_inputs: bool  # an input may be a pyopencl array the caller passed (read back first)


class Executor:
    def __init__(self, plan: Plan, gpu=None):
        self.plan = plan
        self.gpu = gpu  # runtime.opencl.steps.OpenClSteps or None
        on_gpu = set(gpu.gpu_indices) if gpu is not None else set()
        self.on_gpu = on_gpu
        self.free_after = plan.memory.free_after
        self._program: list[_Step] | None = None
        self._straight: Callable | None | bool = False  # False: not made yet; None: the plan keeps the loop
        self.fns = [None if i in on_gpu else bind_step(s, plan.opsets) for i, s in enumerate(plan.steps)]
        # Only Loop and Scan read the run's stop flag from RUN_STOP (in If bodies and in the reference
        # fallback too): a plan without them is not given it (setting and resetting it was a tenth of a
        # one-step model's run() fixed cost)
        self._stop_var = any(s.op_type in _READ_RUN_STOP or get_kernel(s.cpu_kernel or s.kernel) is None
                             for s in plan.steps)
        if len(on_gpu) < len(plan.steps):
            keep_freed_memory()  # host steps allocate their outputs: no page faults run after run

    @property
    def fns(self) -> list[StepFn | None]:
        """The bound host kernel of each step (None for GPU steps).  Replaceable as a whole
        (``optcli bench`` wraps them to time each host step); assigning re-derives the loop."""
        return self._fns

    @fns.setter
    def fns(self, fns: list[StepFn | None]) -> None:
        self._fns = fns
        self._program = None
        self._straight = False

    def _compile(self) -> list[_Step]:
        # Device arrays on the host side: inputs the caller passed as pyopencl arrays, and Download
        # outputs returned on the device (outputs_on_device=True) that a later host step reads.
        graph_inputs = ({v.name for v in self.plan.inputs}
                        | {o for s in self.plan.steps if s.op_type == "Download" for o in s.outputs}
                        if self.gpu is not None else set())
        program = []
        for i, (step, fn) in enumerate(zip(self.plan.steps, self.fns)):
            used = 1 + max((k for k, n in enumerate(step.outputs) if n), default=-1)
            program.append(_Step(i, fn, tuple(step.inputs), tuple(step.outputs), used, tuple(self.free_after[i]),
                                 fn is not None and any(n in graph_inputs for n in step.inputs)))
        return program

    def run(self, feeds: dict[str, np.ndarray], record_sizes: dict[str, int] | None = None,
            stop: RunStop | None = None) -> dict[str, np.ndarray]:
        """Run the steps; ``stop`` (a cancel from another thread, a deadline) ends the run between
        steps, in the GPU steps' waits and in a Loop's or Scan's iterations."""
        if self.gpu is None and record_sizes is None:  # a host plan's steps as one function (host/program.py)
            if self._straight is False:  # first run, or fns replaced
                self._straight = straight_line(self.plan, self.fns, self.free_after, _kernel_failure)
            if self._straight is not None:
                if not self._stop_var:
                    return self._straight(feeds, _NEVER if stop is None else stop)
                scope = RUN_STOP.set(stop)  # Loop and Scan (ops/control_flow.py) look at it on every iteration
                try:
                    return self._straight(feeds, _NEVER if stop is None else stop)
                finally:
                    RUN_STOP.reset(scope)
        if self._program is None:  # first run, or fns replaced
            self._program = self._compile()
        steps, gpu = self.plan.steps, self.gpu
        env: dict[str, object] = dict(self.plan.weights)
        env.update(feeds)
        ndarray = np.ndarray
        finished = False
        scope = RUN_STOP.set(stop)  # Loop and Scan (ops/control_flow.py) look at it on every iteration
        try:
            for index, fn, inputs, outputs, used, free, device_inputs in self._program:
                if stop is not None and stop.stopped:
                    stop.check(f"before step {index}")
                step = steps[index]  # the progress lines read the running step from this frame
                if fn is None:
                    gpu.run_step(index, step, env)
                else:
                    args = [env[n] if n else None for n in inputs]
                    if device_inputs:  # a device input read on the host comes over here
                        args = [_host(a) for a in args]
                    try:
                        outs = fn(args)
                    except OptError:
                        raise
                    except Exception as exc:
                        raise _kernel_failure(index, step, exc) from exc
                    if len(outs) < used:
                        raise StepError(f"step {index} {step.name} ({step.op_type}): kernel {step.kernel} gave "
                                        f"{len(outs)} outputs, the model uses {used}")
                    for name, arr in zip(outputs, outs):
                        if name:
                            if type(arr) is not ndarray:  # (lists and None from the fallback pass through)
                                arr = as_value(arr)
                            env[name] = arr
                            if record_sizes is not None and isinstance(arr, ndarray):
                                record_sizes[name] = arr.nbytes
                for name in free:
                    env.pop(name, None)
            finished = True
        finally:
            RUN_STOP.reset(scope)
            if gpu is not None:  # a run left early (an error, Ctrl-C, cancel) does not wait for the device
                gpu.finish() if finished else gpu.abandon()
        return {v.name: env[v.name] for v in self.plan.outputs}


def _kernel_failure(i: int, step, exc: Exception) -> OptError:
    """What a host kernel's exception means (the inputs passed every check: names, dtypes, shapes)."""
    if isinstance(exc, IndexError):
        # Indices are data (Gather, Scatter*, OneHot...): an index out of range is the input's fault.
        return StepError(f"step {i} {step.name} ({step.op_type}): an index in its input is out of range "
                         f"({exc}); check the input values")
    if isinstance(exc, WindowDoesNotFit):
        return StepError(f"step {i} {step.name} ({step.op_type}): its input is too small for its window ({exc}); "
                         "check the input sizes and values")
    if isinstance(exc, MemoryError):
        # Sizes follow the inputs (their shapes, and data such as a Range's bounds): too big to
        # hold is the input's fault, not a bug.
        return StepError(f"step {i} {step.name} ({step.op_type}): its result does not fit in memory ({exc}); "
                         "check the input sizes and values")
    if step.proto is not None and get_kernel(step.cpu_kernel or step.kernel) is None:
        # onnx's reference implementation, running a node and data that came from the file (an Einsum
        # equation it cannot parse, values it refuses): the file's or the input's fault, not ours.
        return StepError(f"step {i} {step.name} ({step.op_type}, run by the ONNX reference implementation) failed "
                         f"on this file's node or its input values ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}); check the model and the input values")
    # A kernel that still raises is ours.
    return KernelError(f"step {i} {step.name} ({step.op_type}, kernel {step.kernel}) crashed: "
                       f"{type(exc).__name__}: {exc}. This is a bug in optcli: please report it "
                       "with the model and the input shapes")
