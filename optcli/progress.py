"""Progress for long work (calibration, verification, tuning, benchmarks).

On a terminal: a tqdm bar.  Elsewhere (stderr not a TTY, or ``CI`` set): one line every
``EVERY_SECONDS`` (5 s; ``OPTCLI_PROGRESS_SECONDS`` changes it, 0 turns the lines off), so a CI log
shows life: what is running, how many items are done, and the op being evaluated::

    optcli: calibrating (ranges): 12/32 samples, 41 s, at Conv 'model.22/cv3.0/Conv'

The op comes from sampling the working thread's stack (the innermost frame with a local ``node``
or ``step`` that has ``op_type`` and ``name``: the graph evaluator and the plan executor), so the
loops being watched pay nothing; where no such frame is found (onnxruntime running) the line
names the stage the caller set with ``stage()``.  Work that ends before the first line prints
nothing.  ``silenced()`` turns both off (``opt --quiet``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")



def _every() -> float:
    try:
        return float(os.environ.get("OPTCLI_PROGRESS_SECONDS", "5"))
    except ValueError:
        return 5.0


EVERY_SECONDS = _every()
_silenced: contextvars.ContextVar[bool] = contextvars.ContextVar("optcli_progress_silenced", default=False)
_stages: dict[int, str] = {}  # thread id -> what it is doing now, for the lines


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


@contextlib.contextmanager
def silenced(quiet: bool = True) -> Iterator[None]:
    """No bars and no lines inside (``opt --quiet``)."""
    token = _silenced.set(quiet or _silenced.get())
    try:
        yield
    finally:
        _silenced.reset(token)


def stage(text: str | None) -> None:
    """Name what this thread does now (shown when no op can be found on its stack)."""
    if text is None:
        _stages.pop(threading.get_ident(), None)
    else:
        _stages[threading.get_ident()] = text


def note(text: str) -> None:
    """One line on stderr (``optcli: text``) about a step that shows no progress of its own (a
    converter running), unless silenced (``opt --quiet``)."""
    if _silenced.get():
        return
    try:
        sys.stderr.write(f"optcli: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: progress is not worth a crash
        pass


def progress(items: Iterable[T], desc: str, total: int | None = None, enabled: bool | None = None,
             unit: str = "") -> Iterator[T]:
    if _silenced.get() or enabled is False:
        yield from items
        return
    if enabled or interactive():
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True)
        return
    if EVERY_SECONDS <= 0:
        yield from items
        return
    lines = _Lines(desc, total, unit, threading.get_ident(), EVERY_SECONDS)
    try:
        for item in items:
            yield item
            lines.done += 1
    finally:
        lines.stop()


class _Lines:
    """A daemon thread that prints the state of one loop every ``every`` seconds."""

    def __init__(self, desc: str, total: int | None, unit: str, thread_id: int, every: float):
        self.desc, self.total, self.unit, self.thread_id, self.every = desc, total, unit, thread_id, every
        self.done, self.printed, self.start = 0, False, time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="optcli-progress", daemon=True)
        self._thread.start()

    def _count(self) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        return f"{count} {self.unit}".rstrip()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            where = current_op(self.thread_id) or _stages.get(self.thread_id)
            self._write(f"{self.desc}: {self._count()}, {time.monotonic() - self.start:.0f} s"
                        + (f", at {where}" if where else ""))

    def _write(self, line: str) -> None:
        self.printed = True
        try:
            sys.stderr.write(f"optcli: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed under us: progress is not worth a crash
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.printed:
            self._write(f"{self.desc}: {self._count()}, done in {time.monotonic() - self.start:.0f} s")


def current_op(thread_id: int) -> str | None:
    """"Conv 'name'" for the node or plan step the thread is evaluating, if any."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        names = frame.f_code.co_varnames
        for local in ("step", "node"):
            if local in names:
                obj = frame.f_locals.get(local)
                op, name = getattr(obj, "op_type", None), getattr(obj, "name", None)
                if isinstance(op, str):
                    return f"{op} '{name}'" if name else op
        frame = frame.f_back
    return None
