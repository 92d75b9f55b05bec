"""Convert a Paddle inference model to ONNX with paddle2onnx (the ``optcli[paddle]`` extra).

The conversion runs in a child Python process, not in ours, because paddle2onnx's C++ code aborts
the whole process on some bad inputs (a parameters file that does not belong to the program, an opset
it does not know): only a child can turn that into a ``ModelError``.  The child also keeps paddle's
C++ logging (written straight to file descriptors 1 and 2) off ``opt``'s stdout, keeps paddle's
seconds-long import and its global state (scopes, flags, signal handlers) out of optcli, and lets one
temporary folder hold everything paddle and paddle2onnx write.

What the child accepts (``program``, ``params``):

- a PIR program (``inference.json``, Paddle 3's format) with its ``.pdiparams``: exported as it is;
- a legacy ProgramDesc (``inference.pdmodel``, ``model.pdmodel``, ``__model__``) with its combined
  parameters (``.pdiparams``, ``__params__``, ``params``), or with ``params=None`` for one file per
  variable beside the program: loaded with ``paddle.static`` and saved again as ``model.pdmodel`` and
  ``model.pdiparams``, the only names paddle2onnx's legacy path reads.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from optcli.errors import ModelError

INSTALL_HINT = "pip install 'optcli[paddle]'"
# paddle2onnx 2.0 exports opsets 7 to 21 and aborts the process on any other.
MIN_OPSET, MAX_OPSET = 7, 21
# A bound on a conversion that never ends; large OCR models convert in seconds.
TIMEOUT_S = 900
MAX_REASON = 300
_CHILD = "optcli.frontend.paddle_convert"


def paddle_to_onnx(program: Path, params: Path | None, opset: int) -> tuple[onnx.ModelProto, str]:
    """Convert ``program`` (+ ``params``) to ONNX at ``opset`` (clamped to what paddle2onnx exports).

    Returns the checked model and a one-line converter description for the report, such as
    ``paddle2onnx 2.0.1 (paddlepaddle 3.3.1)``.  Every failure is a one-line ``ModelError``."""
    missing = [name for name in ("paddle", "paddle2onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelError(f"{program}: reading a Paddle model needs {' and '.join(missing)}: {INSTALL_HINT}")
    program = Path(program)
    if not program.is_file():
        raise ModelError(f"{program}: no such Paddle program file; check --model_file / --model_dir")
    if params is not None and not Path(params).is_file():
        raise ModelError(f"{params}: no such Paddle parameters file; check --param_file")
    opset = min(max(opset, MIN_OPSET), MAX_OPSET)
    with tempfile.TemporaryDirectory(prefix="optcli-paddle-") as work:
        # absolute(), not resolve(): per-variable parameters lie beside the program as the user names it.
        command = [sys.executable, "-m", _CHILD, str(program.absolute()),
                   str(Path(params).absolute()) if params is not None else "", str(opset), work]
        # TMPDIR: paddle2onnx writes its intermediate files under tempfile's folder; ours is removed.
        env = {**os.environ, "TMPDIR": work}
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env,
                                  timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ModelError(f"{program}: paddle2onnx did not finish in {TIMEOUT_S} s; "
                             "convert the model to ONNX yourself and pass the .onnx file") from None
        converted = Path(work) / "model.onnx"
        if done.returncode != 0 or not converted.is_file() or converted.stat().st_size == 0:
            reason = failure_reason(done.stdout + "\n" + done.stderr, done.returncode)
            raise ModelError(f"{program}: paddle2onnx could not convert it: {reason}; {_advice(reason)}")
        model = onnx.load_from_string(converted.read_bytes())
        converter = (Path(work) / "converter.txt").read_text().strip()
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        reason = _checker_reason(str(err))
        raise ModelError(f"{program}: paddle2onnx wrote an invalid ONNX model: {reason}; {_advice(reason)}") from None
    return model, converter


def failure_reason(output: str, returncode: int) -> str:
    """The one line of the child's output that says why it failed, bounded.

    paddle2onnx's own errors are ``[ERROR]`` lines (the first is the cause; it logs the Python
    exceptions it catches the same way); otherwise the last ``SomethingError: ...`` line of a Python
    traceback, which for paddle's C++ errors reads like ``(NotFound) Cannot open file ...``."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines() if line.strip()]
    for line in lines:
        message = re.sub(r"^.*\[ERROR\](\[Paddle2ONNX\])?\s*(Failed to convert PaddlePaddle model:)?\s*", "", line)
        if "[ERROR]" in line and re.search(r"\w", message) and message != "None":
            return _bounded(message)
    for line in reversed(lines):
        found = re.match(r"^(?:\w+\.)*\w*(?:Error|Exception): (.+)", line)
        if found:
            return _bounded(found.group(1))
    if returncode < 0:
        return f"the converter was killed by signal {-returncode}"
    return _bounded(lines[-1]) if lines else f"the converter exited with status {returncode}"


def _checker_reason(message: str) -> str:
    """The checker's words, or what they mean when a weight has no value: paddle2onnx then leaves the
    graph reading a name nothing defines (no parameters file given, or one that lacks the tensor)."""
    found = re.search(r"input '([^']+)' of node.*is not output of any previous nodes", message, re.DOTALL)
    if found:
        return f"parameter '{found.group(1)}' has no value (no parameters file, or one without it)"
    return _bounded(message)


def _bounded(text: str) -> str:
    """One line of at most MAX_REASON characters: paddle's messages can run to pages."""
    text = " ".join(text.split()).rstrip(" .")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _advice(reason: str) -> str:
    """What the user can do, guessed from the words of the reason."""
    if "unsupported" in reason.lower():
        return "the model uses an op paddle2onnx cannot export; export it to ONNX another way"
    if re.search(r"param|weight|load|open file|tensor", reason, re.IGNORECASE):
        return "give the parameters file (.pdiparams) saved with this program (--param_file)"
    return "check that the files are a Paddle inference model saved by paddle.jit.save or save_inference_model"


# ---- the child process: imports paddle, so it never runs inside optcli's own process ----


def _convert(program: Path, params: Path | None, opset: int, work: Path) -> None:
    """Export ``program`` to ``work/model.onnx`` and describe the converter in ``work/converter.txt``."""
    import paddle
    import paddle2onnx

    paddle.enable_static()
    with program.open("rb") as file:
        is_pir = file.read(64).lstrip()[:1] == b"{"
    if is_pir:
        # A PIR program: paddle2onnx tells PIR from a legacy program by the suffix.
        if program.suffix != ".json":
            program = Path(shutil.copyfile(program, work / "model.json"))
    else:
        program, params = _save_combined_legacy(paddle, program, params, work)
    # No save_file: the bytes come back as they are, so paddle2onnx runs neither onnxoptimizer nor
    # polygraphy (optional tools it would otherwise import); its own C++ optimizer still runs.
    data = paddle2onnx.export(str(program), str(params or ""), opset_version=opset, auto_upgrade_opset=True,
                              enable_onnx_checker=True, enable_optimize=True, deploy_backend="onnxruntime")
    if not data:
        raise RuntimeError("paddle2onnx returned no model")
    (work / "model.onnx").write_bytes(data)
    (work / "converter.txt").write_text(f"paddle2onnx {paddle2onnx.__version__} (paddlepaddle {paddle.__version__})")


def _save_combined_legacy(paddle, program: Path, params: Path | None, work: Path) -> tuple[Path, Path]:
    """Load a legacy program (any file names, combined or per-variable parameters) and save it as
    ``work/model.pdmodel`` + ``work/model.pdiparams``: paddle2onnx reads a legacy program only as
    ``PREFIX.pdmodel`` beside ``PREFIX.pdiparams``."""
    executor = paddle.static.Executor(paddle.CPUPlace())
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(paddle.static.Scope()):
        # Absolute names: load_inference_model joins them to the folder, which then drops out.
        loaded, feed_names, fetch_vars = paddle.static.load_inference_model(
            str(program.parent), executor, model_filename=str(program),
            params_filename=str(params) if params is not None else None)
        feed_vars = [loaded.global_block().var(name) for name in feed_names]
        paddle.static.save_inference_model(str(work / "model"), feed_vars, fetch_vars, executor, program=loaded)
    return work / "model.pdmodel", work / "model.pdiparams"


if __name__ == "__main__":
    _program, _params, _opset, _work = sys.argv[1:5]
    _convert(Path(_program), Path(_params) if _params else None, int(_opset), Path(_work))
