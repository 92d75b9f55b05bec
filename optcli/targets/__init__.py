"""Targets by name: `arm` (host CPU; aliases `host`, `x86`, `cpu`), `opencl`, `metal`."""

from __future__ import annotations

import re

from optcli.errors import TargetError
from optcli.targets.arm import HOST
from optcli.targets.base import Target
from optcli.targets.gpu import METAL, OPENCL

TARGETS: dict[str, Target] = {t.name: t for t in (OPENCL, METAL, HOST)}


def get_target(name: str) -> Target:
    key = name.strip().lower()
    for t in TARGETS.values():
        if key == t.name or key in t.aliases:
            return t
    valid = ", ".join(sorted({*TARGETS, *(a for t in TARGETS.values() for a in t.aliases)}))
    raise TargetError(f"unknown target '{name}' in --valid_targets; valid targets are: {valid}")


def parse_targets(spec: str | list[str] | None) -> list[Target]:
    """Parse ``"opencl,arm"`` (commas or spaces; duplicates dropped) into the order placement tries.

    GPU targets keep the order given: it is the preference among them (``metal,opencl`` tries
    metal first).  The host CPU is always the last resort, wherever it is listed and when it is
    left out: it runs every op, so listed first it would take everything and leave the GPU
    nothing (``arm,opencl`` means ``opencl,arm``).
    """
    if spec is None:
        names = ["arm"]
    elif isinstance(spec, str):
        names = [n for n in re.split(r"[,\s]+", spec) if n]
    else:
        names = [n for part in spec for n in re.split(r"[,\s]+", part) if n]
    if not names:
        raise TargetError("--valid_targets is empty; give one or more of: opencl, metal, arm")
    result: list[Target] = []
    for n in names:
        t = get_target(n)
        if t not in result:
            result.append(t)
    if HOST not in result:
        result.append(HOST)
    # A stable sort: GPU targets first in the order given, then the host.
    return sorted(result, key=lambda t: t.device == "cpu")
