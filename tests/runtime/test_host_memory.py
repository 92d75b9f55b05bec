"""The malloc tuning of runtime/host/memory.py: applied once, where glibc is, and only then."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import ctypes, numpy as np, optcli
from optcli.runtime.host import memory
from optcli.zoo.models import build, sample_inputs
model = build("mobilenet_v2")
pred = optcli.load(optcli.optimize(model=model, valid_targets="arm").data, threads=1)
pred.run(sample_inputs(model, seed=0))
# a 24 MB block, larger than any activation the model freed (glibc's adaptive threshold rises
# to the largest freed block) and below the tuned 32 MB: from the heap with the tuning, an mmap
# without it; mallinfo2's hblkhd counts the bytes in live mmapped blocks
a = np.ones(24 << 18, dtype=np.float32)
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
print(memory.keep_freed_memory(), "|", libc.mallinfo2().hblkhd >= 24 << 20)
"""


def _child(env_extra: dict[str, str]) -> tuple[str, bool]:
    import os

    out = subprocess.run([sys.executable, "-c", CHILD], env=dict(os.environ, **env_extra), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    state, mmapped = out.stdout.strip().rsplit("|", 1)
    return state.strip(), mmapped.strip() == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_loading_a_host_plan_keeps_blocks_in_the_heap():
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("needs glibc >= 2.33 (mallinfo2) to look at the heap")
    state, mmapped = _child({})
    assert "freed blocks kept" in state
    assert not mmapped, "a 24 MB array still went to mmap: the threshold was not raised"
    state, mmapped = _child({"OPTCLI_MALLOC_TUNING": "0"})
    assert state == "left alone (OPTCLI_MALLOC_TUNING=0)"
    assert mmapped, "without the tuning a 24 MB block should be mmapped (glibc's default threshold)"
