"""`optcli run`: inputs from .npy and images, outputs saved as .npy, statistics and top-k."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import optcli
from tests.commands.conftest import cli

PHOTO = Path(__file__).resolve().parents[2] / "examples" / "data" / "sunset.png"


def test_npy_input_saves_outputs_and_prints_stats(gpu_model, tmp_path, capsys):
    x = gpu_model[1].parent / "x.npy"
    code, out, err = cli(["run", str(gpu_model[1]), f"--input=input={x}", f"--output_dir={tmp_path}/o",
                          "--top_k=3"], capsys)
    assert code == 0, err
    saved = np.load(tmp_path / "o" / "output.npy")
    expected = optcli.load(gpu_model[1], targets="arm").run({"input": np.load(x)})["output"]
    np.testing.assert_allclose(saved, expected, rtol=1e-4, atol=1e-5)
    assert "[1, 10]" in out and "float32" in out and "top 3 of 'output'" in out
    assert f"     {int(saved.argmax())} " in out.split("top 3")[1].splitlines()[3]


def test_image_input_is_resized_and_scaled(cpu_model, tmp_path, capsys):
    pytest.importorskip("PIL")
    code, out, err = cli(["run", str(cpu_model[1]), f"--input={PHOTO}", "--preprocess=imagenet,resize=40x48",
                          f"--output_dir={tmp_path}", "--top_k=2"], capsys)
    assert code == 0, err
    assert np.load(tmp_path / "output.npy").shape == (1, 10)


def test_image_tensor_layout_and_values():
    pytest.importorskip("PIL")
    from optcli.preprocess import load_image, parse

    x = load_image(str(PHOTO), (1, 3, 32, 48), "float32", parse(None))
    assert x.shape == (1, 3, 32, 48) and 0 <= x.min() and x.max() <= 1
    assert x[0, 0].mean() > x[0, 2].mean()  # a sunset: more red than blue
    nhwc = load_image(str(PHOTO), (1, 64, 96, 4), "float32", parse("raw"))
    assert nhwc.shape == (1, 64, 96, 4) and nhwc.max() > 200


def test_missing_pillow_names_the_extra(cpu_model, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    code, _, err = cli(["run", str(cpu_model[1]), f"--input=input={PHOTO}"], capsys)
    assert code == 2 and "optcli[images]" in err


@pytest.mark.parametrize("args, message", [
    ([], "no --input for 'input'"),
    (["--input=nope=x.npy"], "has no input 'nope'"),
    (["--input=input=missing.npy"], "no such file"),
    (["--input=input=x.npy", "--preprocess=colour=3"], "not understood"),
    (["--input=input=x.npy", "--preprocess=imagenet,crop=0"], "not understood"),
])
def test_user_errors(gpu_model, capsys, monkeypatch, args, message):
    monkeypatch.chdir(gpu_model[1].parent)
    code, _, err = cli(["run", str(gpu_model[1]), *args], capsys)
    assert code == 2 and message in err, err
