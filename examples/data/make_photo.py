"""Draw the bundled test photo (examples/data/sunset.png): a 96x64 sunset, procedurally, with numpy
and zlib only (no Pillow needed to make it).  Run it again to re-create the file byte for byte."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import numpy as np


def sunset(width: int = 96, height: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    t = y / (height - 1)
    sky = np.stack([0.95 - 0.15 * t, 0.35 + 0.35 * t, 0.25 + 0.1 * t], -1)  # red-orange to peach
    sun = np.exp(-(((x - width * 0.6) ** 2 + (y - height * 0.55) ** 2) / (2 * (height * 0.12) ** 2)))
    img = sky + sun[..., None] * np.array([0.05, 0.35, 0.1], np.float32)
    sea = y > height * 0.72
    img[sea] = img[sea] * np.array([0.7, 0.45, 0.5], np.float32)
    img += np.sin(x * 0.9 + y * 0.4)[..., None] * 0.02 * sea[..., None]  # ripples
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def write_png(path: Path, rgb: np.ndarray) -> None:
    height, width, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                     + chunk(b"IEND", b""))


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sunset.png")
    write_png(out, sunset())
    print(f"wrote {out}")
