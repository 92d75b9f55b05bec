"""The polled device wait (``runtime/opencl/waits.py``) notices a finished device soon after it
finishes.  The first GPU check (an H100) found sleeps that doubled from 20 us noticing a 1.5 ms run
only at 2.9 ms: the fp16 plan measured slower than the fp32 one although its kernels were faster.
These tests run the wait against a fake event on a fake clock, so they judge the polling itself,
not this machine's timer."""

from __future__ import annotations

import types

import pyopencl as cl
import pytest

from optcli.runtime.opencl import waits


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def perf_counter(self):
        self.now += 1e-6  # every poll costs about a microsecond
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds + 60e-6  # Linux's timer slack on top


def fake_wait(monkeypatch, done_at: float, device_type) -> Clock:
    clock = Clock()
    monkeypatch.setattr(waits, "time", types.SimpleNamespace(perf_counter=clock.perf_counter, sleep=clock.sleep))
    monkeypatch.setattr(waits, "_yield", lambda: None)

    class Event:
        @property
        def command_execution_status(self):
            return cl.command_execution_status.COMPLETE if clock.now >= done_at else cl.command_execution_status.RUNNING

    queue = types.SimpleNamespace(flush=lambda: None, device=types.SimpleNamespace(type=device_type))
    waits.wait_for(queue, Event())
    return clock


@pytest.mark.parametrize("done_ms", [0.3, 1.5, 2.9, 12.0, 250.0])
@pytest.mark.parametrize("device_type", [cl.device_type.GPU, cl.device_type.CPU], ids=["gpu", "cpu"])
def test_the_wait_ends_soon_after_the_device(monkeypatch, done_ms, device_type):
    clock = fake_wait(monkeypatch, done_ms / 1e3, device_type)
    late = clock.now - done_ms / 1e3
    assert late <= done_ms / 1e3 / 16 + 0.2e-3, f"noticed {late * 1e3:.2f} ms after a {done_ms} ms run"
    assert all(s <= waits.LONGEST_SLEEP_S for s in clock.sleeps)  # a cancel or Ctrl-C is seen within 10 ms


def test_a_gpu_wait_spins_first_and_a_cpu_wait_never_does(monkeypatch):
    assert fake_wait(monkeypatch, 1.5e-3, cl.device_type.GPU).sleeps == []
    assert fake_wait(monkeypatch, 1.5e-3, cl.device_type.CPU).sleeps, "PoCL's kernels need the core"
