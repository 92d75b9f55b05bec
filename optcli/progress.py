"""Progress bars for long work (tuning, calibration, benchmarks): shown on a terminal, quiet in
CI (``CI`` set) or when stderr is not a TTY."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress(items: Iterable[T], desc: str, total: int | None = None, enabled: bool | None = None) -> Iterator[T]:
    if not (interactive() if enabled is None else enabled):
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True)
