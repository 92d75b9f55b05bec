"""Serialize a Plan to `.nb` bytes, deterministically: same plan, same bytes.

Nothing time- or host-dependent goes in; maps are written in a fixed order; weights are laid
out in name order with 64-byte alignment so the loader can map them without copying.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from optcli._version import __version__
from optcli.errors import OptError, OutputError
from optcli.ir import OPTCLI_DOMAIN, Value
from optcli.nb.layout import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, SUPPORTED_DTYPES, align
from optcli.ops.activation import QUANT_ATTR
from optcli.ops.reference import CONTROL_FLOW
from optcli.ops.weight_quant import quantize
from optcli.plan import Plan

EPILOGUE_NAMES = frozenset({"activation", "activation_alpha", "activation_beta", QUANT_ATTR})


def format_version(plan: Plan) -> int:
    """The oldest format that holds the plan: 2 when a control-flow step's bodies were compiled (an
    ``optcli`` op or a fused epilogue inside), 1 otherwise, so older readers keep taking files that
    need nothing newer.  A version-1 reader would refuse such a body only by accident of onnx's
    checker; the version says it."""
    steps = [s for s in plan.steps if s.proto is not None and s.op_type in CONTROL_FLOW]
    return FORMAT_VERSION if any(_compiled(s.proto) for s in steps) else 1


def _compiled(proto: bytes) -> bool:
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(proto)

    def walk(n) -> bool:
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                for inner in g.node:
                    if inner.domain == OPTCLI_DOMAIN or any(x.name in EPILOGUE_NAMES for x in inner.attribute) \
                            or walk(inner):
                        return True
        return False

    return walk(node)


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
    header = HEADER.pack(MAGIC, format_version(plan), 0, __version__.encode("ascii")[:16], HEADER_SIZE, len(body),
                         blob_offset, len(blob))
    data = header + body + b"\0" * (blob_offset - HEADER_SIZE - len(body)) + bytes(blob)
    return data + hashlib.sha256(data).digest()


def write_atomic(data: bytes, path: str | os.PathLike) -> Path:
    """Write to a temporary file beside ``path``, then rename: never a half-written file.

    The temporary name carries this process's id, so a later write to the same folder can tell
    the leftovers of a killed run (its process is gone) from a write in progress, and removes
    them.  Every failure to write (read-only folder, full disk, a file of another user) is an
    ``OutputError`` that names the path: the user's environment, not our bug.
    """
    path = Path(path)
    blocker = next((p for p in [*reversed(path.parents)] if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # mkdir would say only "File exists"
        raise OutputError(f"cannot write {path}: {blocker} is a file, not a folder; choose another output path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; check that the folder exists and is "
                          "writable") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}; check free space and that the file "
                              "is yours and writable") from None
        raise
    return path


_TEMPORARY = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$")


def remove_stale_temporaries(folder: Path) -> int:
    """Delete our temporary files in ``folder`` whose writing process no longer exists."""
    removed = 0
    for entry in folder.glob(".*.tmp"):
        match = _TEMPORARY.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if entry.is_file() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                entry.unlink()
                removed += 1
        except OSError:
            continue  # gone already, or not ours to remove: leave it
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True
