"""The channel-packed layout (NC4HW4) that GPU tensors use.

GPUs read 4-wide vectors, so channels are stored in slices of four: element (n, c, h, w) lives at
``(((n * C4 + c // 4) * H + h) * W + w) * 4 + c % 4`` with ``C4 = ceil(C / 4)`` and the padding
channels zero.  Tensors of rank below 4 map onto (N, C, H, W) as below, so one layout and one set
of kernels serves classifier heads ([N, K] -> N, C=K) and sequences alike.
"""

from __future__ import annotations

import numpy as np


def dims4(shape: tuple[int, ...] | list[int]) -> tuple[int, int, int, int]:
    """(N, C, H, W) a tensor of rank <= 4 is stored as."""
    s = tuple(int(d) for d in shape)
    if len(s) == 0:
        return 1, 1, 1, 1
    if len(s) == 1:
        return 1, s[0], 1, 1
    if len(s) == 2:
        return s[0], s[1], 1, 1
    if len(s) == 3:
        return s[0], s[1], 1, s[2]
    if len(s) == 4:
        return s  # type: ignore[return-value]
    raise ValueError(f"rank {len(s)} tensors have no packed GPU layout")


def c4(channels: int) -> int:
    return (channels + 3) // 4


def packed_elements(shape) -> int:
    n, c, h, w = dims4(shape)
    return n * c4(c) * h * w * 4


def pack(x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """NCHW (rank <= 4) -> flat NC4HW4 array of ``dtype``."""
    n, c, h, w = dims4(x.shape)
    x4 = np.asarray(x).reshape(n, c, h, w)
    out = np.zeros((n, c4(c) * 4, h, w), dtype=dtype)
    out[:, :c] = x4
    return np.ascontiguousarray(out.reshape(n, c4(c), 4, h, w).transpose(0, 1, 3, 4, 2)).reshape(-1)


def unpack(p: np.ndarray, shape, dtype=np.float32) -> np.ndarray:
    """Flat NC4HW4 -> NCHW array of ``shape``."""
    n, c, h, w = dims4(shape)
    x = np.asarray(p).reshape(n, c4(c), h, w, 4).transpose(0, 1, 4, 2, 3).reshape(n, c4(c) * 4, h, w)
    return np.ascontiguousarray(x[:, :c]).astype(dtype, copy=False).reshape(tuple(shape))
