"""Byte layout of a `.nb` file, versions 1 and 2 (see docs/nb-format.md).

    offset  size  field
    0       8     magic b"OPTCLINB"
    8       4     format version (u32, little-endian)
    12      4     flags (u32, 0)
    16      16    tool version, ASCII, NUL padded
    32      8     body offset (u64, always 64)
    40      8     body length (u64)
    48      8     blob offset (u64, body end rounded up to 64)
    56      8     blob length (u64)
    64      ...   body: msgpack map
    ...     ...   zero padding to 64
    blob    ...   weights, each tensor 64-byte aligned
    end-32  32    SHA-256 of every byte before it
"""

from __future__ import annotations

import struct

MAGIC = b"OPTCLINB"
FORMAT_VERSION = 2  # the newest this optcli writes and reads
READ_VERSIONS = (1, 2)
"""Version 2 adds compiled If/Loop/Scan bodies (``optcli`` ops and fused epilogues inside a step's
proto, checked at load by ``runtime/body_checks.py``); a file without them is written as version 1,
which older readers still take (``writer.format_version``)."""
HEADER = struct.Struct("<8sII16sQQQQ")
HEADER_SIZE = HEADER.size  # 64
ALIGN = 64
CHECKSUM_SIZE = 32
SUPPORTED_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32",
                    "uint32", "int64", "uint64", "bool")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
