"""End to end on the zoo: ONNX -> opt passes -> .nb -> arm runtime, against onnxruntime at fp32."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import optcli
from optcli.zoo import ZOO, build, sample_inputs
from tests.helpers import assert_close


def _ort(model, feeds):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_matches_onnxruntime(name):
    model = build(name)
    feeds = sample_inputs(model, spatial=40)
    result = optcli.optimize(model=model)
    assert result.report["nodes_after"] <= result.report["nodes_before"]
    outputs = optcli.load(result.data).run(feeds)
    for key, expected in _ort(model, feeds).items():
        assert_close(outputs[key], expected, "fp32", what=f"{name}:{key}")


def test_fusions_fire_on_mobilenet():
    report = optcli.optimize(model=build("mobilenet_v3", hardswish="decomposed")).report
    ops = report["ops_after"]
    assert "BatchNormalization" not in ops and "Relu" not in ops and "HardSwish" not in ops
    assert report["fallback_ops"] == {}
    changed = {r["name"]: r["changed"] for r in report["passes"]}
    assert sum(changed["fuse_conv_bn"].values()) > 0


def test_lstm_runs_optcli_kernel_not_the_reference_fallback():
    report = optcli.optimize(model=build("lstm_model")).report
    assert not report["fallback_ops"]
    assert [s["kernel"] for s in report["steps"] if s["op"] == "LSTM"] == ["onnx.LSTM.default"]


def test_dynamic_batch_and_spatial_dims():
    model = build("mobilenet_v2", batch="N", resolution=32)
    p = optcli.load(optcli.optimize(model=model).data)
    for batch in (1, 2):
        feeds = sample_inputs(model, batch=batch)
        assert_close(p.run(feeds)["output"], _ort(model, feeds)["output"], what=f"batch {batch}")


def test_pinned_batch_gives_static_memory_plan():
    model = build("mobilenet_v2", batch="N", resolution=32)
    result = optcli.optimize(model=model, input_shapes="input:2,3,32,32")
    mem = result.report["memory"]
    assert not mem["dynamic"] and mem["peak_activation_bytes"] < mem["naive_activation_bytes"]
    feeds = sample_inputs(model, batch=2)
    assert_close(optcli.load(result.data).run(feeds)["output"], _ort(model, feeds)["output"])


CONV_CHAINS = {"mobilenet_v2", "mobilenet_v3", "efficientnet_lite0", "resnet18"}


@pytest.mark.parametrize("blocked_width", ["library", "one"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_with_and_without_the_blocked_layout(name, blocked_width, monkeypatch):
    """The host plan's conv regions run channel-blocked (choose_host_layout); the same model with
    the pass disabled runs all NCHW: both match onnxruntime, and the conv nets do have regions.
    The blocked plan runs at the library's vector width and at 1 (plain kernels on views), whichever
    this machine would pick by default (ops/blocked.py ``block_width``)."""
    monkeypatch.setenv("OPTCLI_HOST_BLOCKED", "1" if blocked_width == "library" else "0")
    model = build(name)
    feeds = sample_inputs(model, spatial=40, seed=1)
    expected = _ort(model, feeds)
    blocked = optcli.optimize(model=model, valid_targets="arm")
    plain = optcli.optimize(model=model, valid_targets="arm", disabled_passes=("choose_host_layout",))
    assert not any(".nchwc" in s.kernel for s in plain.plan.steps)
    n_blocked = sum(".nchwc" in s.kernel for s in blocked.plan.steps)
    convs = sum(s.op_type == "Conv" for s in blocked.plan.steps)
    if name in CONV_CHAINS:  # one region (the others' Concat/Split/Resize borders cost more than it saves)
        assert n_blocked >= convs, f"{name}: {n_blocked} blocked steps for {convs} convs"
    for result in (blocked, plain):
        outputs = optcli.load(result.data).run(feeds)
        for key, want in expected.items():
            assert_close(outputs[key], want, "fp32", what=f"{name}:{key}")
