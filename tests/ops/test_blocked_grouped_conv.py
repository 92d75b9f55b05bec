"""Grouped convs (neither one group nor depthwise) in the blocked layout (ops/blocked.py
``conv_blocked``): where each group's inputs and outputs are whole blocks the native blocked conv
runs them directly (kernels/host/blocked_conv.c, groups > 1), elsewhere the NCHW conv between
conversions.  Both against onnxruntime on odd shapes: RegNet's 8-channel groups, 16 and 4 a group,
1 channel a group (not depthwise: 2 outputs each), primes, 1x1 images, strides, dilations,
asymmetric pads, two images, every activation, garbage in the input's pad lanes."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.ops import blocked
from optcli.ops.activation import activate
from optcli.ops.registry import StepAttrs
from tests.helpers import assert_close, run_ort
from tests.native.cases import ACT_PARAMS
from tests.ops.test_blocked_head_gemv import _native_blocked_or_skip
from tests.passes.ir_build import model, node

# (N, C, M, H, W, kernel, stride, dilation, pads [top, left, bottom, right], groups)
CASES = [
    (1, 24, 24, 13, 11, 3, 2, 1, (1, 1, 1, 1), 3),
    (2, 40, 40, 7, 5, 3, 1, 1, (1, 1, 1, 1), 5),
    (1, 16, 32, 1, 1, 3, 1, 1, (1, 1, 1, 1), 2),
    (1, 32, 16, 9, 10, 3, 1, 2, (2, 1, 0, 3), 2),
    (1, 32, 64, 6, 7, 1, 1, 1, (0, 0, 0, 0), 4),
    (1, 64, 64, 5, 17, 3, 2, 1, (0, 1, 1, 0), 4),
    (1, 12, 24, 5, 5, 3, 2, 1, (0, 1, 1, 0), 3),    # 4 channels a group: whole blocks at B = 4 only
    (1, 6, 12, 7, 7, 3, 1, 1, (1, 1, 1, 1), 6),     # 1 channel a group, 2 outputs: through NCHW
    (1, 21, 14, 5, 3, 3, 1, 1, (1, 1, 1, 1), 7),    # 3 -> 2 a group, primes: through NCHW
]
ACTS = [None, *ACT_PARAMS]


@pytest.mark.parametrize("block", (4, 8))
@pytest.mark.parametrize("case", CASES, ids=[f"c{c[1]}_m{c[2]}_g{c[9]}_{c[3]}x{c[4]}" for c in CASES])
def test_grouped_conv_matches_onnxruntime(case, block):
    _native_blocked_or_skip()
    n, c, m, h, w, k, s, d, pads, groups = case
    i = CASES.index(case)
    rng = np.random.default_rng(i)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c // groups, k, k)) / np.sqrt(c // groups * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    want = run_ort(model([node("Conv", ["x", "w", "b"], ["y"], pads=list(pads), strides=[s, s], dilations=[d, d],
                               group=groups)], {"x": list(x.shape)}, initializers={"w": wt, "b": b}), {"x": x})[0]
    act = ACTS[i % len(ACTS)]
    alpha, beta = ACT_PARAMS.get(act, (0.0, 0.0))
    want = activate(want, act, alpha, beta)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "dilations": [d, d], "pads": list(pads), "group": groups}
    if act:
        attrs.update(activation=act, activation_alpha=alpha, activation_beta=beta)
    xb = blocked.to_blocked(x, block)
    if c % block:
        xb[:, -1, :, :, c % block:] = 1e30
    step = StepAttrs(dict(attrs))
    for _ in range(2):  # the first run works the native call out, the second takes it from the memo
        y = blocked.conv_blocked([xb, wt, b], step)[0]
        assert y.shape == (n, -(-m // block), *want.shape[2:], block)
        assert_close(blocked.from_blocked(y, m), want, "fp32", what=f"{case} B={block} {act}")
    direct = c // groups % block == 0 and m // groups % block == 0
    assert ("nchwc grouped" in step.memo) == direct, "whole-block groups take the native grouped conv"
