"""optcli: an ahead-of-time ONNX model optimizer and GPU runtime.

    import optcli
    result = optcli.optimize("model.onnx", valid_targets="opencl,arm")
    predictor = optcli.load(result.data)           # or optcli.load("model.nb")
    outputs = predictor.run({"input": x})

Coming from Paddle Lite, ``from optcli import *`` stands for ``from paddlelite.lite import *``:
``MobileConfig``, ``PowerMode``, ``create_paddle_predictor`` (see ``optcli.runtime.paddle_api``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from optcli._version import __version__
from optcli.compile_options import CompileOptions, quant_type_of
from optcli.errors import OptError

if TYPE_CHECKING:
    from pathlib import Path

    import onnx

    from optcli.compiler import CompileResult

# The defaults of optimize's keyword arguments, read from the dataclass: one source of truth
# (CompileOptions is light; the compiler, which imports onnx, is imported when optimize runs).
_DEFAULTS = CompileOptions()


def optimize(
    model_file: str | Path | None = _DEFAULTS.model_file,
    *,
    model_dir: str | Path | None = _DEFAULTS.model_dir,
    param_file: str | Path | None = _DEFAULTS.param_file,
    model: onnx.ModelProto | None = _DEFAULTS.model,
    valid_targets: str | list[str] | None = _DEFAULTS.valid_targets,
    input_shapes: str | dict[str, list[int]] | None = _DEFAULTS.input_shapes,
    disabled_passes: tuple[str, ...] | set[str] = _DEFAULTS.disabled_passes,
    placement_overrides: dict[str, str] | None = _DEFAULTS.placement_overrides,
    precision: str = _DEFAULTS.precision,
    tune: str | None = _DEFAULTS.tune,
    quant_type: str | None = _DEFAULTS.quant_type,
    enable_fp16: bool = _DEFAULTS.enable_fp16,
    verify: bool = _DEFAULTS.verify,
    verify_tolerance: float | None = _DEFAULTS.verify_tolerance,
    calib_data: str | Path | None = _DEFAULTS.calib_data,
    calib_preprocess: str | None = _DEFAULTS.calib_preprocess,
    verify_samples: int = _DEFAULTS.verify_samples,
    calibrator: str = _DEFAULTS.calibrator,
    verify_data: str | Path | None = _DEFAULTS.verify_data,
    verify_top1: float | None = _DEFAULTS.verify_top1,
    quant_model: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> CompileResult:
    """Optimize a model (ONNX, Paddle or TFLite): the job of the ``opt`` command, in memory (nothing is written).

    Returns a ``CompileResult``: ``data`` (the ``.nb`` bytes), ``plan``, ``report`` (what
    ``opt --report`` writes) and ``warnings``.  Errors caused by the input are ``optcli.OptError``
    subclasses.  Only ``model_file`` may be given by position; every other argument is a keyword.
    The arguments are the fields of ``optcli.compiler.CompileOptions``, with its defaults (a caller
    holding one calls ``optcli.compiler.compile_model(options)``), plus ``quant_model`` and
    ``progress``.

    The model (give one):
        model_file: the model file (``opt --model_file``): ONNX, a Paddle program
            (``.pdmodel`` or Paddle 3's ``inference.json``; needs ``optcli[paddle]``) or a
            TFLite flatbuffer (needs ``optcli[tflite]``); the kind is read from the content.
        model_dir: a folder holding the model: model.onnx or a single .onnx file, plus its external
            data files, or a Paddle inference model directory, or one .tflite (``--model_dir``).
        param_file: a Paddle program's parameters file (``--param_file``), when it is not the
            program's name with ``.pdiparams``.
        model: an ``onnx.ModelProto`` in memory.

    Where it runs:
        valid_targets: targets, a list or one string with commas or spaces: opencl, metal, arm
            (host, x86 and cpu also mean the host CPU).  Each op goes to the first GPU target, in
            the order listed, that can run it; the host CPU is always the last resort, listed or
            not, so every op can run (``--valid_targets``).
        placement_overrides: ``{node name or op type: target}``, overriding automatic placement
            (what ``--placement_config`` reads from its file).
        input_shapes: pins dynamic input dims: ``"x:1,3,224,224;y:1,10"`` or
            ``{"x": [1, 3, 224, 224]}``; dims not pinned stay dynamic and the runtime accepts any
            size that fits (``--input_shapes``).
        disabled_passes: names of passes to skip (``--disable_pass``; ``opt --print_passes``
            lists them; placement, kernel selection and memory planning cannot be skipped).
        tune: "fast", "normal" or "exhaustive": time GPU kernel variants and work-group sizes on
            this machine's OpenCL device and keep the fastest (``--tune``; needs GPU steps and a
            usable device).

    Precision and size:
        precision: storage precision of GPU tensors (``--precision``): "fp32"; "fp16"
            stores half and accumulates in fp32 (the host CPU always computes fp32); "auto": int8
            per op where the measured error stays inside the budget (``verify_tolerance``,
            default 5e-2), float elsewhere (needs ``calib_data``).
        quant_type: "QUANT_INT8" / "QUANT_INT16": the weights only, symmetric, per output channel
            (the .nb shrinks about 4x / 2x; weights are restored to float once at load).  "INT8":
            full post-training quantization, int8 weights and activations, calibrated on
            ``calib_data`` (``--quant_type``).
        quant_model: Paddle Lite's ``--quant_model``: store the weights compressed, as
            ``quant_type`` says, "QUANT_INT8" when it says nothing.
        enable_fp16: weights stored as fp16 (about 2x smaller) and GPU tensors as half (the same
            as ``precision="fp16"`` for the GPU) (``--enable_fp16``).
        calib_data: a folder of samples for calibration (and for ``verify`` when there is no
            ``verify_data``): one per file, .npy, .npz keyed by input name, or images (with
            ``calib_preprocess``; needs ``optcli[images]``) (``--calib_data``).
        calib_preprocess: how an image becomes a tensor, the spec of ``optcli run
            --preprocess`` (e.g. "imagenet,size=256,crop=224"); applies to ``verify_data`` too.
        calibrator: "percentile", "minmax" or "entropy": how INT8 activation ranges
            come from the calibration samples (``--calibrator``).

    Verification (``report["verify"]``):
        verify: run the original model (onnxruntime, else the fp32 arm plan) and the optimized
            plan on the same inputs (``verify_data``, else ``calib_data``, else ``verify_samples``
            seeded random inputs, with a warning that the verdict is weak) and report, per
            output, SNR (dB), cosine similarity, max error relative to the output's scale and,
            for classifier-like [N, K] outputs, top-1/top-5 agreement.  The rule per plan
            precision: SNR >= 80 dB (fp32), 60 dB (QUANT_INT16), 40 dB (fp16), 20 dB (int8) and,
            for int8 on real samples, top-1 >= 95%.  Unlike ``opt``, which exits 3 and writes no
            .nb, ``optimize`` raises nothing on a failed verdict: check
            ``result.report["verify"]["passed"]``.
        verify_tolerance: the noise budget: the largest RMS error per RMS of each output
            (SNR >= -20*log10(R) dB; default by plan precision: fp32 1e-4, QUANT_INT16 1e-3,
            fp16 1e-2, int8 0.1); with ``precision="auto"`` also the per-op budget.
        verify_top1: the top-1 agreement (0 to 1) required of classifier-like [N, K] outputs
            (default 0.95 for int8 plans on real samples, else not judged; 0 turns it off).
        verify_data: a folder of samples ``verify`` runs on (held out from calibration), in
            ``calib_data``'s formats (``--verify_data``).
        verify_samples: how many seeded random inputs ``verify`` runs on when given no samples
            (the CLI has no flag for it).

    progress: called with each pass's record (``name``, ``changed``, ``nodes_before``,
        ``nodes_after``) as soon as that pass finishes.
    """
    # One source of truth for the options: every keyword but quant_model and progress is a field
    # of CompileOptions, named here for help() and IDEs, and its default is read from
    # CompileOptions() above (never written twice).  ``given`` is taken before any other local
    # exists, so it holds exactly the arguments; each field is passed through by name, and
    # tests/test_python_api.py fails when a field is missing from this signature.
    given = dict(locals())
    _refuse_positional_mistakes(model_file)
    from optcli.compiler import compile_model

    values = {f.name: given[f.name] for f in fields(CompileOptions)}
    values["quant_type"] = quant_type_of(quant_model, quant_type)
    return compile_model(CompileOptions(**values), progress)


def _refuse_positional_mistakes(model_file: object) -> None:
    """The first positional argument is ``model_file``: say what to do with anything else there."""
    if isinstance(model_file, CompileOptions):
        raise TypeError("optcli.optimize takes CompileOptions' fields as keyword arguments; to optimize with "
                        "a CompileOptions, call optcli.compiler.compile_model(options)")
    if type(model_file).__name__ == "ModelProto":
        raise TypeError("optcli.optimize's first positional argument is model_file (a path); pass an "
                        "onnx.ModelProto as model=")


def load(*args, **kwargs):
    """Load a `.nb` file (path or bytes) into a Predictor; see ``optcli.runtime.load.load``."""
    from optcli.runtime.load import load as _load

    return _load(*args, **kwargs)


def list_devices(check: bool = True):
    """OpenCL devices with their capabilities and whether each is usable (see ``optcli devices``)."""
    from optcli.runtime.opencl.devices import list_devices as _list

    return _list(check)


# The Paddle Lite facade (optcli.runtime.paddle_api), imported lazily so `import optcli` stays light.
_PADDLE_NAMES = ("MobileConfig", "PowerMode", "create_paddle_predictor", "PaddlePredictor", "LightPredictor",
                 "Tensor")


def __getattr__(name):
    if name in _PADDLE_NAMES:
        from optcli.runtime import paddle_api

        return getattr(paddle_api, name)
    raise AttributeError(f"module 'optcli' has no attribute '{name}'")


# `from optcli import *` gives what `from paddlelite.lite import *` gives a MobileConfig script.
__all__ = ["OptError", "optimize", "load", "list_devices", "MobileConfig", "PowerMode", "create_paddle_predictor",
           "__version__"]
