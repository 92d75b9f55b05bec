"""The native library's thread pool: every item runs once, the caller waits for the workers'
items, the pool has as many threads as it is told, and it survives fork."""

from __future__ import annotations

import ctypes
import os

import pytest

from optcli import native


def _selftest(items: int, sleep_us: int) -> tuple[int, int, int]:
    """(items finished when the call returned, items the caller ran, most items running at once)."""
    stats = (ctypes.c_int64 * 2)()
    finished = native.library._lib.optcli_pool_selftest(items, sleep_us, stats)
    return finished, stats[0], stats[1]


@pytest.fixture
def threads(native_lib):
    old = native.get_num_threads()
    yield native.set_num_threads
    native.set_num_threads(old)


def test_caller_waits_for_items_workers_took(threads):
    threads(3)
    finished, by_caller, most = _selftest(60, 1000)
    assert finished == 60
    assert by_caller < 60, "no worker took an item"
    assert 2 <= most <= 3
    assert native.library._lib.optcli_pool_workers() >= 2


def test_a_smaller_pool_leaves_extra_workers_out(threads):
    threads(4)
    _selftest(40, 500)  # starts three workers
    threads(2)
    finished, _, most = _selftest(40, 1000)
    assert finished == 40 and most <= 2


def test_one_thread_runs_everything_on_the_caller(threads):
    threads(1)
    assert _selftest(10, 100) == (10, 10, 1)


def test_threads_are_clamped(threads):
    threads(0)
    assert native.get_num_threads() == 1
    threads(10_000)
    assert native.get_num_threads() == 64


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_pool_works_in_a_forked_child(threads):
    threads(2)
    assert _selftest(8, 200)[0] == 8  # workers exist in the parent now
    pid = os.fork()
    if pid == 0:  # child: threads did not survive fork; the pool must start new ones, not hang
        ok = _selftest(20, 500)[0] == 20
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


_SPIN_CHILD = """
import ctypes, glob, os, time
from optcli import native
native.set_num_threads(2)
stats = (ctypes.c_int64 * 2)()
native.library._lib.optcli_pool_selftest(8, 1000, stats)  # starts the worker and ends a job

def states():  # the pool workers' scheduler states: R running (spinning), S sleeping
    out = []
    for path in glob.glob(f"/proc/{os.getpid()}/task/*"):
        if open(f"{path}/comm").read().strip() == "optcli-pool":
            out.append(open(f"{path}/stat").read().rsplit(")", 1)[1].split()[0])
    return "".join(sorted(out)) or "-"

soon = states()
time.sleep(0.6)
print(soon, states())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc to see the worker's state")
@pytest.mark.parametrize("spin_us, spinning_after_job", [(300_000, True), (0, False)])
def test_workers_spin_for_a_bounded_time_after_a_job(native_lib, spin_us, spinning_after_job):
    """OPTCLI_POOL_SPIN_US: a worker spins that long after a job (so the next job needs no
    wake-up), then sleeps: never a core burnt for nothing once the runs stop."""
    import subprocess
    import sys

    env = dict(os.environ, OPTCLI_POOL_SPIN_US=str(spin_us))
    out = subprocess.run([sys.executable, "-c", _SPIN_CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    soon, later = out.stdout.split()
    assert "-" not in (soon, later), "no thread named optcli-pool: the states say nothing"
    assert ("R" in soon) == spinning_after_job, f"worker states right after the job: {soon}"
    assert "R" not in later, f"a worker still runs 0.6 s after the last job: {later}"
