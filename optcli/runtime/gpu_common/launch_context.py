"""What every GPU backend's launch context shares: shapes and constants of the plan, weights
uploaded once per (kernel variant, key), scratch buffers, and resolving a launch's arguments to
what the rendered kernel takes (``arguments``: buffers with their real lengths, which bound
every access of the kernel).  A backend says only how it allocates a buffer (``_upload``,
``_allocate``) and how long one is (``_nbytes``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.gpu.dialect import kernel_arguments, kernel_params, load_source
from optcli.gpu.registry import Launch, TempRef, TensorRef, WeightRef
from optcli.runtime.gpu_common.device_buffers import to_storage


class LaunchContextBase:
    def __init__(self, shapes: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray], buffers: dict[str, Any],
                 precision: str = "fp32", shared_weights: dict[str, tuple[str, Any]] | None = None):
        self.shapes, self.consts, self.buffers = shapes, consts, buffers
        # Uploads shared with other bindings of the same plan (other input shapes): key -> (digest, buffer).
        self.shared_weights = shared_weights
        self.precision = precision
        self.storage = np.float16 if precision == "fp16" else np.float32
        self.weights: dict[str, Any] = {}
        self.temps: dict[str, Any] = {}
        self.weight_bytes = 0
        self.namespace = ""  # the kernel id being bound: variants of one node lay weights out differently

    # the LaunchContext protocol (optcli.gpu.registry)
    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return tuple(self.shapes[name])

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def tensor(self, name: str) -> TensorRef:
        return TensorRef(name)

    def weight(self, key: str, array: np.ndarray) -> WeightRef:
        key = f"{self.namespace}:{key}"
        if key not in self.weights:
            data = np.ascontiguousarray(to_storage(array, self.storage))
            if data.size == 0:
                data = np.zeros(4, self.storage)
            digest = _digest(data) if self.shared_weights is not None else ""
            shared = self.shared_weights.get(key) if self.shared_weights is not None else None
            if shared is not None and shared[0] == digest:
                self.weights[key] = shared[1]  # the same bytes another binding uploaded
            else:
                self.weights[key] = self._upload(data)
                self.weight_bytes += data.nbytes
                if self.shared_weights is not None and shared is None:
                    self.shared_weights[key] = (digest, self.weights[key])
        return WeightRef(key)

    def temp(self, key: str, elements: int) -> TempRef:
        key = f"{self.namespace}:{key}"
        if key not in self.temps:
            self.temps[key] = self._allocate(max(16, elements * np.dtype(self.storage).itemsize))
        return TempRef(key)

    def _buffer(self, ref: Any, label: str):
        if isinstance(ref, TensorRef):
            return self.buffers[ref.name]
        if isinstance(ref, WeightRef):
            return self.weights[ref.key]
        if isinstance(ref, TempRef):
            return self.temps[ref.key]
        raise RuntimeError(f"{label}: buffer argument expected, got {ref!r}")

    def arguments(self, launch: Launch, label: str) -> list[tuple[str, Any]]:
        """The launch's arguments in the rendered kernel's order (``dialect.kernel_arguments``):
        each buffer's bound is the length of the buffer this context allocated for it, never a
        size computed from the plan, so a wrong launch cannot reach past it."""
        params = kernel_params(load_source(launch.source))[launch.entry]
        itemsize = np.dtype(self.storage).itemsize
        return kernel_arguments(params, launch.args, f"{label}: {launch.entry}", lambda a: self._buffer(a, label),
                                lambda buf: self._nbytes(buf) // itemsize)

    # backend specifics
    def _nbytes(self, buffer: Any) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _upload(self, data: np.ndarray) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _allocate(self, nbytes: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


def _digest(data: np.ndarray) -> str:
    """Content identity of a re-laid weight: most do not depend on the input shape and are shared,
    a few do (an LSTM's zero initial state is batch-sized) and get an upload of their own."""
    import hashlib

    return f"{data.dtype}{data.shape}" + hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest()
