"""Device buffers for the GPU part of a plan, shared by the GPU backends (OpenCL, Metal).

Every device value gets a buffer; values whose lifetimes (the memory plan's) do not overlap
share one, chosen best fit.  Values are packed (NC4HW4) except the outputs of the steps that
produce a plain NCHW buffer (``Upload``, ``Unpack``); sizes are in storage precision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from optcli import native
from optcli.gpu.layout import packed_elements
from optcli.plan import Plan

LINEAR_OPS = ("Upload", "Unpack")  # steps whose output is a plain (unpacked) device buffer


def device_values(plan: Plan, indices: list[int], shapes: dict[str, tuple[int, ...]],
                  itemsize: int) -> dict[str, tuple[int, int, int]]:
    """name -> (first step, last step, bytes) of every value living on the device."""
    linear = {o for i in indices for o in plan.steps[i].outputs if plan.steps[i].op_type in LINEAR_OPS}
    values: dict[str, tuple[int, int, int]] = {}
    for i in indices:
        step = plan.steps[i]
        names = [*step.outputs] + ([] if step.op_type == "Upload" else list(step.inputs))
        for name in names:
            if not name or name in plan.weights or (step.op_type == "Download" and name in step.outputs):
                continue
            first, last = plan.memory.lifetimes.get(name, (i, i))
            elements = int(np.prod(shapes[name], dtype=np.int64)) if name in linear else packed_elements(shapes[name])
            values[name] = (first, last, max(16, elements * itemsize))
    return values


def share_buffers(values: dict[str, tuple[int, int, int]],
                  new_buffer: Callable[[int], Any]) -> tuple[dict[str, Any], int]:
    """(name -> buffer, bytes allocated): one buffer per value, reused once its value is dead."""
    free: list[tuple[int, Any]] = []  # (nbytes, buffer)
    releases: dict[int, list[tuple[int, Any]]] = {}
    buffers: dict[str, Any] = {}
    total = 0
    for name, (first, last, nbytes) in sorted(values.items(), key=lambda kv: (kv[1][0], kv[0])):
        for step_index in sorted(k for k in releases if k < first):
            free.extend(releases.pop(step_index))
        fits = sorted((b for b in free if b[0] >= nbytes), key=lambda b: b[0])
        if fits:
            chosen = fits[0]
            free.remove(chosen)
        else:
            chosen = (nbytes, new_buffer(nbytes))
            total += nbytes
        buffers[name] = chosen[1]
        releases.setdefault(last, []).append(chosen)
    return buffers, total


HALF_MAX = 65504.0  # the largest finite half


def to_storage(array: np.ndarray, storage: np.dtype) -> np.ndarray:
    """``array`` as a C-contiguous array of the device's storage type.

    In half storage a finite float beyond the half range saturates to +-65504 instead of becoming
    an infinity: models write "minus a lot" as float32's lowest (-3.4e38) in attention masks, and
    as -inf a row with every position masked turns a softmax into NaN, where onnxruntime in
    float32 gives a uniform row.  Infinities and NaN the array already holds stay what they are."""
    if np.dtype(storage) != np.float16 or np.asarray(array).dtype.kind != "f":
        return np.asarray(array, dtype=storage, order="C")
    if isinstance(array, np.ndarray):  # the native cast: numpy's took 1.3 ms of an H100's 3 ms fp16 run
        half = native.to_half(array)
        if half is not None:
            return half
    with np.errstate(over="ignore"):
        half = np.asarray(array, dtype=np.float16, order="C")
    if half.size and not np.isfinite(half).all():
        finite = np.isfinite(array)
        overflowed = finite & ~np.isfinite(half)
        if overflowed.any():
            half = np.where(overflowed, np.clip(array, -HALF_MAX, HALF_MAX), half).astype(np.float16)
    return half
