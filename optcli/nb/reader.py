"""Read and validate a `.nb` file into a Plan.

Everything is checked before use: header fields, bounds, the checksum, the msgpack body's
shape and types (``schema.py``), weight extents and alignment, and that every kernel id names a
kernel of our own library.  Any problem is an ``NbFormatError``; no other exception escapes for
malformed input.  Weights are numpy views over a read-only memory map of the file (no copy).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import msgpack

from optcli.errors import NbFormatError
from optcli.nb.layout import (
    ALIGN,
    CHECKSUM_SIZE,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    READ_VERSIONS,
    align,
)
from optcli.nb.schema import plan_from_body
from optcli.plan import Plan


def _ext_hook(code: int, data: bytes) -> None:
    raise NbFormatError(f"msgpack extension type {code} is not allowed in a .nb body")


def _looks_like_onnx(buf, source: str) -> bool:
    """An ONNX file handed to the runtime: its name, or a ModelProto's first field (ir_version,
    field 1, a varint: byte 0x08) followed by a small version."""
    head = bytes(buf[:2])
    return str(source).lower().endswith(".onnx") or (len(head) == 2 and head[0] == 0x08 and 0 < head[1] < 32)


def read_header(buf, source: str) -> dict:
    size = len(buf)
    if bytes(buf[:len(MAGIC)]) != MAGIC and _looks_like_onnx(buf, source):
        raise NbFormatError(f"{source}: this is an ONNX model, not an optcli .nb file; optimize it first: "
                            f"opt --model_file={source} --optimize_out=model (then use model.nb)")
    if size < HEADER_SIZE + CHECKSUM_SIZE:
        raise NbFormatError(f"{source}: truncated ({size} bytes); a .nb file is at least "
                            f"{HEADER_SIZE + CHECKSUM_SIZE} bytes. Re-run opt to rebuild it")
    magic, version, flags, tool, body_off, body_len, blob_off, blob_len = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise NbFormatError(f"{source}: not an optcli .nb file (bad magic {bytes(magic)!r})")
    if version not in READ_VERSIONS:
        raise NbFormatError(f"{source}: .nb format version {version}; this optcli reads versions "
                            f"{READ_VERSIONS[0]} to {FORMAT_VERSION}. Rebuild the file with this optcli's opt, or "
                            "upgrade optcli")
    if flags != 0:
        raise NbFormatError(f"{source}: unknown header flags {flags:#x}")
    expected_blob = align(HEADER_SIZE + body_len) if body_len <= size else None
    if (body_off != HEADER_SIZE or body_len > size or blob_off != expected_blob or blob_off % ALIGN
            or blob_off + blob_len + CHECKSUM_SIZE != size):
        raise NbFormatError(f"{source}: header lengths do not match the file size ({size} bytes); "
                            "the file is truncated or corrupted")
    try:
        tool_version = tool.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise NbFormatError(f"{source}: tool version field is not ASCII") from None
    return {"format_version": version, "tool_version": tool_version, "body_offset": body_off,
            "body_length": body_len, "blob_offset": blob_off, "blob_length": blob_len, "size": size}


def verify_checksum(buf, source: str) -> None:
    end = len(buf) - CHECKSUM_SIZE
    digest = hashlib.sha256(memoryview(buf)[:end]).digest()
    if digest != bytes(buf[end:]):
        raise NbFormatError(f"{source}: checksum mismatch; the file is corrupted (re-download or re-run opt)")


def unpack_body(buf, header: dict, source: str) -> dict:
    start = header["body_offset"]
    raw = bytes(buf[start:start + header["body_length"]])
    n = len(raw)
    limits = {"max_str_len": n, "max_bin_len": n, "max_array_len": n, "max_map_len": n, "max_ext_len": 0}
    try:
        # Every length is bounded by the body's own size, and the document is walked once without
        # building anything (``skip``) before it is decoded: the decoder preallocates each array
        # from its header, so a truncated body of nested arrays each claiming ``n`` items would
        # otherwise allocate ~depth * n pointers.  A complete document holds every item it claims
        # (one byte at least), which bounds the decoder's allocation by the body's size.
        scan = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(n, 1), **limits)
        scan.feed(raw)
        scan.skip()
        if scan.tell() != n:
            raise NbFormatError(f"{source}: body has {n - scan.tell()} bytes of extra data after the msgpack map")
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_ext_hook, use_list=True, **limits)
    except NbFormatError:
        raise
    except msgpack.exceptions.OutOfData:
        raise NbFormatError(f"{source}: body is not valid msgpack (it ends inside a value); the file is "
                            "truncated or corrupted") from None
    except (ValueError, TypeError, msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException,
            RecursionError, UnicodeDecodeError) as exc:
        raise NbFormatError(f"{source}: body is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise NbFormatError(f"{source}: body must be a map, got {type(body).__name__}")
    return body


def load_bytes(buf, source: str = "<bytes>") -> tuple[Plan, dict]:
    """Validate ``buf`` (bytes, or a read-only mmap) and build the Plan; weights view ``buf``."""
    header = read_header(buf, source)
    verify_checksum(buf, source)
    body = unpack_body(buf, header, source)
    blob = memoryview(buf)[header["blob_offset"]:header["blob_offset"] + header["blob_length"]]
    header["sha256"] = bytes(buf[len(buf) - CHECKSUM_SIZE:]).hex()
    return plan_from_body(body, blob, source), header


def load_file(path: str | os.PathLike) -> tuple[Plan, dict]:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise NbFormatError(f"{path}: empty file; re-run opt to rebuild it")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise NbFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NbFormatError(f"{path}: is a directory, not a .nb file") from None
    except PermissionError:
        raise NbFormatError(f"{path}: permission denied") from None
    return load_bytes(buf, str(path))
