"""Choosing the OpenCL device: a device that fails the smoke test is skipped for the next usable
one (once per device per process), every device tried is named with its failure when none is
usable, ``optcli devices`` exits 2 and says how to get one, the CPU fallback notice is one line,
and the tests skip (never fail) on a machine whose device cannot build kernels.

A failing device is simulated by replacing the smoke test (``devices._smoke_test``), or by fake
platforms and devices; the tests marked ``opencl`` also use the machine's real device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pyopencl as cl
import pytest

import optcli
from optcli.runtime.opencl import device as opencl
from optcli.runtime.opencl import devices
from optcli.zoo import build
from tests.commands.conftest import cli

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = "fails to build a test kernel (simulated: unknown target CPU 'generic')"


class FakeDevice:
    """Enough of a pyopencl Device for choosing and describing (its smoke test is replaced)."""

    def __init__(self, name: str, kind=cl.device_type.GPU, version: str = "OpenCL 3.0 fake",
                 platform: str = "Fake Platform", unified: bool = False):
        self.name, self.type, self.version = name, kind, version
        self.platform = types.SimpleNamespace(name=platform)
        self.vendor = "Fake Vendor"
        self.host_unified_memory = unified
        self.int_ptr = id(self)


@pytest.fixture
def fresh(monkeypatch):
    """No verdict and no shared device from earlier tests; smoke tests counted per device name."""
    monkeypatch.setattr(devices, "_VERDICTS", {})
    monkeypatch.setattr(opencl.ClDevice, "_shared", {})
    tested: list[str] = []
    real = devices._smoke_test

    def smoke_test(device):
        tested.append(device.name.strip())
        return SIMULATED if isinstance(device, FakeDevice) or device.name.startswith("broken") else real(device)

    monkeypatch.setattr(devices, "_smoke_test", smoke_test)
    return tested


def _platforms(monkeypatch, fakes: list[FakeDevice], keep_real: bool):
    real = cl.get_platforms() if keep_real else []
    fake = types.SimpleNamespace(get_devices=lambda: list(fakes), name="Fake Platform")
    monkeypatch.setattr(opencl.cl, "get_platforms", lambda: [fake, *real])


@pytest.mark.opencl
def test_a_device_failing_the_smoke_test_is_skipped_for_the_next(monkeypatch, fresh, opencl_device):
    broken = FakeDevice("broken GPU")  # a GPU: tried first
    _platforms(monkeypatch, [broken], keep_real=True)
    dev = opencl.ClDevice.shared()
    assert dev.device == opencl_device.device
    assert fresh[0] == "broken GPU"
    for _ in range(3):
        assert opencl.ClDevice.shared() is dev
    assert fresh.count("broken GPU") == 1 and fresh.count(dev.name) == 1, "one smoke test per device per process"


def test_no_usable_device_names_each_device_tried(monkeypatch, fresh):
    _platforms(monkeypatch, [FakeDevice("broken GPU"), FakeDevice("broken CPU", cl.device_type.CPU),
                             FakeDevice("old GPU", version="OpenCL 1.1 fake")], keep_real=False)
    with pytest.raises(opencl.DeviceUnavailable) as exc:
        opencl.ClDevice.shared()
    message = str(exc.value)
    assert message.startswith("no usable OpenCL device: broken GPU (GPU, Fake Platform) " + SIMULATED)
    assert f"broken CPU (OpenCL on the CPU, Fake Platform) {SIMULATED}" in message
    assert "old GPU (GPU, Fake Platform) speaks OpenCL 1.1 fake, older than OpenCL 1.2" in message
    assert "apt install pocl-opencl-icd" in message and "optcli[pocl]" in message and "\n" not in message
    assert fresh == ["broken GPU", "broken CPU"], "an OpenCL 1.1 device needs no smoke test"
    with pytest.raises(opencl.DeviceUnavailable, match="no OpenCL device matches 'nvidia' \\(found: broken GPU"):
        opencl.ClDevice.shared("nvidia")


def test_no_platform_says_how_to_get_one(monkeypatch):
    def none():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(opencl.cl, "get_platforms", none)
    with pytest.raises(opencl.DeviceUnavailable, match="^no OpenCL platform .*PLATFORM_NOT_FOUND_KHR.*to get one: "
                                                        "`apt install pocl-opencl-icd`"):
        opencl.ClDevice.shared()


def test_load_falls_back_naming_every_device_tried(monkeypatch, fresh):
    from optcli.errors import TargetError

    _platforms(monkeypatch, [FakeDevice("broken GPU")], keep_real=False)
    m = build("mobilenet_v2", resolution=32, width=0.25)
    data = optcli.optimize(model=m, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"}).data
    with pytest.raises(TargetError, match=re.escape(f"require_gpu=True, but no usable OpenCL device: broken GPU "
                                                    f"(GPU, Fake Platform) {SIMULATED}; to get one")):
        optcli.load(data, require_gpu=True)


def test_devices_command_exits_2_and_says_how_to_get_one(fresh, monkeypatch, capsys):
    monkeypatch.setattr(devices, "_smoke_test", lambda device: SIMULATED)
    code, out, err = cli(["devices"], capsys)
    assert code == 2
    assert all("NOT usable: " + SIMULATED in line for line in out.splitlines() if line.startswith("["))
    assert err.startswith("optcli: error: no ") and "apt install pocl-opencl-icd" in err and "optcli[pocl]" in err
    assert "vendor's OpenCL driver" in err and len(err.strip().splitlines()) == 1
    code, out, _ = cli(["devices", "--json"], capsys)
    assert code == 2 and not any(d["usable"] for d in json.loads(out))


@pytest.mark.opencl
def test_devices_command_names_the_device_the_runtime_picks(capsys, opencl_device):
    code, out, _ = cli(["devices"], capsys)
    assert code == 0 and "GPU steps run on [" in out and f"] {opencl_device.name}: the best ranked usable device" in out
    if opencl_device.device.type & cl.device_type.CPU:
        assert opencl_device.kind == "OpenCL on the CPU" and "(OpenCL on the CPU, " in out


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=300)


def test_cpu_fallback_notice_is_one_line_without_source_paths(tmp_path):
    m = build("mobilenet_v2", resolution=32, width=0.25)
    nb = tmp_path / "gpu.nb"
    nb.write_bytes(optcli.optimize(model=m, valid_targets="opencl,arm",
                                   disabled_passes={"keep_small_islands_on_host"}).data)
    run = _python(f"""
        from optcli.runtime.opencl import devices
        devices._smoke_test = lambda device: {SIMULATED!r}
        import optcli
        for _ in range(2):  # once per process
            assert optcli.load({str(nb)!r}).gpu is None
        """)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("optcli: running the GPU steps on the CPU: no "), lines[0]
    assert ".py" not in lines[0] and "Warning" not in lines[0]
    if "no usable OpenCL device" in lines[0]:  # a platform with a device: named with its failure
        assert SIMULATED in lines[0]


def test_gpu_tests_skip_with_the_reason_when_the_device_is_broken(tmp_path):
    """The tests of tests/gpu on a machine whose OpenCL device cannot build kernels: skipped, with
    the device's failure as the reason, and the session header says so."""
    (tmp_path / "break_opencl.py").write_text(f"from optcli.runtime.opencl import devices\n"
                                              f"devices._smoke_test = lambda device: {SIMULATED!r}\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "break_opencl", "-p", "no:cacheprovider", "-rs",
                          "tests/gpu/test_softmax.py", "tests/gpu/test_kernel_coverage.py"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "opencl: tests that need a device skip: no " in run.stdout  # the header
    assert re.search(r"^opencl: \d+ tests that need a device skipped: no ", run.stdout, re.M)  # shown under -q too
    summary = run.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "failed" not in summary, summary
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("no usable OpenCL device" in s or "no OpenCL" in s for s in skips), skips


@pytest.mark.opencl
def test_the_runtime_takes_over_the_smoke_tests_context_and_optcli_devices_keeps_none(opencl_device, monkeypatch):
    """Opening a context is most of a warm load on a GPU (CUDA's start: 0.11 s of 0.22 on an H100),
    so the device the runtime picks keeps its smoke test's context and ClDevice uses it; listing
    devices keeps none (a CUDA context holds GPU memory, for a device perhaps never used)."""
    from optcli.runtime.opencl import device as device_module
    from optcli.runtime.opencl import devices

    monkeypatch.setattr(devices, "_VERDICTS", {})
    monkeypatch.setattr(devices, "_CONTEXTS", {})
    devices.list_devices()
    assert devices._VERDICTS and not devices._CONTEXTS, "optcli devices kept a context"
    monkeypatch.setattr(devices, "_VERDICTS", {})
    picked = device_module._pick_device(opencl_device.name)
    kept = devices._CONTEXTS.get(devices.device_id(picked))
    assert kept is not None, "the runtime's pick kept no context"
    assert device_module.ClDevice(picked).context is kept
    assert devices.take_context(picked) is None, "a context was handed out twice"
