"""Host waits on the OpenCL device that come back to Python often.

pyopencl's own waits (``queue.finish()``, a blocking read, ``event.wait()``) return only when the
device has done everything asked of it; on a slow device (a simulator: minutes per run) Ctrl-C
then waits for the whole run, and nothing can cancel it from another thread.  Here the queue is
flushed and the event polled, sleeping between polls from 20 us up to 10 ms: Python's signal
handlers run in the sleeps (Ctrl-C ends the wait at once) and a cancel flag set by another thread is
seen within 10 ms (a deadline too), while a short wait costs a few microseconds more than a blocking one.

A wait left early leaves the device working on what was queued: the queue stays in order, so the
next run's commands follow it, and the host memory those commands read or write is kept until a
later wait sees them done (``OpenClSteps``).
"""

from __future__ import annotations

import time

FIRST_SLEEP_S = 20e-6
LONGEST_SLEEP_S = 0.01  # a cancel or a signal is seen within this (issue 21 asks for 100 ms at most)


def wait_for(queue, event, stop=None) -> None:
    """Return when ``event`` is complete; raise what ``stop`` (``runtime.run_control.RunStop``) says
    once it is set first (a cancel, a deadline), or what the device reported for a failed command (a
    negative status: ``event.wait()`` raises it)."""
    import pyopencl as cl

    queue.flush()  # without it some drivers never start what was enqueued
    complete = cl.command_execution_status.COMPLETE
    sleep = FIRST_SLEEP_S
    while True:
        status = event.command_execution_status
        if status == complete:
            return
        if status < 0:  # the command failed: pyopencl raises the device's error
            event.wait()
            return
        if stop is not None:
            stop.check("while the OpenCL device was working")
        time.sleep(sleep)
        sleep = min(sleep * 2, LONGEST_SLEEP_S)


def drain(queue, stop=None) -> None:
    """``queue.finish()`` that comes back to Python while it waits (see the module docstring)."""
    import pyopencl as cl

    wait_for(queue, cl.enqueue_marker(queue), stop)
