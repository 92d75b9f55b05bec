"""The native wrappers' guards hold under ``python -O`` (issue 23): memory safety in optcli/native
rested on ``assert``s, which -O removes, and the C code then ran on mismatched shapes.  A child
interpreter started with -O hands each wrapper arguments it must refuse; every call must raise
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

assert False, "this child must run under python -O"  # removed by -O: reaching the cases proves it
f = np.float32
cases = {
    "gemm_conv K mismatch": lambda: native.gemm_conv(np.ones((8, 5), f), np.ones((1, 6, 10), f)),
    "gemm_conv bias length": lambda: native.gemm_conv(np.ones((8, 6), f), np.ones((1, 6, 10), f), np.ones(3, f)),
    "stem_conv2d channels": lambda: native.stem_conv2d(np.ones((1, 3, 8, 8), f), np.ones((4, 2, 3, 3), f), None,
                                                       (1, 1), (1, 1), (1, 1), (8, 8)),
    "layer_norm scale size": lambda: native.layer_norm(np.ones((4, 6), f), np.ones(5, f), None, 1e-5),
    "channel_affine scale size": lambda: native.channel_affine(np.ones((1, 4, 3), f), np.ones(3, f), None),
    "add shapes": lambda: native.add(np.ones(8, f), np.ones(9, f)),
    "row_mean split": lambda: native.row_mean(np.ones(10, f), 3),
    "conv2d_gemm group": lambda: native.conv2d_gemm(np.ones((1, 6, 8, 8), f), np.ones((4, 4, 3, 3), f), None,
                                                    (1, 1), (1, 1), (6, 6), group=2),
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
    assert len(results) == 8 and all(v == "refused" for v in results.values()), proc.stdout
