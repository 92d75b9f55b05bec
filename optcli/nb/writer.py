"""Serialize a Plan to `.nb` bytes, deterministically: same plan, same bytes.

Nothing time- or host-dependent goes in; maps are written in a fixed order; weights are laid
out in name order with 64-byte alignment so the loader can map them without copying.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from optcli import __version__
from optcli.errors import OptError
from optcli.ir import Value
from optcli.nb.layout import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, SUPPORTED_DTYPES, align
from optcli.nb.quant import quantize
from optcli.plan import Plan


def encode_attr(value: Any) -> Any:
    """Attributes as msgpack-native values; tensors become a tagged map."""
    if isinstance(value, np.ndarray):
        arr = np.require(value, requirements="C")
        if arr.dtype.name not in SUPPORTED_DTYPES:
            raise OptError(f"attribute tensor of dtype {arr.dtype} cannot be stored in a .nb file")
        return {"$tensor": {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}}
    if isinstance(value, (list, tuple)):
        return [encode_attr(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _value(v: Value) -> dict:
    return {"name": v.name, "dtype": v.dtype, "shape": list(v.shape) if v.shape is not None else None}


def _body(plan: Plan, tensors: list[dict]) -> dict:
    mem = plan.memory
    return {
        "name": plan.name,
        "targets": plan.targets,
        "opsets": dict(sorted(plan.opsets.items())),
        "inputs": [_value(v) for v in plan.inputs],
        "outputs": [_value(v) for v in plan.outputs],
        "values": [_value(plan.values[k]) for k in sorted(plan.values)],
        "weights": tensors,
        "steps": [
            {"op": s.op_type, "domain": s.domain, "name": s.name, "target": s.target, "kernel": s.kernel,
             "inputs": s.inputs, "outputs": s.outputs,
             "attrs": {k: encode_attr(s.attrs[k]) for k in sorted(s.attrs)},
             "proto": s.proto, "cpu_kernel": s.cpu_kernel}
            for s in plan.steps
        ],
        "memory": {
            "offsets": {k: mem.offsets[k] for k in sorted(mem.offsets)},
            "arena_bytes": mem.arena_bytes,
            "naive_bytes": mem.naive_bytes,
        },
        "metadata": dict(sorted(plan.metadata.items())),
    }


def to_bytes(plan: Plan) -> bytes:
    blob = bytearray()
    tensors = []
    for name in sorted(plan.weights):
        arr = np.require(plan.weights[name], requirements="C")  # keeps 0-d weights 0-d
        if arr.dtype.name not in SUPPORTED_DTYPES:
            raise OptError(f"weight '{name}' has dtype {arr.dtype}, which a .nb file cannot store")
        entry: dict = {}
        if name in plan.weight_formats:
            scheme, axis, *given = plan.weight_formats[name]
            arr, scales = quantize(arr, scheme, axis, given[0] if given else None)
            entry["quant"] = {"scheme": scheme, "axis": axis, "scales": scales}
        offset = align(len(blob))
        blob.extend(b"\0" * (offset - len(blob)))
        blob.extend(arr.tobytes())
        tensors.append({"name": name, "dtype": arr.dtype.name, "shape": list(arr.shape),
                        "offset": offset, "nbytes": arr.nbytes, **entry})
    body = msgpack.packb(_body(plan, tensors), use_bin_type=True, use_single_float=False)
    blob_offset = align(HEADER_SIZE + len(body))
    header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, __version__.encode("ascii")[:16], HEADER_SIZE, len(body),
                         blob_offset, len(blob))
    data = header + body + b"\0" * (blob_offset - HEADER_SIZE - len(body)) + bytes(blob)
    return data + hashlib.sha256(data).digest()


def write_atomic(data: bytes, path: str | os.PathLike) -> Path:
    """Write to a temporary file beside ``path``, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
