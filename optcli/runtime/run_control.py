"""How a run is stopped early: ``Predictor.cancel()`` from another thread, or the run's deadline
(``run(timeout_s=)``).  One ``RunStop`` per run; the executor looks at it between steps, the OpenCL
waits while they poll (``opencl/waits.py``), and ``Loop``/``Scan`` (ops/control_flow.py) at each iteration
(``ops.reference.RUN_STOP``), so even a file whose one step would run forever ends."""

from __future__ import annotations

import threading

from optcli.errors import Cancelled, OptError, RunLimitError


class RunStop:
    """The stop flag of one run, with why it was set.  A plain attribute, not a ``threading.Event``:
    one is made per run, and an Event (a Condition and a lock) cost 3 us, a fifth of a small
    model's run; setting an attribute from another thread is atomic under the GIL, and every
    reader polls."""

    __slots__ = ("stopped", "_why", "_timer")

    def __init__(self, timeout_s: float | None = None):
        self.stopped = False  # True: stop (read directly in the executor's loop: the fast path)
        self._why: tuple[type[OptError], str] | None = None
        self._timer = None
        if timeout_s is not None:
            self._timer = threading.Timer(timeout_s, self._stop, (RunLimitError, f"the run took longer than "
                                          f"timeout_s={timeout_s:g} s"))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        self._stop(Cancelled, "the run was cancelled (Predictor.cancel)")

    def _stop(self, kind: type[OptError], why: str) -> None:
        if self._why is None:
            self._why = (kind, why)
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped

    def check(self, where: str) -> None:
        """Raise ``Cancelled`` (cancel) or ``RunLimitError`` (deadline), saying ``where``, once stopped."""
        if self.stopped:
            kind, why = self._why or (Cancelled, "the run was stopped")
            raise kind(f"{why}; it stopped {where}")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
