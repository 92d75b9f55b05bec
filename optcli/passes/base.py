"""What every pass shares: the context it runs in and the shape of its result.

A pass is a module with ``NAME`` (what ``--disable_pass`` and the report call it),
``DESCRIPTION`` (one line for ``--print_passes``) and ``run(graph, ctx) -> dict[str, int]``,
which rewrites the graph in place and returns counts of what it changed (``{"fused": 3}``;
an empty dict or zeros when nothing changed).  The order lives in ``passes/pipeline.py``.

A pass never branches on a target's name: it asks ``ctx.targets`` for capabilities.  What the
caller asks of the passes is a typed field of ``PassContext``; what a pass hands back to the
compiler (or to a later pass) is a typed field of ``PassResults`` (``ctx.results``), never an
untyped dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optcli.plan_memory_core import MemoryPlan


@dataclass
class Int8Settings:
    """Full int8 post-training quantization (``--quant_type=INT8`` or ``--precision=auto``)."""

    calibrator: str  # optcli.passes.quantize_int8.CALIBRATORS
    samples: list[dict[str, Any]]  # calibration feeds, {input name: array}
    precision_auto: bool = False  # keep in float the ops whose int8 error breaks the budget
    auto_budget: float | None = None  # that budget (relative output error); None: the int8 tolerance


@dataclass
class PassResults:
    """What passes hand back: to the compiler (lowering, the report) and to later passes."""

    memory: MemoryPlan | None = None  # plan_memory
    weight_formats: dict[str, tuple[str, int]] | None = None  # compress_weights: name -> (scheme, axis)
    weight_hints: dict[str, tuple] = field(default_factory=dict)  # fold_qdq, quantize_int8 -> compress_weights
    placement: dict[str, Any] = field(default_factory=dict)  # place_nodes, keep_small_islands_on_host
    fold_failures: list[dict[str, Any]] = field(default_factory=list)  # fold_constants
    int8_kept_float: list[dict[str, Any]] = field(default_factory=list)  # quantize_int8 (precision auto)


@dataclass
class PassContext:
    targets: list[Any] = field(default_factory=list)  # optcli.targets.base.Target, priority order
    placement_overrides: dict[str, str] = field(default_factory=dict)  # node name or op type -> target
    weight_scheme: str | None = None  # compress_weights: "int8", "int16", "fp16" or None
    int8: Int8Settings | None = None  # quantize_int8 runs only with these
    results: PassResults = field(default_factory=PassResults)
    warnings: list[str] = field(default_factory=list)
    # What compile_bodies runs on each If/Loop/Scan body: pipeline.optimize fills it with
    # pipeline.BODY_PASSES (a field, not an import: the pipeline imports compile_bodies)
    body_passes: list[Any] | None = None
    # --disable_pass: a pass that runs others itself (quantize_int8's lowering) skips these too
    disabled_passes: frozenset[str] = frozenset()

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
