"""The Metal backend's own code (``optcli.runtime.metal.device``) run end to end on Linux against a
fake ``Metal`` module whose GPU is the host through the shim (``fake_metal.py``): a model
optimized for `metal,arm` loads on the Metal backend, runs, and matches the CPU."""

from __future__ import annotations

import pytest

import optcli
from optcli.runtime.metal import device as metal
from optcli.runtime.metal import steps as metal_steps
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close
from tests.metal import fake_metal, shim

pytestmark = pytest.mark.skipif(shim.compilers() is None, reason="no clang (pip install ziglang)")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("OPTCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(metal, "_metal", lambda: fake_metal)
    monkeypatch.setattr(metal.MetalDevice, "_shared", {})
    return fake_metal.DEVICE


@pytest.fixture(scope="module")
def nb(tmp_path_factory):
    model = build("mobilenet_v2", resolution=32, width=0.25)
    result = optcli.optimize(model=model, valid_targets="metal,arm", disabled_passes={"keep_small_islands_on_host"})
    path = tmp_path_factory.mktemp("metal") / "net.nb"
    path.write_bytes(result.data)
    return path, sample_inputs(model)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_model_runs_on_the_metal_backend(fake, nb, precision):
    path, feeds = nb
    p = optcli.load(path, precision=precision, require_gpu=True)
    assert isinstance(p.gpu, metal_steps.MetalSteps) and p.gpu.dev.name == "Fake Metal device (host shim)"
    cpu = optcli.load(path, targets=["arm"])
    before = fake.waits
    for _ in range(2):  # buffers and pipelines are reused across runs
        got, want = p.run(feeds), cpu.run(feeds)
        for name in want:
            assert_close(got[name], want[name], precision, what=f"{name} (Metal backend, {precision})")
    downloads = sum(s.op_type == "Download" for s in p.plan.steps)
    assert fake.waits - before <= 2 * downloads + 2  # one wait per Download (and at most one at the end)


@pytest.mark.skipif(not metal.available()[0], reason="no Metal device here (macOS with optcli[metal] only)")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_metal_device(nb, precision):
    """On a Mac: the real PyObjC backend, against the CPU."""
    path, feeds = nb
    p = optcli.load(path, precision=precision, require_gpu=True)
    assert isinstance(p.gpu, metal_steps.MetalSteps)
    got, want = p.run(feeds), optcli.load(path, targets=["arm"]).run(feeds)
    for name in want:
        assert_close(got[name], want[name], precision, what=f"{name} (Metal, {precision})")


def test_upload_buffers_are_not_shared(fake, nb):
    path, _ = nb
    p = optcli.load(path, require_gpu=True)
    uploads = [s.outputs[0] for s in p.plan.steps if s.op_type == "Upload"]
    others = [b for name, b in p.gpu.buffers.items() if name not in uploads]
    assert uploads and all(all(p.gpu.buffers[u] is not b for b in others) for u in uploads)
