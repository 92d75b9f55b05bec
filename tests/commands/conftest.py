"""Small models and .nb files shared by the command tests (built once per session)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import optcli
from optcli.zoo import build
from tests.helpers import run_cli


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run `optcli ARGS` in-process: (exit code, stdout, stderr)."""
    from optcli.cli import optcli_main

    return run_cli(optcli_main, "optcli", args, capsys)


@pytest.fixture(scope="session")
def gpu_model(tmp_path_factory):
    """(onnx path, .nb path) of a small MobileNetV2-like net optimized for opencl,arm."""
    folder = tmp_path_factory.mktemp("gpu_model")
    model = build("mobilenet_v2", resolution=32, width=0.25)
    onnx.save(model, folder / "m.onnx")
    result = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"})
    (folder / "m.nb").write_bytes(result.data)
    np.save(folder / "x.npy", np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    return folder / "m.onnx", folder / "m.nb"


@pytest.fixture(scope="session")
def cpu_model(tmp_path_factory):
    """(onnx path, .nb path) of a dynamic-shape CNN optimized for arm."""
    folder = tmp_path_factory.mktemp("cpu_model")
    model = build("dynamic_cnn")
    onnx.save(model, folder / "d.onnx")
    (folder / "d.nb").write_bytes(optcli.optimize(model=model, valid_targets="arm").data)
    return folder / "d.onnx", folder / "d.nb"
