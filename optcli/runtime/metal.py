"""The Metal backend (macOS, Apple GPUs) through PyObjC's Metal bindings (``optcli[metal]``).

It mirrors the OpenCL backend (``opencl.py`` + ``gpu_plan.py``): the system default device, one
library per (kernel source, defines) compiled from ``render_metal`` text at load, one compute
pipeline per kernel entry, buffers from the plan's liveness (``device_buffers``) in shared
storage, weights uploaded once.  A run encodes every GPU step of a segment into one command
buffer with one (serial) compute encoder and waits once: at a ``Download`` (a target border,
where the host needs the data) and at the end of the run.

Compiled pipelines are cached on disk in a Metal binary archive per library, in the same private,
integrity-checked cache as the OpenCL binaries (``cl_cache``), keyed on the library text, the
device, the OS version and the optcli version.

Nothing here is imported on Linux except ``available()`` / ``DeviceUnavailable``, and this module
is not executed in CI (no Mac there): the kernels it builds are compile- and execution-checked
on Linux through a Metal shim (``tests/metal``), the PyObjC calls only on a Mac.
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from optcli._version import __version__
from optcli.errors import DeviceError, InputError, UsageError
from optcli.gpu.dialect import kernel_params, load_source, render_metal
from optcli.gpu.ops_layout import TRANSFER_OPS
from optcli.gpu.registry import Launch, get_gpu_kernel
from optcli.gpu.variants import check_program
from optcli.plan import Plan, Step
from optcli.runtime.cl_cache import cache_root, private_dir, read_entry, write_entry
from optcli.runtime.device_buffers import device_values, share_buffers, to_storage
from optcli.runtime.launch_context import LaunchContextBase


class DeviceUnavailable(RuntimeError):
    """No usable Metal device (not macOS, PyObjC's Metal bindings missing, no GPU)."""


def _metal():
    """PyObjC's ``Metal`` module, or DeviceUnavailable saying why not."""
    if sys.platform != "darwin":
        raise DeviceUnavailable(f"Metal needs macOS (this machine runs {sys.platform})")
    try:
        import Metal  # pyobjc-framework-Metal
    except ImportError:
        raise DeviceUnavailable("PyObjC's Metal bindings are not installed (pip install 'optcli[metal]')") from None
    return Metal


def available() -> tuple[bool, str]:
    """(True, device name) when a Metal device can be used here, else (False, why not)."""
    try:
        return True, MetalDevice.shared().name
    except DeviceUnavailable as exc:
        return False, str(exc)


def _size(Metal, w: int, h: int, d: int):
    make = getattr(Metal, "MTLSizeMake", None)
    return make(w, h, d) if make is not None else Metal.MTLSize(w, h, d)


def _error_text(error) -> str:
    if error is None:
        return "no error description"
    try:
        return str(error.localizedDescription())
    except Exception:
        return str(error)


class PipelineCache:
    """Metal binary archives of compiled pipelines, one per library text, on disk."""

    def __init__(self, root: Path | None):
        self.dir = private_dir(root / "metal") if root is not None and private_dir(root) else None
        self.hits = 0
        self.misses = 0

    @classmethod
    def default(cls) -> PipelineCache:
        return cls(cache_root())

    def path(self, device_name: str, text: str) -> Path | None:
        if self.dir is None:
            return None
        key = "\0".join([text, device_name, platform.mac_ver()[0], __version__])
        return self.dir / f"{hashlib.sha256(key.encode()).hexdigest()}.binarchive"


class MetalDevice:
    """The device, its command queue, compiled libraries and pipelines; shared per process."""

    _shared: dict[str, MetalDevice] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, name: str | None = None) -> MetalDevice:
        Metal = _metal()
        device = Metal.MTLCreateSystemDefaultDevice()
        if name:
            matches = [d for d in (Metal.MTLCopyAllDevices() or []) if name.lower() in str(d.name()).lower()]
            if not matches:
                raise DeviceUnavailable(f"no Metal device matches '{name}'")
            device = matches[0]
        if device is None:
            raise DeviceUnavailable("no Metal device (MTLCreateSystemDefaultDevice returned none)")
        key = str(device.name())
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(device, Metal)
            return cls._shared[key]

    def __init__(self, device, Metal, cache: PipelineCache | None = None):
        self.Metal, self.device = Metal, device
        self.name = str(device.name())
        self.context = None  # no pyopencl context: device-resident inputs are an OpenCL feature
        self.queue = device.newCommandQueue()
        self.cache = cache or PipelineCache.default()
        self._pipelines: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self.builds = 0  # libraries compiled from source, for load-time reports

    # ---------------------------------------------------------------------- building
    def _options(self):
        Metal = self.Metal
        options = Metal.MTLCompileOptions.alloc().init()
        # The kernels use INFINITY (max / softmax identities): fast math may assume it away.
        if hasattr(options, "setMathMode_") and hasattr(Metal, "MTLMathModeRelaxed"):
            options.setMathMode_(Metal.MTLMathModeRelaxed)
        else:
            options.setFastMathEnabled_(False)
        return options

    def _library(self, text: str):
        library, error = self.device.newLibraryWithSource_options_error_(text, self._options(), None)
        if library is None:
            raise RuntimeError(f"the Metal library does not compile: {_error_text(error)}")
        self.builds += 1
        return library

    def pipelines(self, source: str, defines: dict[str, Any]) -> dict[str, Any]:
        """entry -> compute pipeline state, for every kernel of one source and set of defines."""
        check_program(source, defines)  # one of the finitely many programs of the library, or refused
        key = (source, tuple(sorted(defines.items())))
        with self._lock:
            if key not in self._pipelines:
                self._pipelines[key] = self._build(source, defines)
            return self._pipelines[key]

    def _build(self, source: str, defines: dict[str, Any]) -> dict[str, Any]:
        Metal = self.Metal
        text = render_metal(source, defines)
        library = self._library(text)
        path = self.cache.path(self.name, text)
        archive, staged = self._open_archive(path)
        dirty = False
        result = {}
        for entry in kernel_params(load_source(source)):
            function = library.newFunctionWithName_(entry)
            if function is None:
                raise RuntimeError(f"{source}: the Metal library has no function {entry}")
            pipeline = None
            if archive is not None:
                desc = Metal.MTLComputePipelineDescriptor.alloc().init()
                desc.setComputeFunction_(function)
                desc.setBinaryArchives_([archive])
                pipeline, _, _ = self.device.newComputePipelineStateWithDescriptor_options_reflection_error_(
                    desc, Metal.MTLPipelineOptionFailOnBinaryArchiveMiss, None, None)
                if pipeline is None:
                    ok, _ = archive.addComputePipelineFunctionsWithDescriptor_error_(desc, None)
                    dirty = dirty or bool(ok)
            if pipeline is None:
                self.cache.misses += 1
                pipeline, error = self.device.newComputePipelineStateWithFunction_error_(function, None)
                if pipeline is None:
                    raise RuntimeError(f"{source}:{entry}: no Metal pipeline ({_error_text(error)})")
            else:
                self.cache.hits += 1
            result[entry] = pipeline
        if dirty and path is not None:
            self._save_archive(archive, path, staged)
        if staged is not None:
            staged.unlink(missing_ok=True)
        return result

    def _open_archive(self, path: Path | None):
        """(binary archive or None, the temporary file it was loaded from or None).  A damaged
        or stale entry is dropped and a fresh archive started: never trusted, never fatal."""
        Metal = self.Metal
        if path is None or not hasattr(Metal, "MTLBinaryArchiveDescriptor") or not hasattr(
                Metal, "MTLPipelineOptionFailOnBinaryArchiveMiss"):
            return None, None  # bindings older than macOS 11's binary archives: no disk cache
        staged = None
        desc = Metal.MTLBinaryArchiveDescriptor.alloc().init()
        payload = read_entry(path)
        if payload is not None:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=".load-", suffix=".binarchive")
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            staged = Path(name)
            desc.setUrl_(_file_url(name))
        archive, _ = self.device.newBinaryArchiveWithDescriptor_error_(desc, None)
        if archive is None and staged is not None:  # stale for this OS / driver: start afresh
            path.unlink(missing_ok=True)
            archive, _ = self.device.newBinaryArchiveWithDescriptor_error_(
                Metal.MTLBinaryArchiveDescriptor.alloc().init(), None)
        return archive, staged

    def _save_archive(self, archive, path: Path, staged: Path | None) -> None:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=".save-", suffix=".binarchive")
        os.close(fd)
        try:
            ok, _ = archive.serializeToURL_error_(_file_url(name), None)
            if ok:
                write_entry(path, Path(name).read_bytes())
        finally:
            Path(name).unlink(missing_ok=True)


def _file_url(path: str):
    from Foundation import NSURL  # part of PyObjC, installed with pyobjc-framework-Metal

    return NSURL.fileURLWithPath_(path)


class BoundDispatch:
    """One launch bound to its pipeline, buffers and scalar bytes, ready to encode."""

    def __init__(self, pipeline, args: list[tuple[str, Any]], grid: tuple[int, int, int],
                 group: tuple[int, int, int], label: str):
        self.pipeline, self.args, self.grid, self.group, self.label = pipeline, args, grid, group, label

    def encode(self, Metal, encoder) -> None:
        encoder.setComputePipelineState_(self.pipeline)
        for index, (kind, value) in enumerate(self.args):
            if kind == "buffer":
                encoder.setBuffer_offset_atIndex_(value, 0, index)
            else:
                encoder.setBytes_length_atIndex_(value, len(value), index)
        encoder.dispatchThreads_threadsPerThreadgroup_(_size(Metal, *self.grid), _size(Metal, *self.group))


def _threadgroup(pipeline, grid: tuple[int, int, int], local: tuple[int, ...] | None) -> tuple[int, int, int]:
    """Threads per threadgroup: the launch's own (tuning) when it fits, else one SIMD-group wide
    along x and as many rows as the pipeline allows (non-uniform groups: any grid fits)."""
    limit = int(pipeline.maxTotalThreadsPerThreadgroup())
    if local:
        group = (tuple(int(v) for v in local) + (1, 1, 1))[:3]
        if int(np.prod(group)) <= limit:
            return group  # type: ignore[return-value]
    width = int(pipeline.threadExecutionWidth())
    if grid[1] == 1 and grid[2] == 1:
        return min(grid[0], max(width, min(256, limit))), 1, 1
    x = max(1, min(width, grid[0]))
    return x, max(1, min(limit // x, grid[1])), 1


class MetalLaunchContext(LaunchContextBase):
    """``optcli.gpu.registry.LaunchContext`` over Metal buffers (shared storage)."""

    def __init__(self, dev: MetalDevice, shapes: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray],
                 buffers: dict[str, Any], precision: str = "fp32"):
        super().__init__(shapes, consts, buffers, precision)
        self.dev = dev

    def _upload(self, data: np.ndarray):
        return self.dev.device.newBufferWithBytes_length_options_(
            data.tobytes(), data.nbytes, self.dev.Metal.MTLResourceStorageModeShared)

    def _allocate(self, nbytes: int):
        return self.dev.device.newBufferWithLength_options_(nbytes, self.dev.Metal.MTLResourceStorageModeShared)

    def _nbytes(self, buffer) -> int:
        return int(buffer.length())

    def bind(self, launch: Launch, label: str) -> BoundDispatch:
        defines = {**launch.defines, "STORAGE_HALF": int(self.precision == "fp16")}
        pipeline = self.dev.pipelines(launch.source, defines)[launch.entry]
        args: list[tuple[str, Any]] = []
        for kind, value in self.arguments(launch, label):
            if kind == "buffer":
                args.append(("buffer", value))
            elif kind == "int":
                args.append(("bytes", struct.pack("<i", value)))
            elif kind == "float":
                args.append(("bytes", struct.pack("<f", value)))
            else:  # the epilogue's floats: `constant float*` set from bytes
                args.append(("bytes", np.asarray(value, "<f4").tobytes()))
        grid = (tuple(int(g) for g in launch.global_size) + (1, 1, 1))[:3]
        return BoundDispatch(pipeline, args, grid, _threadgroup(pipeline, grid, launch.local_size), label)



def _view(buffer, dtype, count: int) -> np.ndarray:
    """A numpy view of a shared-storage buffer's memory (no copy)."""
    raw = buffer.contents().as_buffer(buffer.length())
    return np.frombuffer(raw, dtype=dtype, count=count)


class MetalSteps:
    """The prepared GPU steps of one plan on one Metal device (the ``GpuSteps`` of Metal)."""

    tunable = False  # work-group tuning is OpenCL's (``optcli.runtime.tuning``)

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
