"""The OpenCL backend: one device, one command queue, programs built once (and cached on disk),
buffers allocated once per predictor, steps enqueued without host syncs.

``ClDevice`` owns the context, the queue and the program cache.  ``ClLaunchContext`` implements
``optcli.gpu.registry.LaunchContext`` for a set of value shapes and weights: it turns a GPU
kernel's ``Launch`` descriptions into bound ``cl.Kernel`` objects ready to enqueue.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from optcli.gpu.dialect import render_opencl
from optcli.gpu.layout import packed_elements
from optcli.gpu.registry import Launch
from optcli.gpu.variants import check_program
from optcli.runtime.gpu_common.launch_context import LaunchContextBase
from optcli.runtime.opencl.devices import (
    HOW_TO_GET_ONE,
    describe_device,
    device_id,
    device_kind,
    device_problems,
    device_rank,
    failure_text,
    is_simulator,
    take_context,
)
from optcli.runtime.opencl.program_cache import ProgramCache

GET_ONE = f"{HOW_TO_GET_ONE} (`optcli devices` checks each device)"

try:  # pyopencl is a dependency, but a machine may have no OpenCL platform at all
    import pyopencl as cl
except Exception:  # pragma: no cover - import failure is reported by list_devices / load
    cl = None


class DeviceUnavailable(RuntimeError):
    """No usable OpenCL device (no platform, no device, or every device failed the smoke test)."""


DEVICE_ENV = "OPTCLI_OPENCL_DEVICE"  # part of a device's name: the device to use when none is named


def _candidates(name: str | None = None) -> list:
    """The OpenCL devices in the order the runtime tries them (``devices.device_rank``: discrete
    GPUs, integrated GPUs, accelerators, CPU OpenCL; a system ICD before pip's PoCL within a rank,
    as the loader lists /etc/OpenCL/vendors first).  Simulators (Oclgrind: thousands of times
    slower) are left out unless named: ``name`` (else ``$OPTCLI_OPENCL_DEVICE``) keeps the devices
    whose name contains it, simulators included."""
    name = name or os.environ.get(DEVICE_ENV) or None
    if cl is None:
        raise DeviceUnavailable(f"pyopencl cannot be imported; {GET_ONE}")
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # no ICD loader / no platform
        raise DeviceUnavailable(f"no OpenCL platform ({failure_text(exc)}); {GET_ONE}") from None
    devices = []
    for platform in platforms:
        try:
            devices += platform.get_devices()
        except Exception:  # a platform with no device (DEVICE_NOT_FOUND)
            continue
    if not devices:
        raise DeviceUnavailable(f"no OpenCL device found; {GET_ONE}")
    if name:
        matches = [d for d in devices if name.lower() in d.name.lower()]
        if not matches:
            found = ", ".join(describe_device(d) for d in devices)
            raise DeviceUnavailable(f"no OpenCL device matches '{name}' (found: {found})")
        devices = matches
    else:
        real = [d for d in devices if not is_simulator(d)]
        if not real:
            found = ", ".join(describe_device(d) for d in devices)
            raise DeviceUnavailable(f"only a simulated OpenCL device was found ({found}), which runs kernels "
                                    "thousands of times slower than the CPU and is used only when named "
                                    f"(--device / device=); {GET_ONE}")
        devices = real
    return sorted(devices, key=lambda d: device_rank(d)[0])


def _pick_device(name: str | None = None):
    """The first candidate that passes the smoke test (checked once per device per process)."""
    tried = []
    for device in _candidates(name):
        problems = device_problems(device, keep_context=True)
        if not problems:
            return device
        tried.append(f"{describe_device(device)} {' and '.join(problems)}")
    raise DeviceUnavailable(f"no usable OpenCL device: {'; '.join(tried)}; {GET_ONE}")


class ClDevice:
    """Context and program cache for one OpenCL device, shared by every predictor of the process
    (``shared``); each predictor makes its own command queue (``new_queue``)."""

    _shared: dict[Any, ClDevice] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, name: str | None = None) -> ClDevice:
        """The process's ClDevice for the first usable device (``name``: a part of its name)."""
        with cls._shared_lock:
            device = _pick_device(name)
            key = device_id(device)
            if key not in cls._shared:
                cls._shared[key] = cls(device)
            return cls._shared[key]

    def __init__(self, device=None, cache: ProgramCache | None = None):
        self.device = device if device is not None else _pick_device()
        self.context = take_context(self.device) or cl.Context([self.device])
        self.queue = self.new_queue()
        self.cache = cache or ProgramCache.default()
        self.native_half = "cl_khr_fp16" in self.device.extensions
        self._programs: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self.builds = 0  # programs compiled from source (not from the binary cache), for load-time reports

    def new_queue(self, profiling: bool = False):
        props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
        return cl.CommandQueue(self.context, properties=props)

    @property
    def name(self) -> str:
        return self.device.name.strip()

    @property
    def kind(self) -> str:
        """What the device is: "GPU", or "OpenCL on the CPU" for PoCL and other CPU devices."""
        return device_kind(self.device)

    def describe(self) -> str:
        """``NAME (KIND, PLATFORM)``, for messages."""
        return describe_device(self.device)

    def program(self, source: str, defines: dict[str, Any]):
        check_program(source, defines)  # one of the finitely many programs of the library, or refused
        key = (source, tuple(sorted(defines.items())))
        with self._lock:
            prog = self._programs.get(key)
            if prog is None:
                text = render_opencl(source, defines)
                prog, built = self.cache.build(self.context, self.device, text, options="-cl-mad-enable")
                self.builds += built
                self._programs[key] = prog
            return prog

    def kernel(self, source: str, entry: str, defines: dict[str, Any]):
        """A new kernel object (each bound launch owns its arguments)."""
        return cl.Kernel(self.program(source, defines), entry)


@dataclass
class BoundLaunch:
    kernel: Any
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    label: str

    def enqueue(self, queue, wait_for=None):
        return cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size, wait_for=wait_for)


class ClLaunchContext(LaunchContextBase):
    """Binds launches for values of known shape.  ``buffers`` maps value names to device buffers
    (packed layout); weights and temporaries are allocated here on first use."""

    def __init__(self, dev: ClDevice, shapes: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray],
                 buffers: dict[str, Any], precision: str = "fp32",
                 shared_weights: dict[str, tuple[str, Any]] | None = None):
        super().__init__(shapes, consts, buffers, precision, shared_weights)
        self.dev = dev

    def _upload(self, data: np.ndarray):
        return cl.Buffer(self.dev.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def _allocate(self, nbytes: int):
        return cl.Buffer(self.dev.context, cl.mem_flags.READ_WRITE, nbytes)

    def _nbytes(self, buffer) -> int:
        return int(buffer.size)  # the allocation itself (a sub-buffer's own size)

    # binding
    def bind(self, launch: Launch, label: str) -> BoundLaunch:
        defines = {**launch.defines, "STORAGE_HALF": int(self.precision == "fp16")}
        kern = self.dev.kernel(launch.source, launch.entry, defines)
        for index, (kind, value) in enumerate(self.arguments(launch, label)):
            # set_arg, not set_args: pyopencl would generate code per kernel
            kern.set_arg(index, value if kind in ("buffer", "floats") else
                         np.int32(value) if kind == "int" else np.float32(value))
        return BoundLaunch(kern, tuple(int(g) for g in launch.global_size),
                           tuple(launch.local_size) if launch.local_size else None, label)


def packed_nbytes(shape, precision: str) -> int:
    return max(16, packed_elements(shape) * (2 if precision == "fp16" else 4))
