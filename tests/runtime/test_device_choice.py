"""Which OpenCL device runs a plan's GPU steps when none is named (issue 21): discrete GPUs, then
integrated GPUs, other accelerators, OpenCL on the CPU; a simulator (Oclgrind, or any device that
says it simulates or emulates) never, unless named.  With nothing real usable, a GPU plan runs on the
host with the notice and ``require_gpu=True`` raises.  Fake platforms and devices stand in for the
machine's (their smoke test is replaced)."""

from __future__ import annotations

import types

import pyopencl as cl
import pytest

import optcli
from optcli.errors import TargetError
from optcli.runtime.opencl import device as opencl
from optcli.runtime.opencl import devices
from optcli.zoo import build
from tests.commands.conftest import cli
from tests.runtime.test_devices import FakeDevice

OCLGRIND = dict(kind=cl.device_type.GPU, platform="Oclgrind")


class Device(FakeDevice):
    """A fake device that also answers the capability queries of ``optcli devices``."""

    extensions, driver_version, max_compute_units = "", "1.0", 2
    global_mem_size = max_mem_alloc_size = 1 << 30
    local_mem_size, max_work_group_size, max_work_item_sizes, image_support = 1 << 15, 256, [256, 256, 256], False


@pytest.fixture
def machine(monkeypatch):
    """Install fake devices as the machine's only ones; every smoke test passes."""
    monkeypatch.setattr(devices, "_VERDICTS", {})
    monkeypatch.setattr(opencl.ClDevice, "_shared", {})
    monkeypatch.setattr(devices, "_smoke_test", lambda device: None)
    monkeypatch.delenv(opencl.DEVICE_ENV, raising=False)

    def install(*fakes: FakeDevice) -> None:
        by_platform: dict[str, list] = {}
        for f in fakes:
            by_platform.setdefault(f.platform.name, []).append(f)
        platforms = [types.SimpleNamespace(name=name, get_devices=lambda found=found: list(found))
                     for name, found in by_platform.items()]
        monkeypatch.setattr(opencl.cl, "get_platforms", lambda: platforms)

    return install


def _names(found) -> list[str]:
    return [d.name for d in found]


def test_real_devices_in_rank_order(machine):
    machine(Device("a cpu", cl.device_type.CPU), Device("an igpu", unified=True),
            Device("an npu", cl.device_type.ACCELERATOR), Device("a dgpu"))
    assert _names(opencl._candidates()) == ["a dgpu", "an igpu", "an npu", "a cpu"]
    assert [devices.device_rank(d)[1] for d in opencl._candidates()] == [
        "discrete GPU", "integrated GPU", "accelerator", "OpenCL on the CPU"]


def test_a_simulator_is_never_picked_unasked(machine):
    grind = Device("Oclgrind Simulator", **OCLGRIND)
    emulator = Device("Acme GPU Emulator")  # a device that says so in its name
    machine(grind, emulator, Device("pthread-cpu", cl.device_type.CPU))
    assert _names(opencl._candidates()) == ["pthread-cpu"]
    assert opencl._pick_device().name == "pthread-cpu"
    assert _names(opencl._candidates("oclgrind")) == ["Oclgrind Simulator"], "named, it is used"
    assert devices.device_label(grind) == devices.device_label(emulator) == "simulator"


def test_only_a_simulator_means_no_device(machine):
    machine(Device("Oclgrind Simulator", **OCLGRIND))
    with pytest.raises(opencl.DeviceUnavailable, match="only a simulated OpenCL device was found .*used only when "
                                                       "named"):
        opencl.ClDevice.shared()


def test_a_gpu_plan_runs_on_the_host_when_only_a_simulator_is_there(machine, caplog):
    machine(Device("Oclgrind Simulator", **OCLGRIND))
    m = build("mobilenet_v2", resolution=32, width=0.25)
    data = optcli.optimize(model=m, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"}).data
    with pytest.raises(TargetError, match="require_gpu=True, but only a simulated OpenCL device"):
        optcli.load(data, require_gpu=True)
    with caplog.at_level("WARNING", logger="optcli"):
        p = optcli.load(data)
    assert p.gpu is None
    assert any("running the GPU steps on the CPU: only a simulated" in r.getMessage() for r in caplog.records)


def test_devices_command_labels_each_and_names_the_choice(machine, capsys):
    machine(Device("Oclgrind Simulator", **OCLGRIND), Device("pthread-cpu", cl.device_type.CPU),
            Device("an igpu", unified=True))
    code, out, _ = cli(["devices"], capsys)
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert code == 0
    assert lines[0].startswith("[0] simulator: Oclgrind Simulator") and "never picked unasked" in lines[0]
    assert lines[1].startswith("[1] cpu: pthread-cpu") and lines[2].startswith("[2] gpu: an igpu")
    assert "GPU steps run on [2] an igpu: the best ranked usable device (integrated GPU" in out


def test_devices_command_fails_when_only_a_simulator_is_usable(machine, capsys):
    machine(Device("Oclgrind Simulator", **OCLGRIND))
    code, out, err = cli(["devices"], capsys)
    assert code == 2 and "no usable OpenCL device but a simulator" in err
