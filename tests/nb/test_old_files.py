"""`.nb` files written before the re-housing of the package (issue 20, commit 272aa55) still load and
run: the format did not change, only where its code lives.  Each old file gives what a file optimized
now from the same model with the same options gives (``tools/nb_digests.py`` showed the files
themselves byte-identical at the time)."""

from __future__ import annotations

from pathlib import Path

import pytest

import optcli
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close

OLD = Path(__file__).resolve().parents[1] / "data" / "nb_before_rehousing"

# file -> (zoo model, optimize options, precision of the comparison)
FILES = {
    "zoo_dynamic_cnn_arm.nb": ("dynamic_cnn", {"valid_targets": "arm"}, "fp32"),
    "zoo_dynamic_cnn_opencl_fp16.nb": ("dynamic_cnn", {"valid_targets": "opencl,arm", "precision": "fp16"}, "fp16"),
    "zoo_dynamic_cnn_weights_int8.nb": ("dynamic_cnn", {"valid_targets": "arm", "quant_type": "QUANT_INT8"}, "fp32"),
    "zoo_lstm_model_weights_fp16.nb": ("lstm_model", {"valid_targets": "arm", "enable_fp16": True}, "fp32"),
    "zoo_lstm_model_opencl_fp32.nb": ("lstm_model", {"valid_targets": "opencl,arm"}, "fp32"),
}


def test_every_old_file_is_listed():
    assert sorted(p.name for p in OLD.glob("*.nb")) == sorted(FILES)


@pytest.mark.parametrize("name", sorted(FILES))
def test_an_old_file_runs_as_a_new_one(name):
    model_name, options, precision = FILES[name]
    model = build(model_name)
    old = optcli.load(OLD / name)
    new = optcli.load(optcli.optimize(model=model, **options).data)
    assert [(v.name, v.shape, v.dtype) for v in old.inputs] == [(v.name, v.shape, v.dtype) for v in new.inputs]
    feeds = sample_inputs(model, seed=3)
    got, want = old.run(feeds), new.run(feeds)
    assert sorted(got) == sorted(want)
    for out in want:
        assert_close(got[out], want[out], precision, what=f"{name}: {out}")
