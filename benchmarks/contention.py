"""Busy cores on purpose: ``bench_cpu.py --busy N`` times both runtimes while N other processes
spin, to see how each degrades when the machine is not theirs alone (issue 11: ``threads=2``
once collapsed to 30x slower under contention while onnxruntime slowed 2-4x).

Each hog is a separate process running a pure-Python loop at normal priority: what a compiler or
a browser tab does to a phone's or a CI runner's cores.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp


def _spin() -> None:  # pragma: no cover - runs in the hog processes
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


@contextlib.contextmanager
def busy_cores(n: int):
    """Keep ``n`` cores busy with other processes while the block runs."""
    hogs = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(max(0, n))]
    for h in hogs:
        h.start()
    try:
        yield
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.join(timeout=5)
