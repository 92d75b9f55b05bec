"""The OpenCL backend's entry (``runtime/backends.py``): the shared device of this machine (``device``),
the plan's GPU steps prepared on it (``steps``), or why the host must run them."""

from __future__ import annotations

from optcli.errors import NbFormatError
from optcli.plan import Plan
from optcli.runtime.backends import BackendUnavailable
from optcli.runtime.gpu_common.bind_shapes import GpuRefusal
from optcli.runtime.opencl.device import ClDevice, DeviceUnavailable
from optcli.runtime.opencl.devices import failure_text
from optcli.runtime.opencl.steps import OpenClSteps
from optcli.runtime.plan_shapes import Derivation


def start(plan: Plan, precision: str, gpu_targets: set[str], source: str, derivation: Derivation,
          device: str | None) -> OpenClSteps:
    try:
        dev = ClDevice.shared(device)
    except DeviceUnavailable as exc:
        raise BackendUnavailable(str(exc)) from None
    try:
        return OpenClSteps(plan, dev, precision, gpu_targets, source, derivation)
    except NbFormatError:
        raise
    except GpuRefusal as exc:  # a device value sized by data, too many programs...
        raise BackendUnavailable(f"the GPU cannot run this plan: {exc}") from None
    except Exception as exc:  # build failure, out of device memory, lost device
        raise BackendUnavailable(f"the OpenCL device {dev.describe()} failed ({failure_text(exc)})") from None
