"""``optcli.load``: read a `.nb` (path or bytes), validate it, and build a Predictor."""

from __future__ import annotations

import os

from optcli.nb.reader import load_bytes, load_file
from optcli.runtime.predictor import Predictor


def load(source: str | os.PathLike | bytes, targets: str | list[str] | None = None,
         precision: str | None = None, threads: int | None = None, require_gpu: bool = False,
         device: str | None = None, tune: str | None = None) -> Predictor:
    """Load a `.nb` file and return a Predictor.

    ``targets`` restricts the plan's targets to those listed (steps of others run on the host
    CPU); ``precision`` overrides the plan's precision; ``threads`` bounds the host CPU threads
    (BLAS included) used while running.  GPU steps run on an OpenCL device (``device``: a part
    of its name, else the first GPU, else the first device) that passes a smoke test (it builds
    and runs a small kernel; devices that fail it are skipped); where none is usable, ``load``
    warns once (one line on the "optcli" logger, naming each device tried and why it failed) and
    runs them on the CPU, or raises ``TargetError`` with ``require_gpu=True``.
    ``tune`` ("fast", "normal", "exhaustive") times kernel variants and work-group sizes on this
    device and keeps the fastest (remembered in the per-user tuning cache for later loads).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        plan, header = load_bytes(bytes(source))
        name = "<bytes>"
    else:
        plan, header = load_file(source)
        name = str(source)
    if isinstance(targets, str):
        targets = [t for t in targets.replace(" ", ",").split(",") if t]
    return Predictor(plan, header, name, targets=targets, precision=precision, threads=threads,
                     require_gpu=require_gpu, device=device, tune=tune)
