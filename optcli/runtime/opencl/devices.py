"""``optcli devices`` / ``optcli.list_devices()``: the OpenCL devices on this machine, the
capabilities the runtime relies on, whether each is usable, and the options recommended for it.

A device is usable when it speaks OpenCL 1.2 or later and builds and runs a small kernel of our
library correctly (the smoke test).  The verdict is kept per device for the life of the process,
so the runtime (``ClDevice.shared``), ``optcli devices`` and the tests pay for one small build
per device, and a device that cannot build kernels (PoCL whose LLVM does not know this CPU, a
broken driver) is skipped in favour of the next one instead of failing every load.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np

HOW_TO_GET_ONE = ("to get one: `apt install pocl-opencl-icd` (Debian/Ubuntu: OpenCL on the CPU), "
                  "`pip install 'optcli[pocl]'` (PoCL from PyPI: OpenCL on the CPU), or your GPU vendor's OpenCL "
                  "driver")

_VERDICTS: dict[Any, str | None] = {}  # device id -> why the smoke test failed (None: it passed)
_CONTEXTS: dict[Any, Any] = {}  # device id -> the passing smoke test's context, until ClDevice takes it
_OPENED: dict[Any, Any] = {}  # device id -> the context a smoke test just opened (device_problems keeps or drops it)
_LOCK = threading.Lock()


def _version(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def device_kind(device) -> str:
    """What the device is, in words: a PoCL device is "OpenCL on the CPU", never a "GPU"."""
    import pyopencl as cl

    kind = int(device.type)
    if kind & cl.device_type.GPU:
        return "GPU"
    if kind & cl.device_type.CPU:
        return "OpenCL on the CPU"
    if kind & cl.device_type.ACCELERATOR:
        return "OpenCL accelerator"
    return "OpenCL device"


def describe_device(device) -> str:
    """``NAME (KIND, PLATFORM)``, for messages."""
    return f"{device.name.strip()} ({device_kind(device)}, {device.platform.name.strip()})"


def failure_text(exc: BaseException) -> str:
    """One line for an OpenCL failure: pyopencl repeats the status ("clBuildProgram failed: X -
    clBuildProgram failed: X - ...") and puts the compiler's own words in later lines of the build
    log; keep the status once and the first error line of the log."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    head = " - ".join(dict.fromkeys(lines[0].split(" - "))) if lines else "no message"
    detail = next((line for line in lines[1:] if re.match(r"(fatal )?error\b", line, re.I)), None)
    if detail:
        detail = re.sub(r"^(?:fatal )?error:\s*(?:\S+:\d+:\d+:\s*)?(?:(?:fatal )?error:\s*)?", "", detail, flags=re.I)
        head = f"{head}: {detail}"
    text = f"{type(exc).__name__}: {head}"
    return text if len(text) <= 240 else text[:237] + "..."


def _smoke_test(device) -> str | None:
    """Build and run the pack kernel; None when it works, else what failed.  The build goes through
    the program-binary cache: a cached binary was compiled by this very device and driver (its key
    holds both), so the compiler is known to work, and the kernel still runs and is checked.  A
    passing test leaves its context in ``_OPENED`` for ``device_problems`` to keep or drop."""
    stage = "cannot open the device"
    try:
        import pyopencl as cl

        from optcli.gpu.dialect import render_opencl
        from optcli.runtime.opencl.program_cache import ProgramCache

        context = cl.Context([device])
        queue = cl.CommandQueue(context)
        stage = "fails to build a test kernel"
        program, _ = ProgramCache.default().build(context, device, render_opencl("layout.cl", {"STORAGE_HALF": 0}),
                                                  options="-cl-mad-enable")
        stage = "fails to run a test kernel"
        kern = cl.Kernel(program, "pack_nc4hw4")
        src = np.arange(6, dtype=np.float32)
        a = cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=src)
        b = cl.Buffer(context, cl.mem_flags.READ_WRITE, 2 * 4 * 4)
        # N, C, H, W, then the two buffers' lengths (the bounds the kernel's accesses check)
        kern.set_args(a, b, np.int32(1), np.int32(3), np.int32(1), np.int32(2), np.int32(6), np.int32(8))
        cl.enqueue_nd_range_kernel(queue, kern, (2, 1, 1), None)
        out = np.empty(8, np.float32)
        cl.enqueue_copy(queue, out, b)
        if not np.array_equal(out, [0, 2, 4, 0, 1, 3, 5, 0]):
            return "gives wrong results on a test kernel"
    except Exception as exc:
        return f"{stage} ({failure_text(exc)})"
    _OPENED[device_id(device)] = context
    return None


def device_id(device) -> Any:
    """The device's identity in this process (its cl_device_id: stable while the process lives)."""
    return getattr(device, "int_ptr", None) or id(device)


def take_context(device):
    """The context the device's passing smoke test opened (once: the first caller takes it), else None."""
    with _LOCK:
        return _CONTEXTS.pop(device_id(device), None)


def device_problems(device, check: bool = True, keep_context: bool = False) -> list[str]:
    """Why optcli cannot use this device (empty: usable).  ``check`` runs the smoke test, once
    per device per process (later calls reuse the verdict).  ``keep_context`` (the runtime picking
    its device) keeps a passing test's context for ``ClDevice`` (``take_context``): opening one is
    the largest part of a warm load on a GPU (CUDA's start).  ``optcli devices`` keeps none: a CUDA
    context holds GPU memory, and it checks devices the runtime may never use."""
    if _version(device.version) < (1, 2):
        return [f"speaks {device.version.strip()}, older than OpenCL 1.2"]
    if not check:
        return []
    key = device_id(device)
    with _LOCK:
        if key not in _VERDICTS:
            _VERDICTS[key] = _smoke_test(device)
            opened = _OPENED.pop(key, None)
            if keep_context and opened is not None:  # the runtime's pick: its ClDevice takes this context
                _CONTEXTS[key] = opened
        failure = _VERDICTS[key]
    return [failure] if failure else []


SIMULATORS = ("oclgrind", "simulator", "emulator", "emulation")  # in a platform or device name: never picked unasked


def is_simulator(device) -> bool:
    """A simulated or emulated device (Oclgrind: it calls itself a GPU and runs kernels thousands of
    times slower than a CPU device; any device whose platform, name or vendor says it simulates or
    emulates); the runtime takes one only when it is named (``--device`` / ``device=``)."""
    names = []
    for read in (lambda: device.platform.name, lambda: device.name, lambda: device.vendor):
        try:
            names.append(str(read()))
        except Exception:  # a name the driver cannot tell: judged by the others
            continue
    text = " ".join(names).lower()
    return any(word in text for word in SIMULATORS)


def _integrated(device) -> bool:
    """A GPU sharing the host's memory (an integrated or mobile GPU), as the driver reports it."""
    try:
        return bool(device.host_unified_memory)
    except Exception:  # OpenCL 2.0 deprecated the query; a driver that refuses it: count it discrete
        return False


def device_label(device) -> str:
    """One word for ``optcli devices``: gpu, cpu, accelerator, simulator or other."""
    import pyopencl as cl

    if is_simulator(device):
        return "simulator"
    kind = int(device.type)
    for flag, label in ((cl.device_type.GPU, "gpu"), (cl.device_type.ACCELERATOR, "accelerator"),
                        (cl.device_type.CPU, "cpu")):
        if kind & flag:
            return label
    return "other"


# The order the runtime tries devices in when none is named: the device most likely to be fast first.
RANKS = ("discrete GPU", "integrated GPU", "accelerator", "OpenCL on the CPU", "other OpenCL device", "simulator")


def device_rank(device) -> tuple[int, str]:
    """(place in ``RANKS``, its name): discrete GPUs, integrated GPUs, other accelerators, CPU OpenCL,
    then the rest; simulators last, and only ever used when named."""
    label = device_label(device)
    if label == "gpu":
        name = "integrated GPU" if _integrated(device) else "discrete GPU"
    else:
        name = {"accelerator": "accelerator", "cpu": "OpenCL on the CPU", "simulator": "simulator"}.get(
            label, "other OpenCL device")
    return RANKS.index(name), name


def list_devices(check: bool = True) -> list[dict[str, Any]]:
    """Every OpenCL device found (empty when there is no platform), with its capabilities."""
    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception:
        return []
    result = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except Exception:
            continue
        for d in devices:
            problems = device_problems(d, check)
            fp16 = "cl_khr_fp16" in d.extensions
            result.append({
                "platform": platform.name.strip(),
                "name": d.name.strip(),
                "vendor": d.vendor.strip(),
                "type": cl.device_type.to_string(d.type),
                "kind": device_kind(d),
                "label": device_label(d),
                "rank": device_rank(d)[1],
                "simulator": is_simulator(d),
                "version": d.version.strip(),
                "driver": d.driver_version.strip(),
                "compute_units": int(d.max_compute_units),
                "global_mem_mb": int(d.global_mem_size) >> 20,
                "max_alloc_mb": int(d.max_mem_alloc_size) >> 20,
                "local_mem_kb": int(d.local_mem_size) >> 10,
                "max_work_group_size": int(d.max_work_group_size),
                "max_work_item_sizes": [int(s) for s in d.max_work_item_sizes],
                "image_support": bool(d.image_support),
                "image2d_max": [int(d.image2d_max_width), int(d.image2d_max_height)] if d.image_support else None,
                "fp16_native": fp16,
                "usable": not problems,
                "runs_gpu_steps": False,
                "checked": check,
                "problems": problems,
                "recommended": {
                    "precision": "fp16" if fp16 else "fp32",
                    "why": ("native half arithmetic (cl_khr_fp16): fp16 halves memory traffic" if fp16 else
                            "no cl_khr_fp16: fp16 would only store half and convert on every access; "
                            "fp32 is the safer default, fp16 still saves memory"),
                },
            })
    _mark_choice(result)
    return result


def _mark_choice(found: list[dict[str, Any]]) -> None:
    """Set ``runs_gpu_steps`` on the device the runtime picks when none is named (the best ranked
    usable one that is no simulator), as ``opencl.device`` does."""
    usable = [d for d in found if d["usable"] and d["checked"] and not d["simulator"]]
    if usable:
        min(usable, key=lambda d: RANKS.index(d["rank"]))["runs_gpu_steps"] = True
