"""tests/gpu: every test here needs the OpenCL device (``tests/conftest.py`` marks them ``opencl``)
and records the launches it binds, so ``test_kernel_coverage.py`` can tell which kernel entries
ran at which precision; that guard runs after every other test of the session."""

from __future__ import annotations

import pytest

from optcli.runtime.opencl.device import ClLaunchContext
from tests.gpu.harness import LAUNCHED

COVERAGE_TEST = "test_kernel_coverage.py::test_every_kernel_runs_at_fp32_and_fp16"


@pytest.fixture(autouse=True)
def record_launches(monkeypatch):
    bind = ClLaunchContext.bind

    def recording_bind(self, launch, label):
        LAUNCHED.add((self.namespace, launch.source, launch.entry, self.precision))
        return bind(self, launch, label)

    monkeypatch.setattr(ClLaunchContext, "bind", recording_bind)


def pytest_collection_modifyitems(session, config, items):
    """The coverage guard last: it judges what the tests before it launched."""
    last = [item for item in items if item.nodeid.endswith(COVERAGE_TEST)]
    items[:] = [item for item in items if item not in last] + last


def pytest_deselected(items):
    if any("tests/gpu/" in item.nodeid for item in items):
        DESELECTED.append(True)


DESELECTED: list[bool] = []
