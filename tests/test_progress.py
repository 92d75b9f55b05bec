"""Progress lines when stderr is not a terminal (CI logs): calibration and verification show
samples done and the op being evaluated every few seconds; `opt --quiet` silences them."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import onnx
import pytest

from optcli import progress
from optcli.zoo import build, sample_inputs
from tests.helpers import run_cli


@pytest.fixture
def fast_lines(monkeypatch):
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.01)
    monkeypatch.setattr(progress, "interactive", lambda: False)


@pytest.fixture(scope="module")
def model_and_samples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress")
    model = build("mobilenet_v2", resolution=32, width=0.5)
    onnx.save(model, folder / "m.onnx")
    (folder / "calib").mkdir()
    for i in range(6):
        np.save(folder / "calib" / f"{i}.npy", sample_inputs(model, seed=i)["input"])
    return folder


def _slow_run(monkeypatch):
    """Each op takes a moment, so lines land while ops run (the model is tiny)."""
    from optcli.passes import quantize_int8
    from optcli.runtime import executor

    real_eval, real_bind = quantize_int8.evaluate_node, executor.bind_step

    def evaluate_node(node, *args):
        time.sleep(0.002)
        return real_eval(node, *args)

    def bind_step(*args):
        fn = real_bind(*args)

        def slow(inputs):
            time.sleep(0.002)
            return fn(inputs)
        return slow

    monkeypatch.setattr(quantize_int8, "evaluate_node", evaluate_node)
    monkeypatch.setattr(executor, "bind_step", bind_step)


def test_calibration_and_verification_print_lines_with_samples_and_the_op(model_and_samples, fast_lines, capsys,
                                                                           monkeypatch):
    from optcli.cli import opt_main

    _slow_run(monkeypatch)
    folder = model_and_samples
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={folder}/m.onnx", "--quant_type=INT8",
                                             f"--calib_data={folder}/calib", "--verify",
                                             f"--optimize_out={folder}/q"], capsys)
    assert code == 0, err
    calibrating = [line for line in err.splitlines() if line.startswith("optcli: calibrating (ranges): ")]
    verifying = [line for line in err.splitlines() if line.startswith("optcli: verifying: ")]
    assert calibrating and verifying, err
    assert any(re.search(r": \d/6 samples, \d+ s, at \w+ '[^']+'$", line) for line in calibrating), calibrating
    assert any(re.search(r": \d/6 samples, \d+ s, at (\w+ '[^']+'|running onnxruntime)$", line)
               for line in verifying), verifying
    assert calibrating[-1].endswith(" 6/6 samples, done in 0 s") or "done in" in calibrating[-1]


def test_quiet_silences_the_lines(model_and_samples, fast_lines, capsys, monkeypatch):
    from optcli.cli import opt_main

    _slow_run(monkeypatch)
    folder = model_and_samples
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={folder}/m.onnx", "--quant_type=INT8", "--quiet",
                                             f"--calib_data={folder}/calib", f"--optimize_out={folder}/q2"], capsys)
    assert code == 0 and "optcli: calibrating" not in err, err


def test_short_work_prints_nothing_and_the_thread_ends(capsys, monkeypatch):
    monkeypatch.setattr(progress, "interactive", lambda: False)
    before = threading.active_count()
    assert list(progress.progress(range(3), "quick", total=3, unit="items")) == [0, 1, 2]
    assert capsys.readouterr().err == "" and threading.active_count() == before
