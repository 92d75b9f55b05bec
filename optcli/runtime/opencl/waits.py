"""Host waits on the OpenCL device that come back to Python often.

pyopencl's own waits (``queue.finish()``, a blocking read, ``event.wait()``) return only when the
device has done everything asked of it; on a slow device (a simulator: minutes per run) Ctrl-C
then waits for the whole run, and nothing can cancel it from another thread.  Here the queue is
flushed and the event polled: Python's signal handlers run between polls (Ctrl-C ends the wait at
once) and a cancel flag set by another thread is seen within 10 ms (a deadline too).

How often to poll decides the latency a run pays on a fast device.  The first GPU check (an H100)
showed it: sleeps doubling from 20 us (each ~60 us more in Linux's timer slack) noticed a 1.5 ms
run only at 2.9 ms, so an fp16 plan whose kernels took 1.5 ms measured slower than the fp32 plan
whose kernels took 2.1 ms.  So on a GPU the wait polls without sleeping for its first ``SPIN_S``
(most batch-1 runs end inside it; a status query costs about a microsecond, and each poll lets
other Python threads run), then sleeps a sixteenth of the time waited so far (at least
``FIRST_SLEEP_S``, at most ``LONGEST_SLEEP_S``): a wait ends at most ~6% plus one timer slack after
the device finished.  OpenCL on the CPU gets no spinning: the polling core is one its kernels need.

A wait left early leaves the device working on what was queued: the queue stays in order, so the
next run's commands follow it, and the host memory those commands read or write is kept until a
later wait sees them done (``OpenClSteps``).
"""

from __future__ import annotations

import os
import time

_yield = getattr(os, "sched_yield", lambda: None)
SPIN_S = 0.002  # poll without sleeping this long (a batch-1 GPU run ends within it)
FIRST_SLEEP_S = 50e-6
LONGEST_SLEEP_S = 0.01  # a cancel or a signal is seen within this (issue 21 asks for 100 ms at most)


def wait_for(queue, event, stop=None) -> None:
    """Return when ``event`` is complete; raise what ``stop`` (``runtime.run_control.RunStop``) says
    once it is set first (a cancel, a deadline), or what the device reported for a failed command (a
    negative status: ``event.wait()`` raises it)."""
    import pyopencl as cl

    queue.flush()  # without it some drivers never start what was enqueued
    complete = cl.command_execution_status.COMPLETE
    start = time.perf_counter()
    spin = 0.0 if queue.device.type & cl.device_type.CPU else SPIN_S
    polls = 0
    while True:
        status = event.command_execution_status
        if status == complete:
            return
        if status < 0:  # the command failed: pyopencl raises the device's error
            event.wait()
            return
        polls += 1
        if polls & 63 == 0 and stop is not None:  # while spinning, the flag every 64 polls
            stop.check("while the OpenCL device was working")
        waited = time.perf_counter() - start
        if waited < spin:
            _yield()  # lets other Python threads run (releases the GIL), ~1 us; time.sleep(0) takes ~100 us
            continue
        if stop is not None:
            stop.check("while the OpenCL device was working")
        time.sleep(min(max(waited / 16, FIRST_SLEEP_S), LONGEST_SLEEP_S))


def drain(queue, stop=None) -> None:
    """``queue.finish()`` that comes back to Python while it waits (see the module docstring)."""
    import pyopencl as cl

    wait_for(queue, cl.enqueue_marker(queue), stop)
