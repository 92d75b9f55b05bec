"""The Metal backend (macOS, Apple GPUs) through PyObjC's Metal bindings (``optcli[metal]``).

It mirrors the OpenCL backend (``runtime/opencl/``: ``device.py`` + ``steps.py``): the system default device, one
library per (kernel source, defines) compiled from ``render_metal`` text at load, one compute
pipeline per kernel entry, buffers from the plan's liveness (``device_buffers``) in shared
storage, weights uploaded once.  A run encodes every GPU step of a segment into one command
buffer with one (serial) compute encoder and waits once: at a ``Download`` (a target border,
where the host needs the data) and at the end of the run.

Compiled pipelines are cached on disk in a Metal binary archive per library, in the same private,
integrity-checked cache as the OpenCL binaries (``runtime/gpu_common/disk_cache.py``), keyed on the library text, the
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
from optcli.gpu.dialect import kernel_params, load_source, render_metal
from optcli.gpu.registry import Launch
from optcli.gpu.variants import check_program
from optcli.runtime.gpu_common.disk_cache import cache_root, private_dir, read_entry, write_entry
from optcli.runtime.gpu_common.launch_context import LaunchContextBase


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
