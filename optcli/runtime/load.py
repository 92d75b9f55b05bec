"""``optcli.load``: read a `.nb` (path or bytes), validate it, and build a Predictor."""

from __future__ import annotations

import os

from optcli.nb.reader import load_bytes, load_file
from optcli.runtime.predictor import Predictor


def load(source: str | os.PathLike | bytes, targets: str | list[str] | None = None,
         precision: str | None = None, threads: int | None = None) -> Predictor:
    """Load a `.nb` file and return a Predictor.

    ``targets`` restricts the plan's targets to those listed (steps of others run on the host
    CPU); ``precision`` overrides the plan's precision; ``threads`` bounds the host CPU threads
    (BLAS included) used while running.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        plan, header = load_bytes(bytes(source))
        name = "<bytes>"
    else:
        plan, header = load_file(source)
        name = str(source)
    if isinstance(targets, str):
        targets = [t for t in targets.replace(" ", ",").split(",") if t]
    return Predictor(plan, header, name, targets=targets, precision=precision, threads=threads)
