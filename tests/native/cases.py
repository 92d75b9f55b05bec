"""Depthwise cases shared by the native kernel tests (host and aarch64): odd shapes on purpose."""

from __future__ import annotations

from unittest import mock

import numpy as np

from optcli import native
from optcli.ops.conv import conv_depthwise

# (id, x shape, weight shape, attrs): one channel, primes, 1x1 spatial, rows shorter and longer
# than a vector, big planes, every stride, dilation and padding form, channel multipliers.
DEPTHWISE_CASES = [
    ("c1-1x1-pad1", (1, 1, 1, 1), (1, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c1-large", (1, 1, 150, 130), (1, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c2-2x3-valid", (1, 2, 2, 3), (2, 1, 1, 3), {}),
    ("c3-s2", (1, 3, 9, 9), (3, 1, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("c7-s2-odd", (1, 7, 17, 23), (7, 1, 3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    ("c13-5x5-s1", (1, 13, 19, 11), (13, 1, 5, 5), {"pads": [2, 2, 2, 2]}),
    ("c17-5x5-s2", (2, 17, 15, 16), (17, 1, 5, 5), {"strides": [2, 2], "pads": [1, 2, 2, 1]}),
    ("c5-dil2", (1, 5, 12, 12), (5, 1, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ("c5-dil3-s2", (1, 5, 20, 21), (5, 1, 3, 3), {"dilations": [3, 3], "strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ("c11-5x5-dil2", (1, 11, 14, 9), (11, 1, 5, 5), {"dilations": [2, 1], "pads": [4, 2, 4, 2]}),
    ("c6-same-upper-s2", (1, 6, 10, 11), (6, 1, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("c6-same-lower-5x5", (1, 6, 10, 11), (6, 1, 5, 5), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("c4-valid-s3", (1, 4, 11, 13), (4, 1, 3, 3), {"strides": [3, 3], "auto_pad": "VALID"}),
    ("c3-mult2", (1, 3, 8, 9), (6, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c2-mult3-s2", (2, 2, 9, 7), (6, 1, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),
    ("c8-strides-21", (1, 8, 10, 12), (8, 1, 3, 3), {"strides": [2, 1], "pads": [1, 1, 1, 1]}),
    ("c9-7x7", (1, 9, 14, 14), (9, 1, 7, 7), {"pads": [3, 3, 3, 3]}),
    ("c5-1x5-neg-pad", (1, 5, 6, 12), (5, 1, 1, 5), {"pads": [0, -1, 0, 2]}),
    ("c31-wide-pads", (1, 31, 4, 4), (31, 1, 3, 3), {"pads": [3, 2, 2, 3]}),
    ("c96-112-s2", (1, 96, 112, 112), (96, 1, 3, 3), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("c144-56", (1, 144, 56, 56), (144, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c1152-7-5x5", (1, 1152, 7, 7), (1152, 1, 5, 5), {"pads": [2, 2, 2, 2]}),
    ("c7-1d", (1, 7, 29), (7, 1, 5), {"pads": [2, 2], "strides": [2]}),
]

# Epilogue parameters per activation (alpha, beta), as the fusion pass writes them.
ACT_PARAMS = {"relu": (0.0, 0.0), "clip": (0.0, 6.0), "leaky_relu": (0.1, 0.0), "sigmoid": (0.0, 0.0),
              "tanh": (0.0, 0.0), "hard_sigmoid": (0.2, 0.5), "hard_swish": (0.0, 0.0), "swish": (0.0, 0.0),
              "gelu": (0.0, 0.0), "gelu_tanh": (0.0, 0.0)}


def make_case(xs, ws, attrs, seed=0, activation=None, bias=True):
    """(x, w, bias, kernel attrs) for one case, seeded."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    full = {"group": xs[1], "kernel_shape": list(ws[2:]), **attrs}
    if activation:
        a, be = ACT_PARAMS[activation]
        full.update(activation=activation, activation_alpha=a, activation_beta=be)
    return x, w, b, full


def numpy_depthwise(x, w, b, attrs) -> np.ndarray:
    """The numpy kernel's answer, with the native library out of the way."""
    with mock.patch.object(native.library, "_lib", None):
        return conv_depthwise([x, w, b], dict(attrs))[0]


# Stem convs (one group, few input channels: kernels/host/stem.c), (id, x shape, w shape, attrs): one to four
# input channels, output channels off every register tile (4 or 8 channels) and primes, a 1x1
# output, rows shorter and longer than a vector (4, 8, 16 floats), every stride 1..3, dilation,
# asymmetric, SAME and negative pads, batches, the real stems at full size, and wider convs it
# also takes (native.stem_fits).
STEM_CASES = [
    ("c1-1x1-out", (1, 1, 1, 1), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c3-1x1-kernel", (1, 3, 5, 7), (5, 3, 1, 1), {}),
    ("c3-s2-odd", (1, 3, 17, 23), (13, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("c2-s3-prime", (2, 2, 29, 31), (7, 2, 5, 5), {"strides": [3, 3], "pads": [2, 1, 0, 2]}),
    ("c4-7x7-s2", (1, 4, 37, 41), (17, 4, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ("c1-dil2", (1, 1, 19, 21), (9, 1, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ("c3-dil-s2", (1, 3, 20, 33), (6, 3, 3, 5), {"dilations": [3, 2], "strides": [2, 2], "pads": [3, 4, 1, 0]}),
    ("c3-strides-12", (1, 3, 10, 50), (11, 3, 3, 3), {"strides": [1, 2], "pads": [0, 1, 2, 1]}),
    ("c3-strides-31", (1, 3, 16, 9), (8, 3, 2, 3), {"strides": [3, 1]}),
    ("c3-same-upper-s2", (1, 3, 15, 16), (10, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("c3-same-lower-5x5", (1, 3, 14, 13), (12, 3, 5, 5), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("c2-valid-s3", (1, 2, 11, 13), (4, 2, 3, 3), {"strides": [3, 3], "auto_pad": "VALID"}),
    ("c4-wide-pads", (1, 4, 4, 4), (19, 4, 3, 3), {"pads": [3, 2, 2, 3]}),
    ("c3-neg-pads", (1, 3, 11, 12), (9, 3, 3, 3), {"pads": [-1, 2, 0, -2], "strides": [1, 2]}),
    ("c3-224-mnv3", (1, 3, 224, 224), (16, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("c3-224-rn18", (1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ("c3-128-face", (2, 3, 128, 128), (24, 3, 5, 5), {"strides": [2, 2], "pads": [1, 1, 2, 2]}),
    ("c1-large", (1, 1, 300, 260), (5, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    # beyond the stems, where it measured faster than the GEMM: 3x3 windows of up to 64 channels
    ("c16-3x3", (1, 16, 20, 30), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("c64-3x3-s2", (2, 64, 29, 29), (40, 64, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


# Grouped convs the grouped stem conv takes (optcli_stem_conv2d_grouped_f32: few channels a group):
# (name, x shape, w shape [M, C / groups, KH, KW], attrs with "group").
GROUPED_STEM_CASES = [
    ("g3-c8-s2-regnet", (1, 24, 29, 31), (24, 8, 3, 3), {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("g7-c8-7x7", (2, 56, 7, 7), (56, 8, 3, 3), {"group": 7, "pads": [1, 1, 1, 1]}),
    ("g2-mult5", (1, 6, 13, 17), (10, 3, 3, 3), {"group": 2, "pads": [0, 1, 2, 1]}),  # M / G != C / G
    ("g5-c2-dil2", (1, 10, 11, 19), (15, 2, 3, 3), {"group": 5, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ("g4-c3-5x5-s3", (1, 12, 23, 22), (8, 3, 5, 5), {"group": 4, "strides": [3, 3], "pads": [2, 1, 2, 1]}),
    ("g19-c8-1x1row", (1, 152, 1, 9), (152, 8, 1, 3), {"group": 19, "pads": [0, 1, 0, 1]}),
]

