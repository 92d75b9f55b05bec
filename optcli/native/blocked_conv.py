"""The channel-blocked layout's conversions and dense conv (kernels/host/blocked_conv.c).

A value of logical shape [N, C, H, W] is stored as a C-contiguous float32 [N, ceil(C/B), H, W, B]:
channel c at block c // B, lane c % B.  B is the library's vector width (4, 8 or 16; 16 only where
the CPU has AVX-512).  Lanes of channels >= C ("pad lanes") hold finite values that never reach a
real channel: the conv reads only the C real input channels and writes act(bias 0 + 0) past M.
Callers check shapes first; the wrappers assert them.
"""

from __future__ import annotations

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.library import _check, require, vector_width


def block_width() -> int:
    """B for this process: the library's vector width (16, 8 or 4); 0 without the library."""
    return vector_width()


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """float32 [N, C, H, W] -> a new C-contiguous [N, ceil(C/B), H, W, B], pad lanes 0."""
    require(library._lib is not None and x.ndim == 4 and x.dtype == np.float32, 'to blocked')
    x = np.ascontiguousarray(x)
    n, c, h, w = x.shape
    y = np.empty((n, -(-c // block), h, w, block), np.float32)
    if y.size:
        _check(library.function("optcli_to_blocked_f32")(x, y, n, c, h * w, block), "to blocked")
    return y


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """C-contiguous float32 [N, Cb, H, W, B] -> a new [N, channels, H, W]; channels <= Cb * B."""
    require(library._lib is not None and x.ndim == 5 and x.dtype == np.float32 and x.flags.c_contiguous, 'from blocked')
    n, cb, h, w, b = x.shape
    require(0 < channels <= cb * b, 'from blocked')
    y = np.empty((n, channels, h, w), np.float32)
    if y.size:
        _check(library.function("optcli_from_blocked_f32")(x, y, n, channels, h * w, b), "from blocked")
    return y


def group_blocks(block: int) -> int:
    """G: the output blocks of a register tile at most (kernels/host/blocked_conv.c's BC_OB), 2 for B = 8,
    else 4."""
    return 2 if block == 8 else 4


def grouped_fits(channels_per_group: int, outputs_per_group: int, block: int) -> bool:
    """Whether the blocked conv takes a conv of several groups with these channels per group at block
    width B: each group's inputs whole blocks and its outputs whole blocks, so no lane mixes two groups
    (RegNet's 8-channel groups at B = 8 or 4)."""
    return block > 1 and channels_per_group % block == 0 and outputs_per_group % block == 0


def pack_conv_weights(w: np.ndarray, block: int, groups: int = 1) -> np.ndarray:
    """w [M, C, KH, KW] (one group) -> float32 C-contiguous [ceil(Mb/G), C, KH, KW, G, B] (Mb = ceil(M/B),
    G = ``group_blocks``), zero past M: output channel (g*G + o)*B + l at [g, c, kh, kw, o, l], so a
    register tile's G weight vectors lie side by side.  With ``groups`` > 1 (w [M, C/groups, KH, KW],
    ``grouped_fits``) each group's M/groups outputs are packed so, one group after another along the
    first axis.  Made once per weight."""
    require(w.ndim == 4 and block in (4, 8, 16) and groups >= 1 and w.shape[0] % groups == 0, 'pack conv weights')
    if groups > 1:
        require(grouped_fits(w.shape[1], w.shape[0] // groups, block), 'pack conv weights')
        return np.ascontiguousarray(np.concatenate([pack_conv_weights(part, block)
                                                    for part in np.split(w, groups)]))
    m, rest = w.shape[0], w.shape[1:]
    g = group_blocks(block)
    groups = -(-m // (block * g))
    padded = np.zeros((groups * g * block,) + rest, np.float32)
    padded[:m] = w
    return np.ascontiguousarray(padded.reshape((groups, g, block) + rest).transpose(0, 3, 4, 5, 1, 2))


def conv2d_blocked(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None, out_channels: int,
                   kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                   pad_begin: tuple[int, int], out: tuple[int, int], activation: str | None = None,
                   alpha: float = 0.0, beta: float = 0.0, residual: np.ndarray | None = None,
                   groups: int = 1) -> np.ndarray:
    """One-group 2-D conv of ``x``, blocked [N, ceil(C/B), H, W, B] or plain NCHW [N, C, H, W] (a
    region's first conv), by ``packed`` (``pack_conv_weights``), with ``bias`` [M] or None,
    ``residual`` None or blocked [N, ceil(M/B), OH, OW, B] added before the activation.  Zero padding
    ``pad_begin`` at the start, at the end whatever ``out`` implies.  Returns a new [N, ceil(M/B),
    OH, OW, B].  ``groups`` > 1: a grouped conv (``grouped_fits``), packed with the same groups."""
    call = prepared_conv2d_blocked(x.shape, packed, bias, out_channels, kernel, strides, dilations, pad_begin,
                                   out, activation, alpha, beta, groups)
    return call(np.ascontiguousarray(x), residual)


def prepared_conv2d_blocked(xshape: tuple[int, ...], packed: np.ndarray, bias: np.ndarray | None,
                            out_channels: int, kernel: tuple[int, int], strides: tuple[int, int],
                            dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                            activation: str | None, alpha: float, beta: float, groups: int = 1):
    """``conv2d_blocked`` for one plan step and input shape, worked out once: returns
    call(x, residual=None) for a C-contiguous float32 ``x`` of ``xshape``."""
    require(library._lib is not None and len(xshape) in (4, 5) and packed.ndim == 6, 'prepared conv2d blocked')
    require(packed.dtype == np.float32 and packed.flags.c_contiguous, 'prepared conv2d blocked')
    tiles, cg, kh, kw, g, blk = packed.shape
    mb = -(-out_channels // blk)
    c = cg * groups
    require(groups >= 1 and out_channels % groups == 0, 'prepared conv2d blocked')
    if groups > 1:
        require(grouped_fits(cg, out_channels // groups, blk), 'prepared conv2d blocked')
    tiles_per_group = -(-(mb // groups) // g)
    require((kh, kw) == tuple(kernel) and g == group_blocks(blk) and tiles_per_group * groups == tiles,
            'prepared conv2d blocked')
    n, h, w = xshape[0], xshape[2], xshape[3]
    if len(xshape) == 5:
        require(xshape[4] == blk and xshape[1] == -(-c // blk), (xshape, packed.shape))
        ib = blk
    else:
        require(xshape[1] == c, (xshape, packed.shape))
        ib = 1
    b = None
    if bias is not None:
        require(bias.ndim == 1 and bias.shape[0] <= mb * blk, 'prepared conv2d blocked')
        b = np.zeros(mb * blk, np.float32)
        b[:bias.shape[0]] = bias
    geom_values = np.array((n, c, h, w, out_channels, kh, kw, *strides, *dilations, *pad_begin, *out, ib, blk,
                            groups),
                           dtype=np.int64)
    fn, code = library.function("optcli_conv2d_blocked_f32"), ACTIVATION_CODES[activation]
    shape, empty, f32, xs = (n, mb, out[0], out[1], blk), np.empty, np.float32, tuple(xshape)

    def call(x: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
        require(x.shape == xs and x.dtype == f32 and x.flags.c_contiguous, 'prepared conv2d blocked')
        if residual is not None:
            require(residual.shape == shape and residual.dtype == f32 and residual.flags.c_contiguous,
                    'prepared conv2d blocked')
        y = empty(shape, f32)
        rc = fn(x, packed, b, residual, y, geom_values, code, alpha, beta)
        if rc:
            _check(rc, "blocked conv")
        return y

    return call
