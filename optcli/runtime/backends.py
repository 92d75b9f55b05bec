"""The GPU backends, found by target name in one table.

Each backend is a folder of ``runtime/`` (``opencl/``, ``metal/``) whose ``backend`` module offers
the same small interface: ``start(...)`` puts a plan's GPU steps on a device of this machine (or
raises ``BackendUnavailable`` saying why it cannot), and returns ``DeviceSteps``: bind shapes
(``bind_inputs``), run steps (``run_step``, ``finish``), ``release``.  The host CPU is not in the
table: it is the executor's own path (``runtime/host/``) and always there.  Adding a backend adds
a folder and a row here; the Predictor does not change.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from optcli.plan import Plan, Step
from optcli.runtime.plan_shapes import Derivation

# target name -> the module whose ``start`` prepares that target's steps; first usable wins, in this order.
BACKENDS: dict[str, str] = {
    "opencl": "optcli.runtime.opencl.backend",
    "metal": "optcli.runtime.metal.backend",
}


class BackendUnavailable(Exception):
    """This backend cannot run the plan's GPU steps here; the message says why (the host runs them)."""


class DeviceSteps(Protocol):
    """What the executor and the Predictor use of a backend's prepared steps."""

    dev: Any  # the device (its ``name`` names it in messages)
    gpu_indices: list[int]  # the plan's steps this backend runs
    storage: Any  # numpy dtype of device tensors (float32, or float16 with precision fp16)
    tunable: bool  # whether ``opencl.tuning`` can time its kernel variants
    outputs_on_device: bool
    stop: Any  # the running call's runtime.run_control.RunStop (cancel, deadline), or None

    def bind_inputs(self, input_shapes: dict[str, tuple[int, ...]]) -> str: ...

    def run_step(self, i: int, step: Step, env: dict[str, Any]) -> None: ...

    def finish(self) -> None: ...

    def abandon(self) -> None: ...

    def release(self) -> None: ...


def start(target: str, plan: Plan, precision: str, gpu_targets: set[str], source: str, derivation: Derivation,
          device: str | None) -> DeviceSteps:
    """The plan's GPU steps for ``gpu_targets`` prepared by ``target``'s backend (see the module
    docstring); ``BackendUnavailable`` with the reason when it cannot."""
    module = importlib.import_module(BACKENDS[target])  # imported on use: pyopencl or PyObjC only when asked for
    return module.start(plan, precision, gpu_targets, source, derivation, device)
