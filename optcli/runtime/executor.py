"""Runs a plan's steps in order: host steps with numpy, GPU steps through the prepared device
steps (or, when no GPU is in use, through their host fallback kernels).

Host arrays are dropped right after their last reader (the memory plan's lifetimes), so peak
host memory follows the plan rather than the sum of all activations.
"""

from __future__ import annotations

import numpy as np

from optcli.errors import KernelError, OptError
from optcli.plan import Plan
from optcli.runtime.cpu import StepError, bind_step


def _host(value):
    return value.get() if type(value).__module__.startswith("pyopencl") and hasattr(value, "get") else value


class Executor:
    def __init__(self, plan: Plan, gpu=None):
        self.plan = plan
        self.gpu = gpu  # runtime.gpu_plan.GpuSteps or None
        on_gpu = set(gpu.gpu_indices) if gpu is not None else set()
        self.on_gpu = on_gpu
        self.fns = [None if i in on_gpu else bind_step(s, plan.opsets) for i, s in enumerate(plan.steps)]
        self.free_after = plan.memory.free_after

    def run(self, feeds: dict[str, np.ndarray], record_sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        env: dict[str, object] = dict(self.plan.weights)
        env.update(feeds)
        try:
            for i, (step, fn) in enumerate(zip(self.plan.steps, self.fns)):
                if fn is None:
                    self.gpu.run_step(i, step, env)
                else:
                    self._host_step(i, step, fn, env, record_sizes)
                for name in self.free_after[i]:
                    env.pop(name, None)
        finally:
            if self.gpu is not None:
                self.gpu.finish()
        return {v.name: env[v.name] for v in self.plan.outputs}

    def _host_step(self, i, step, fn, env, record_sizes) -> None:
        # A device input read on the host (its first reader is a host step) comes over here.
        args = [_host(env[n]) if n else None for n in step.inputs]
        try:
            outs = fn(args)
        except OptError:
            raise
        except IndexError as exc:
            # Indices are data (Gather, Scatter*, OneHot...): an index out of range is the input's fault.
            raise StepError(f"step {i} {step.name} ({step.op_type}): an index in its input is out of range "
                            f"({exc}); check the input values") from exc
        except MemoryError as exc:
            # Sizes follow the inputs (their shapes, and data such as a Range's bounds): too big to
            # hold is the input's fault, not a bug.
            raise StepError(f"step {i} {step.name} ({step.op_type}): its result does not fit in memory ({exc}); "
                            "check the input sizes and values") from exc
        except Exception as exc:
            # The inputs passed every check (names, dtypes, shapes): a kernel that still raises is ours.
            raise KernelError(f"step {i} {step.name} ({step.op_type}, kernel {step.kernel}) crashed: "
                              f"{type(exc).__name__}: {exc}. This is a bug in optcli: please report it "
                              "with the model and the input shapes") from exc
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
