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
    finished = native._lib.optcli_pool_selftest(items, sleep_us, stats)
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
    assert native._lib.optcli_pool_workers() >= 2


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
