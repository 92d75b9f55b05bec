"""Which kind of model the user gave, found from the files' content, and its conversion to ONNX.

optcli optimizes ONNX.  Users of Paddle Lite's ``opt`` and of TFLite arrive with their own files:
a Paddle inference model (``inference.pdmodel`` or Paddle 3's ``inference.json`` beside
``inference.pdiparams``, or an old ``__model__`` directory) or a TFLite flatbuffer.  Those go
through the official converters (paddle2onnx; tf2onnx), installed with the ``paddle`` and
``tflite`` extras, and the ONNX they write is then read like any other model.  The kind is decided
from the content where the format has a signature (a TFLite flatbuffer says ``TFL3`` at byte 4, a
PIR program is JSON with ``"base_code"``), from Paddle's fixed names otherwise, never from a
suffix alone: a ``.onnx`` that is really a ``.tflite`` is read as the ``.tflite`` it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optcli.errors import ModelError, UsageError
from optcli.progress import note

if TYPE_CHECKING:
    import onnx

CONVERT_OPSET = 17  # what paddle2onnx and tf2onnx both write well; the passes take any opset from 7 up
_HEAD_BYTES = 4096  # enough of a file to see its signature

FORMAT_NAMES = {"onnx": "ONNX", "paddle": "Paddle inference", "tflite": "TFLite"}


@dataclass(frozen=True)
class ModelSource:
    """The model to read: ``format`` is ``onnx``, ``paddle`` or ``tflite``; ``path`` its (program)
    file; ``params`` Paddle's combined parameters file (None: one file per parameter beside it)."""

    format: str
    path: Path
    params: Path | None = None


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the model file ({exc.strerror})") from None


def is_tflite(head: bytes) -> bool:
    """A TFLite flatbuffer: the file identifier ``TFL3`` right after the root table's offset."""
    return len(head) >= 8 and head[4:8] == b"TFL3"


def is_pir_program(head: bytes) -> bool:
    """Paddle 3's PIR program (``inference.json``): JSON whose first key block names ``base_code``."""
    text = head.lstrip()[:_HEAD_BYTES]
    return text.startswith(b"{") and b'"base_code"' in text


def _paddle_params(program: Path, param_file: str | None) -> Path | None:
    """The combined parameters file of a Paddle program: ``--param_file`` when given, else the
    program's stem with ``.pdiparams``, else the old names ``__params__`` / ``params``; None when
    none exists (the oldest form: one file per parameter in the program's directory)."""
    if param_file:
        path = Path(param_file)
        if not path.is_file():
            raise ModelError(f"{path}: no such parameters file; check --param_file")
        return path
    for candidate in (program.with_suffix(".pdiparams"), program.parent / "__params__", program.parent / "params"):
        if candidate.is_file() and candidate != program:
            return candidate
    return None


def _from_file(path: Path, param_file: str | None) -> ModelSource:
    head = _head(path)
    if is_tflite(head):
        kind = "tflite"
    elif is_pir_program(head) or path.suffix == ".pdmodel" or path.name == "__model__" or param_file:
        kind = "paddle"
    else:
        kind = "onnx"
    if kind != "paddle":
        if param_file:
            raise UsageError(f"--param_file is for Paddle models; {path} is a {FORMAT_NAMES[kind]} model: drop "
                             "--param_file")
        return ModelSource(kind, path)
    return ModelSource("paddle", path, _paddle_params(path, param_file))


def _paddle_program_in(folder: Path) -> Path | None:
    """The program file of a Paddle inference directory, by Paddle's own names first."""
    for name in ("inference.json", "inference.pdmodel", "model.pdmodel", "__model__", "model"):
        if (folder / name).is_file() and (name != "model" or (folder / "params").is_file()):
            return folder / name
    found = sorted(p for p in folder.glob("*.pdmodel") if p.is_file())
    found += sorted(p for p in folder.glob("*.json") if p.is_file() and is_pir_program(_head(p)))
    if len(found) > 1:
        raise ModelError(f"{folder}: holds {len(found)} Paddle programs ({', '.join(p.name for p in found)}); "
                         "name one with --model_file=FILE --param_file=FILE")
    return found[0] if found else None


def identify(model_file: str | Path | None, model_dir: str | Path | None,
             param_file: str | Path | None = None) -> ModelSource:
    """Resolve ``--model_file`` / ``--model_dir`` (/ ``--param_file``) to the model to read."""
    from optcli.frontend.onnx_reader import find_model_file, given_model_path

    param = str(param_file) if param_file else None
    is_file, folder = given_model_path(model_file, model_dir)
    if is_file:
        return _from_file(folder, param)
    if any(p.is_file() for p in folder.glob("*.onnx")):
        if param:
            raise UsageError(f"--param_file is for Paddle models; {folder} holds an ONNX model: drop --param_file")
        return ModelSource("onnx", find_model_file(None, str(folder)))
    program = _paddle_program_in(folder)
    if program is not None:
        return ModelSource("paddle", program, _paddle_params(program, param))
    tflite = sorted(p for p in folder.glob("*.tflite") if p.is_file())
    if len(tflite) == 1 and not param:
        return ModelSource("tflite", tflite[0])
    what = f"{len(tflite)} .tflite files" if tflite else "no model"
    raise ModelError(f"{folder}: holds {what}: optcli reads one .onnx file (with its external data), a Paddle "
                     "inference model (inference.pdmodel or inference.json with inference.pdiparams, or __model__) "
                     "or one .tflite file; or name the file with --model_file=FILE")


def convert(source: ModelSource, opset: int = CONVERT_OPSET) -> tuple[onnx.ModelProto, dict]:
    """The ONNX model a Paddle or TFLite model converts to, and what converted it (for the report):
    ``{"format", "file", "converter", "seconds"}``.  A converter that is not installed is a
    ``ModelError`` naming the extra to install."""
    if source.format == "paddle":
        from optcli.frontend.paddle_convert import paddle_to_onnx

        def run():
            return paddle_to_onnx(source.path, source.params, opset)
    elif source.format == "tflite":
        from optcli.frontend.tflite_convert import tflite_to_onnx

        def run():
            return tflite_to_onnx(source.path, opset)
    else:
        raise ModelError(f"{source.path}: no converter for {source.format!r} models")
    note(f"converting the {FORMAT_NAMES[source.format]} model {source.path.name} to ONNX")
    start = time.monotonic()
    model, converter = run()
    seconds = round(time.monotonic() - start, 2)
    note(f"converted {source.path.name} with {converter} in {seconds:.1f} s")
    return model, {"format": source.format, "file": str(source.path), "converter": converter, "seconds": seconds}
