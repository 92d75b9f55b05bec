"""Shared fixtures: small models, compiled once per session; the session's OpenCL device.

Tests that need an OpenCL device carry the ``opencl`` marker (every test under ``tests/gpu`` gets
it here) or take the ``opencl_device`` fixture: they run on the device the runtime itself picks
(``ClDevice.shared``: the first one that passes the smoke test) or, where the machine has none
usable, skip with the reason, never fail.  ``-m "not opencl"`` leaves them out.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest

import optcli
from optcli.zoo import build, sample_inputs

GPU_TESTS = Path(__file__).parent / "gpu"
_NEEDING_DEVICE = pytest.StashKey[int]()


@functools.cache
def opencl_status():
    """(ClDevice, "") for this session's OpenCL device, or (None, why none is usable); the smoke
    test runs once, here, and its verdict is the runtime's too."""
    from optcli.runtime.opencl.device import ClDevice, DeviceUnavailable

    try:
        return ClDevice.shared(), ""
    except DeviceUnavailable as exc:
        return None, str(exc)


def pytest_configure(config):
    config.addinivalue_line("markers", "opencl: needs a usable OpenCL device (skips with the reason where "
                                       "there is none)")


def pytest_report_header(config):
    dev, why = opencl_status()
    if dev is None:
        return f"opencl: tests that need a device skip: {why}"
    return f"opencl: GPU tests run on {dev.describe()}, {dev.device.version.strip()}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if GPU_TESTS in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.opencl)
    config.stash[_NEEDING_DEVICE] = sum(item.get_closest_marker("opencl") is not None for item in items)


def pytest_terminal_summary(terminalreporter, config):
    """One line, also under -q (which hides the header): where the GPU tests ran, or why they skipped."""
    if not config.stash.get(_NEEDING_DEVICE, 0):
        return
    dev, why = opencl_status()
    if dev is not None:
        terminalreporter.write_line(f"opencl: GPU tests ran on {dev.describe()}")
        return
    skipped = sum(why in str(getattr(r, "longrepr", "")) for r in terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(f"opencl: {skipped} tests that need a device skipped: {why}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip before any fixture is set up (module fixtures may build GPU models)."""
    if item.get_closest_marker("opencl") is not None:
        dev, why = opencl_status()
        if dev is None:
            pytest.skip(why)


@pytest.fixture(scope="session")
def opencl_device():
    """The session's ClDevice (the one ``optcli.load`` uses); skips where none is usable."""
    dev, why = opencl_status()
    if dev is None:
        pytest.skip(why)
    return dev


@pytest.fixture
def optcli_notices(caplog):
    """What the runtime told the user during the test (the "optcli" logger's warnings: CPU
    fallbacks), whatever level other code set on the root logger."""
    caplog.set_level(logging.WARNING, logger="optcli")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "optcli" and r.levelno >= logging.WARNING]


@pytest.fixture(scope="session")
def small_cnn():
    """(model, compiled result, feeds) for a small MobileNetV2-like net."""
    model = build("mobilenet_v2", resolution=32, width=0.25)
    return model, optcli.optimize(model=model), sample_inputs(model)


@pytest.fixture(scope="session")
def small_nb(small_cnn, tmp_path_factory):
    path = tmp_path_factory.mktemp("nb") / "small.nb"
    path.write_bytes(small_cnn[1].data)
    return path
