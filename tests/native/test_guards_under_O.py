"""The native wrappers' guards hold under ``python -O`` (issue 23): memory safety in optcli/native
rested on ``assert``s, which -O removes, and the C code then ran on mismatched shapes.  A child
interpreter started with -O hands each wrapper arguments it must refuse (a blocked conv told a
1x1 window for its 3x3 weight among them); every call must raise
``NativeError`` before C runs.  (The check lives in the child's own code, not in pytest asserts:
-O would strip those too.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optcli import native

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import numpy as np
from optcli import native
from optcli.native.library import NativeError
from optcli.native import qgemm
from optcli.native.blocked_conv import conv2d_blocked, pack_conv_weights

assert False, "this child must run under python -O"  # removed by -O: reaching the cases proves it
f = np.float32
cases = {
    "gemm_conv K mismatch": lambda: native.gemm_conv(np.ones((8, 5), f), np.ones((1, 6, 10), f)),
    "gemm_conv bias length": lambda: native.gemm_conv(np.ones((8, 6), f), np.ones((1, 6, 10), f), np.ones(3, f)),
    "stem_conv2d channels": lambda: native.stem_conv2d(np.ones((1, 3, 8, 8), f), np.ones((4, 2, 3, 3), f), None,
                                                       (1, 1), (1, 1), (1, 1), (8, 8)),
    "prepared_stem_conv2d channels": lambda: native.prepared_stem_conv2d(
        (1, 3, 8, 8), np.ones((4, 2, 3, 3), f), None, (1, 1), (1, 1), (1, 1), (8, 8), None, 0.0, 0.0),
    "transpose_conv_taps columns": lambda: native.transpose_conv_taps(np.ones((1, 12, 16), f), None, 1, 4, 4, 4, 2, 2),
    "transpose_conv_taps bias": lambda: native.transpose_conv_taps(np.ones((1, 16, 16), f), np.ones(3, f),
                                                                    1, 4, 4, 4, 2, 2),
    "layer_norm scale size": lambda: native.layer_norm(np.ones((4, 6), f), np.ones(5, f), None, 1e-5),
    "channel_affine scale size": lambda: native.channel_affine(np.ones((1, 4, 3), f), np.ones(3, f), None),
    "add shapes": lambda: native.add(np.ones(8, f), np.ones(9, f)),
    "row_mean split": lambda: native.row_mean(np.ones(10, f), 3),
    "conv2d_gemm group": lambda: native.conv2d_gemm(np.ones((1, 6, 8, 8), f), np.ones((4, 4, 3, 3), f), None,
                                                    (1, 1), (1, 1), (6, 6), group=2),
    "conv2d_blocked kernel_shape": lambda: conv2d_blocked(np.ones((1, 2, 8, 8, 8), f),
                                                          pack_conv_weights(np.ones((16, 16, 3, 3), f), 8), None, 16,
                                                          (1, 1), (1, 1), (1, 1), (0, 0), (8, 8)),
    # an integer conv whose group claims 8 input channels per output channel where w holds 1
    "prepared_qconv group": lambda: qgemm.prepared_qconv(
        (1, 8, 6, 6), np.uint8, np.ones((4, 1, 3, 3), np.int8), None, np.ones(4, f),
        (1, 8, 6, 6, 4, 3, 3, 1, 1, 1, 1, 0, 0, 4, 4, 1), (0, 0, 0, 255, 0, 0), np.uint8),
}
for name, call in cases.items():
    try:
        call()
        print(name, "RAN")
    except NativeError:
        print(name, "refused")
    except Exception as exc:
        print(name, "other", type(exc).__name__, exc)
"""


@pytest.mark.skipif(not native.available(), reason=native.status())
def test_every_guard_holds_under_python_O():
    proc = subprocess.run([sys.executable, "-O", "-c", textwrap.dedent(CHILD)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = dict(line.rsplit(" ", 1) if line.endswith(("refused", "RAN")) else (line, "other")
                   for line in proc.stdout.strip().splitlines())
    assert len(results) == 13 and all(v == "refused" for v in results.values()), proc.stdout


@pytest.mark.skipif(not native.available(), reason=native.status())
def test_the_geometry_array_outlives_a_cache_clear_before_the_c_call(monkeypatch):
    """Issue 23, part 9: another thread's predictor may clear the shared geometry cache between
    ``_geom`` and the C call; the array the caller passes (held by the call) stays valid.  Here the
    clear happens at exactly that moment, and new arrays of the same size, filled with -1, are made
    just before the C call: had the caller kept only an address, numpy's small-block cache would
    hand them the freed block and C would read their -1s as the geometry."""
    import numpy as np

    from optcli.native import caches, library, window

    real_geom, real_function, planted = caches._geom, library.function, []

    def racing_geom(values):
        hit = real_geom(values)
        caches._GEOMS.clear()  # another thread's predictor, at 4096 geometries
        return hit

    def planting_function(name):
        fn = real_function(name)

        def call(*args):
            planted.extend(np.full(15, -1, np.int64) for _ in range(8))
            return fn(*args)

        return call

    monkeypatch.setattr(window, "_geom", racing_geom)
    monkeypatch.setattr(library, "function", planting_function)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    want = sum(xp[:, i:i + 9, j:j + 9] * w[:, 0, i, j, None, None] for i in range(3) for j in range(3))[None]
    for _ in range(3):
        y = native.depthwise_conv2d(x, w, None, (1, 1), (1, 1), (1, 1), (9, 9))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert planted
