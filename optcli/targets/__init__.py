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
    """Parse ``"opencl,arm"`` (commas or spaces; order is priority; duplicates dropped).

    The host CPU is always appended last when absent, so every model can run: it is where
    GPU targets fall back.
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
    return result
