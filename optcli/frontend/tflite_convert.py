"""Read a TFLite flatbuffer by converting it to ONNX with tf2onnx, the maintained converter.

The conversion runs in a child Python process, not in ours.  Why:

- TFLite's flatbuffer reader trusts its input: ``tf.lite.Interpreter(model_path=...)``, which
  tf2onnx calls on every file, segfaults on a truncated ``.tflite`` (seen with TF 2.21).  The child
  first checks the bytes with TFLite's flatbuffers verifier (``Interpreter(model_content=...)``
  verifies; ``model_path`` does not), so a damaged file gets a clear message; and whatever native
  code still crashes on a crafted file (the interpreter's tensor allocation, onnx's C++) takes down
  the child only, which the parent reports as a ``ModelError``.
- Output stays off our stdout/stderr at the fd level (TF's C++ logging, the XNNPACK notice,
  tf2onnx's logger) without redirecting our own fds: the child's are simply not ours.
- ``optcli`` never imports TensorFlow: importing it costs seconds and hundreds of MB, spawns thread
  pools and initialises GPUs.  The child pays the import once per model, as an in-process import
  would on the first model.

Layout and numerics, as tf2onnx writes them by default (kept on purpose):

- Inputs and outputs stay NHWC, as the TFLite app feeds them; tf2onnx brackets NCHW ops with
  Transposes, which the optimizer's passes fold.
- float16-quantized models (fp16 weights behind DEQUANTIZE ops) come out as float32 constants.
- int8 models come out as QDQ (QuantizeLinear/DequantizeLinear around float ops), int8 inputs and
  outputs kept where the ``.tflite`` has them; optcli's quantization passes read QDQ.  tf2onnx's
  ``dequantize`` option would instead drop the quantization, so it is left off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import onnx

from optcli.errors import ModelError

INSTALL = "pip install 'optcli[tflite]'"
# int8 TFLite models quantize conv weights per channel: per-axis QuantizeLinear needs opset 13.
# tf2onnx 1.17 knows opsets up to 18 (its OPSET_TO_IR_VERSION); the child clamps to that.
LOWEST_OPSET = 13
MAX_REASON = 200
# A bound on a conversion that never ends (none seen: tf2onnx reads the flatbuffer in bounded Python loops).
TIMEOUT_S = 900
REEXPORT = "re-export it with tf.lite.TFLiteConverter, or convert the TensorFlow model to ONNX yourself and pass that"
# The child runs with its cwd in our temporary folder (nothing importable there), finding optcli on the
# path it has, or else beside this file: appended, so it never shadows a module of the environment.
_BOOT = ("import sys; sys.path.append(sys.argv.pop(1)); "
         "from optcli.frontend.tflite_convert import _child_main; _child_main()")


def tflite_to_onnx(path: Path, opset: int) -> tuple[onnx.ModelProto, str]:
    """Convert the TFLite file at ``path`` to an ONNX model (``opset`` asked for, clamped to 13..18).

    Returns the model and a one-line converter description for the report, e.g.
    ``"tf2onnx 1.17.0 (tensorflow 2.21.0)"``.  Every failure (the extra not installed, a damaged file,
    an op tf2onnx cannot convert, the converter crashing) is a one-line ``ModelError`` naming the file."""
    path = Path(path)
    missing = [name for name in ("tensorflow", "tf2onnx") if find_spec(name) is None]
    if missing:
        raise ModelError(f"{path}: reading a TFLite model needs {' and '.join(missing)}, not installed; "
                         f"install them with: {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="optcli-tflite-") as tmp:
        folder = Path(tmp)
        out, status, log = folder / "model.onnx", folder / "status.json", folder / "stderr.txt"
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1", PYTHONWARNINGS="ignore")
        command = [sys.executable, "-c", _BOOT, root, str(path.resolve()), str(out), str(opset), str(status)]
        with open(log, "wb") as err:
            try:
                done = subprocess.run(command, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=err, timeout=TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise ModelError(f"{path}: tf2onnx did not finish in {TIMEOUT_S} s; {REEXPORT}") from None
        result = _read_status(status)
        if result is None:
            raise ModelError(f"{path}: the TFLite converter {_how_it_died(done.returncode, log)}; {REEXPORT}")
        if "error" in result:
            raise ModelError(f"{path}: {_bounded(result['error'])}; {result['advice']}")
        try:
            model = onnx.load(str(out))
        except Exception as exc:  # the child wrote it; failing here is a full disk or the like
            raise ModelError(f"{path}: the converted ONNX model cannot be read back "
                             f"({_bounded(f'{type(exc).__name__}: {exc}')}); check the free space in "
                             f"{tempfile.gettempdir()}") from None
    return model, result["converter"]


def _read_status(status: Path) -> dict | None:
    """The child's JSON status, or None where it died before writing all of it."""
    try:
        return json.loads(status.read_text())
    except (OSError, ValueError):
        return None


def _how_it_died(returncode: int, log: Path) -> str:
    """'crashed (SIGSEGV)...' for a signal, else the exit status and the child's last stderr line."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"crashed ({name}) reading it: the file is probably truncated or corrupt"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    last = f": {_bounded(lines[-1])}" if lines else ""
    return f"stopped with exit status {returncode} and no result{last}"


def _bounded(text: str) -> str:
    """One line of at most MAX_REASON characters: a message quotes it, never a traceback."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def _child_main() -> None:
    """The child's entry: ``SRC DST OPSET STATUS`` on its command line; writes DST and a JSON status.

    Any exception becomes an ``error`` status (the parent's message); only a native crash leaves no
    status, and the parent reports the signal."""
    src, dst, opset, status = sys.argv[1:5]
    try:
        result = _convert(Path(src), Path(dst), int(opset))
    except BaseException as exc:  # the parent needs a reason, whatever went wrong
        result = {"error": f"tf2onnx could not convert this TFLite model ({type(exc).__name__}: {exc})",
                  "advice": f"check that it loads in tf.lite.Interpreter, or {REEXPORT}"}
    Path(status).write_text(json.dumps(result))


def _convert(src: Path, dst: Path, opset: int) -> dict:
    """In the child: verify the flatbuffer, convert, refuse ops tf2onnx left unconverted, write ``dst``."""
    import logging
    import warnings

    warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice, numpy's, keras'
    import absl.logging
    import tensorflow as tf
    import tf2onnx
    import tf2onnx.convert

    absl.logging.set_verbosity(absl.logging.ERROR)
    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)  # unconverted ops are reported below, once
    converter = f"tf2onnx {tf2onnx.__version__} (tensorflow {tf.__version__})"
    try:
        tf.lite.Interpreter(model_content=src.read_bytes())  # runs the flatbuffers verifier first
    except ValueError as exc:
        if "not a valid Flatbuffer" in str(exc):
            return {"error": "not a valid TFLite flatbuffer (truncated or corrupt)",
                    "advice": f"download it again or {REEXPORT}"}
        # Verified, but the interpreter cannot be built (an op this TF lacks): tf2onnx may still convert it.
    opset = max(LOWEST_OPSET, min(opset, max(tf2onnx.constants.OPSET_TO_IR_VERSION)))
    model, _ = tf2onnx.convert.from_tflite(str(src), opset=opset)
    unconverted = _unconverted_ops(model)
    if unconverted:
        ops = ", ".join(f"{op.removeprefix('TFL_')} ({n} node{'s' if n > 1 else ''})" for op, n in unconverted.items())
        return {"error": f"{converter} cannot convert the TFLite op(s) {ops}",
                "advice": f"re-export the model without them, or convert the TensorFlow model to ONNX yourself "
                          f"(python -m tf2onnx.convert --saved-model DIR --opset {opset}) and pass the .onnx"}
    dst.write_bytes(model.SerializeToString())
    return {"converter": converter}


def _unconverted_ops(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> count of nodes tf2onnx left as they were (``TFL_GELU``...): with ``continue_on_error``,
    which ``from_tflite`` always sets, it logs them and writes them into the ONNX graph unchanged."""
    counts: dict[str, int] = {}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
    return counts
