"""The Metal backend's entry (``runtime/backends.py``): the system's Metal device (``device``), the
plan's GPU steps prepared on it (``steps``), or why the host must run them."""

from __future__ import annotations

from optcli.plan import Plan
from optcli.runtime.backends import BackendUnavailable
from optcli.runtime.metal.device import DeviceUnavailable, MetalDevice
from optcli.runtime.metal.steps import MetalSteps
from optcli.runtime.plan_shapes import Derivation


def start(plan: Plan, precision: str, gpu_targets: set[str], source: str, derivation: Derivation,
          device: str | None) -> MetalSteps:
    try:
        mtl = MetalDevice.shared(device)
    except DeviceUnavailable as exc:
        raise BackendUnavailable(f"the plan's GPU steps are for metal, and {exc}") from None
    derived = {k: tuple(v) for k, v in derivation.shapes.items()
               if v is not None and all(isinstance(d, int) for d in v)}
    try:
        return MetalSteps(plan, mtl, precision, gpu_targets, derived)
    except Exception as exc:  # library build failure, out of device memory
        text = str(exc).strip()
        raise BackendUnavailable(f"the Metal device {mtl.name} failed ({type(exc).__name__}: "
                                 f"{text.splitlines()[0] if text else 'no message'})") from None
