"""The options of the optimize job: one record shared by the `opt` command, ``compile_model`` and
``optcli.optimize``.

It lives on the ground floor, apart from the compiler, so that ``import optcli`` can read its
defaults (``optcli.optimize``'s signature takes them from here) without importing onnx and the
passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


@dataclass
class CompileOptions:
    """Everything a user can ask of the optimize job: the `opt` command's flags, ``compile_model``'s
    and ``optcli.optimize``'s keyword arguments, one record shared by all three.

    The model: ``model_file``, ``model_dir`` (a folder holding one .onnx, maybe with external
    data, a Paddle inference model or one .tflite) or an in-memory ``model``; ``param_file``:
    a Paddle program's parameters file, when its name does not follow the program's.
    ``quant_type``: QUANT_INT8 / QUANT_INT16 (weight-only, per
    output channel) or INT8 (full int8, calibrated on ``calib_data``); ``enable_fp16``: weights
    stored as fp16 and GPU tensors in half (``precision="fp16"``).  ``verify``: judge the result
    against the original on ``verify_data``, else ``calib_data``, else ``verify_samples`` seeded
    random inputs (``optcli/verify.py`` for the rule).  ``optcli.optimize``'s docstring describes
    every field."""

    model_file: str | Path | None = None
    model_dir: str | Path | None = None
    param_file: str | Path | None = None
    model: onnx.ModelProto | None = None
    valid_targets: str | list[str] | None = "arm"
    input_shapes: str | dict[str, list[int]] | None = None
    disabled_passes: tuple[str, ...] | set[str] = ()
    placement_overrides: dict[str, str] | None = None
    precision: str = "fp32"
    tune: str | None = None
    quant_type: str | None = None
    enable_fp16: bool = False
    verify: bool = False
    verify_tolerance: float | None = None
    calib_data: str | Path | None = None
    calib_preprocess: str | None = None
    verify_samples: int = 8
    calibrator: str = "percentile"
    verify_data: str | Path | None = None
    verify_top1: float | None = None


def quant_type_of(quant_model: bool, quant_type: str | None) -> str | None:
    """Paddle Lite's ``--quant_model``: store the weights compressed, as ``quant_type`` says
    (QUANT_INT8 when it says nothing).  Without it, ``quant_type`` stands as given."""
    return (quant_type or "QUANT_INT8") if quant_model else quant_type
