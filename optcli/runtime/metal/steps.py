"""The prepared GPU steps of one plan on one Metal device: buffers from the plan's liveness in
shared storage, each kernel's dispatches bound once, and a run that encodes every GPU step of a
segment into one command buffer and waits only at a ``Download`` and at the end (see
``metal/device.py`` for the device, its pipelines and their cache)."""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.errors import DeviceError, InputError, UsageError
from optcli.gpu.ops_layout import TRANSFER_OPS
from optcli.gpu.registry import get_gpu_kernel
from optcli.plan import Plan, Step
from optcli.runtime.gpu_common.device_buffers import device_values, share_buffers, to_storage
from optcli.runtime.metal.device import BoundDispatch, MetalDevice, MetalLaunchContext, _error_text


def _view(buffer, dtype, count: int) -> np.ndarray:
    """A numpy view of a shared-storage buffer's memory (no copy)."""
    raw = buffer.contents().as_buffer(buffer.length())
    return np.frombuffer(raw, dtype=dtype, count=count)


class MetalSteps:
    """The prepared GPU steps of one plan on one Metal device (the ``OpenClSteps`` of Metal)."""

    tunable = False  # work-group tuning is OpenCL's (``optcli.runtime.opencl.tuning``)

    def __init__(self, plan: Plan, dev: MetalDevice, precision: str, gpu_targets: set[str],
                 shapes: dict[str, tuple[int, ...]] | None = None):
        self.plan, self.dev, self.precision = plan, dev, precision
        self.Metal = dev.Metal
        self.queue = dev.queue
        self.storage = np.dtype(np.float16 if precision == "fp16" else np.float32)
        self.gpu_indices = [i for i, s in enumerate(plan.steps) if s.target in gpu_targets]
        # The runtime's derived shapes (``runtime.plan_shapes``), never the recorded ones, size buffers.
        self.shapes = shapes if shapes is not None else {
            k: tuple(v.shape) for k, v in plan.values.items() if v.is_static}
        self.buffers, self.device_bytes = self._allocate()
        self.ctx = MetalLaunchContext(dev, self.shapes, plan.weights, self.buffers, precision)
        self.bound: dict[int, list[BoundDispatch]] = {}
        for i in self.gpu_indices:
            step = plan.steps[i]
            if step.op_type not in TRANSFER_OPS:
                kern = get_gpu_kernel(step.kernel)
                self.ctx.namespace = kern.id
                self.bound[i] = [self.ctx.bind(launch, f"step {i} {step.name}")
                                 for launch in kern.launch(self.ctx, step)]
        self.outputs_on_device = False
        self.stop = None  # the running call's stop flag: seen between steps (Metal's waits do not poll it yet)
        self._command = None  # (command buffer, encoder) being filled
        self._pending: list = []  # committed command buffers not yet waited on

    def _allocate(self) -> tuple[dict[str, Any], int]:
        """Liveness-shared buffers, except the ``Upload`` targets: the host writes those while
        earlier dispatches are encoded but not yet run, so no other value may share them."""
        values = device_values(self.plan, self.gpu_indices, self.shapes, self.storage.itemsize)
        uploads = {o for i in self.gpu_indices for o in self.plan.steps[i].outputs
                   if self.plan.steps[i].op_type == "Upload"}

        def new(nbytes: int):
            buf = self.dev.device.newBufferWithLength_options_(nbytes, self.Metal.MTLResourceStorageModeShared)
            if buf is None:
                raise DeviceError(f"the Metal device cannot allocate a buffer of {nbytes} bytes")
            return buf

        buffers, total = share_buffers({k: v for k, v in values.items() if k not in uploads}, new)
        for name in sorted(uploads & set(values)):
            buffers[name] = new(values[name][2])
            total += values[name][2]
        return buffers, total

    def bind_inputs(self, input_shapes: dict[str, tuple[int, ...]]) -> str:
        """'' (the device runs the call): a Metal plan is bound once, at load, from the derived shapes."""
        return ""

    # ------------------------------------------------------------------------- running
    def _encoder(self):
        if self._command is None:
            command = self.queue.commandBuffer()
            self._command = (command, command.computeCommandEncoder())
        return self._command[1]

    def _commit(self) -> None:
        if self._command is not None:
            command, encoder = self._command
            encoder.endEncoding()
            command.commit()
            self._pending.append(command)
            self._command = None

    def _wait(self) -> None:
        self._commit()
        pending, self._pending = self._pending, []
        for command in pending:
            command.waitUntilCompleted()
            if command.status() == self.Metal.MTLCommandBufferStatusError:
                raise DeviceError(f"a Metal command buffer failed: {_error_text(command.error())}")

    def run_step(self, i: int, step: Step, env: dict[str, Any]) -> None:
        if step.op_type == "Upload":
            value = env[step.inputs[0]]
            if not isinstance(value, np.ndarray):
                raise InputError(f"input '{step.inputs[0]}': the Metal backend takes numpy arrays "
                                 f"(got {type(value).__name__})")
            count = int(np.prod(self.shapes[step.outputs[0]], dtype=np.int64))
            np.copyto(_view(self.buffers[step.outputs[0]], self.storage, count),
                      to_storage(value, self.storage).reshape(-1), casting="unsafe")  # bool -> 0/1
        elif step.op_type == "Download":
            if self.outputs_on_device and step.outputs[0] in {v.name for v in self.plan.outputs}:
                raise UsageError("outputs_on_device=True is an OpenCL feature; the Metal backend returns numpy arrays")
            self._wait()  # the host needs the data: run what is encoded
            shape = self.shapes[step.outputs[0]]
            count = int(np.prod(shape, dtype=np.int64))
            host = _view(self.buffers[step.inputs[0]], self.storage, count).reshape(shape)
            dtype = self.plan.values[step.outputs[0]].dtype  # float32, or bool stored as 0/1
            env[step.outputs[0]] = host.astype(dtype if dtype != "unknown" else np.float32)  # a copy
        else:
            encoder = self._encoder()
            for dispatch in self.bound[i]:
                dispatch.encode(self.Metal, encoder)

    def finish(self) -> None:
        try:
            self._wait()
        finally:
            self._command = None

    abandon = finish  # Metal's waits are not interruptible yet: a run left early still waits here

    def release(self) -> None:
        """Drop every buffer and bound dispatch (the predictor stopped using this device)."""
        self._command, self._pending = None, []
        self.buffers, self.bound, self.device_bytes = {}, {}, 0
