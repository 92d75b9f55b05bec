"""Small Paddle inference models written by Paddle's own exporters, for the Paddle frontend's tests.

``build_paddle_models(folder)`` runs this file as a child process: paddle is imported there only,
never in the test process (its import takes seconds and installs C signal handlers that would stay
for every later test).  The child writes one classifier (conv + batch norm + relu + pool + linear)
in each form users bring, and what Paddle's own predictor answers for one fixed input:

- ``pir/``: Paddle 3's PIR program, ``inference.json`` + ``inference.pdiparams`` (``paddle.jit.save``);
- ``legacy/``: a ProgramDesc, ``inference.pdmodel`` + ``inference.pdiparams`` (the same, under
  ``OldIrGuard``);
- ``old/``: the oldest form, ``__model__`` with one file per parameter beside it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

INPUT_SHAPE = (2, 3, 16, 16)
# the test modules' mark: the extra's packages, or a skip that names its install command
needs_paddle = pytest.mark.skipif(
    importlib.util.find_spec("paddle") is None or importlib.util.find_spec("paddle2onnx") is None,
    reason="paddlepaddle and paddle2onnx are not installed: pip install 'optcli[paddle]'")
FORMS = ("pir", "legacy", "old")


def build_paddle_models(folder: Path) -> Path:
    """Write the models under ``folder`` (in a child process) and return it."""
    done = subprocess.run([sys.executable, __file__, str(folder)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def _write_all(folder: Path) -> None:
    import paddle
    from paddle import nn

    class Classifier(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2D(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2D(8)
            self.pool = nn.AdaptiveAvgPool2D(1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            y = self.pool(nn.functional.relu(self.bn(self.conv(x))))
            return self.fc(paddle.flatten(y, 1))

    paddle.seed(0)
    net = Classifier()
    # Running statistics that are not the identity, so a lost batch norm shows.
    net.bn._mean.set_value(paddle.rand([8]) - 0.5)
    net.bn._variance.set_value(paddle.rand([8]) + 0.5)
    net.eval()
    spec = [paddle.static.InputSpec([None, *INPUT_SHAPE[1:]], "float32", "x")]
    paddle.jit.save(net, str(folder / "pir" / "inference"), input_spec=spec)
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(net, str(folder / "legacy" / "inference"), input_spec=spec)

    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype(np.float32)
    np.save(folder / "input.npy", x)
    np.save(folder / "expected.npy", _predict(paddle, folder / "pir" / "inference", x))
    _write_per_variable(paddle, folder)


def _predict(paddle, prefix: Path, x: np.ndarray) -> np.ndarray:
    """What Paddle's inference predictor answers: the reference the converted model must match."""
    config = paddle.inference.Config(f"{prefix}.json", f"{prefix}.pdiparams")
    config.disable_glog_info()
    predictor = paddle.inference.create_predictor(config)
    predictor.get_input_handle(predictor.get_input_names()[0]).copy_from_cpu(x)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def _write_per_variable(paddle, folder: Path) -> None:
    """The legacy model again as ``old/__model__`` with one parameter a file (``save_vars``)."""
    old = folder / "old"
    old.mkdir()
    paddle.enable_static()
    executor = paddle.static.Executor(paddle.CPUPlace())
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(paddle.static.Scope()):
        program, _, _ = paddle.static.load_inference_model(str(folder / "legacy" / "inference"), executor)
        paddle.static.io.save_vars(executor, str(old), program, predicate=paddle.static.io.is_persistable)
    (old / "__model__").write_bytes((folder / "legacy" / "inference.pdmodel").read_bytes())


if __name__ == "__main__":
    _write_all(Path(sys.argv[1]))
