"""``optcli devices`` / ``optcli.list_devices()``: the OpenCL devices on this machine, the
capabilities the runtime relies on, whether each is usable, and the options recommended for it.

An app can call this before choosing the GPU: a device is usable when it speaks OpenCL 1.2 or
later and builds and runs a small kernel of our library correctly.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np


def _version(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _smoke_test(device) -> str | None:
    """Build and run the pack kernel on the device; None when it works, else what failed."""
    try:
        import pyopencl as cl

        from optcli.runtime.opencl import ClDevice

        dev = ClDevice(device)
        kern = dev.kernel("layout.cl", "pack_nc4hw4", {"STORAGE_HALF": 0})
        src = np.arange(6, dtype=np.float32)
        a = cl.Buffer(dev.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=src)
        b = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 2 * 4 * 4)
        kern.set_args(a, b, np.int32(1), np.int32(3), np.int32(1), np.int32(2))
        cl.enqueue_nd_range_kernel(dev.queue, kern, (2, 1, 1), None)
        out = np.empty(8, np.float32)
        cl.enqueue_copy(dev.queue, out, b)
        if not np.array_equal(out, [0, 2, 4, 0, 1, 3, 5, 0]):
            return "a test kernel gave wrong results"
    except Exception as exc:
        return f"a test kernel failed ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]})"
    return None


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
            problems = []
            if _version(d.version) < (1, 2):
                problems.append(f"OpenCL {d.version.strip()} is older than 1.2")
            if check and not problems:
                failure = _smoke_test(d)
                if failure:
                    problems.append(failure)
            fp16 = "cl_khr_fp16" in d.extensions
            result.append({
                "platform": platform.name.strip(),
                "name": d.name.strip(),
                "vendor": d.vendor.strip(),
                "type": cl.device_type.to_string(d.type),
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
                "problems": problems,
                "recommended": {
                    "precision": "fp16" if fp16 else "fp32",
                    "why": ("native half arithmetic (cl_khr_fp16): fp16 halves memory traffic" if fp16 else
                            "no cl_khr_fp16: fp16 would only store half and convert on every access; "
                            "fp32 is the safer default, fp16 still saves memory"),
                },
            })
    return result
