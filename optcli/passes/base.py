"""What every pass shares: the context it runs in and the shape of its result.

A pass is a module with ``NAME`` (what ``--disable_pass`` and the report call it),
``DESCRIPTION`` (one line for ``--print_passes``) and ``run(graph, ctx) -> dict[str, int]``,
which rewrites the graph in place and returns counts of what it changed (``{"fused": 3}``;
an empty dict or zeros when nothing changed).  The order lives in ``passes/pipeline.py``.

A pass never branches on a target's name: it asks ``ctx.targets`` for capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassContext:
    targets: list[Any] = field(default_factory=list)  # optcli.targets.base.Target, priority order
    options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
