"""The coverage guard of tests/gpu (like ``tests/metal/test_execute.py::test_every_kernel_is_executed``):
every registered OpenCL kernel, and every entry of every kernel source, was launched by some test
of tests/gpu at fp32 and at fp16.  It reads what the tests before it launched (``LAUNCHED``, filled
by ``tests/gpu/conftest.py``), so it runs last, and only judges a session that ran all of tests/gpu."""

from __future__ import annotations

from pathlib import Path

import pytest

from optcli.gpu.registry import all_gpu_kernels
from optcli.gpu.variants import kernel_entries
from tests.gpu import conftest
from tests.gpu.harness import LAUNCHED

HERE = Path(__file__).parent
PRECISIONS = ("fp32", "fp16")


def wanted() -> tuple[set[str], set[tuple[str, str]]]:
    """Kernel ids and (source, entry) pairs that must run; Upload / Download are buffer copies."""
    kernels = {k.id for k in all_gpu_kernels() if k.variant != "copy"}
    entries = {(source, entry) for source, names in kernel_entries().items() for entry in names}
    return kernels, entries


def missing_launches(launched: set[tuple[str, str, str, str]]) -> list[str]:
    kernels, entries = wanted()
    missing = []
    for precision in PRECISIONS:
        ran_kernels = {k for k, _, _, p in launched if p == precision}
        ran_entries = {(s, e) for _, s, e, p in launched if p == precision}
        missing += [f"{k} at {precision}" for k in sorted(kernels - ran_kernels)]
        missing += [f"{s}:{e} at {precision}" for s, e in sorted(entries - ran_entries)]
    return missing


def test_every_kernel_runs_at_fp32_and_fp16(request):
    files = {p.name for p in HERE.glob("test_*.py")}
    ran = {Path(str(item.path)).name for item in request.session.items if Path(str(item.path)).parent == HERE}
    if conftest.DESELECTED or ran != files:
        pytest.skip("the coverage guard judges a run of the whole of tests/gpu")
    missing = missing_launches(LAUNCHED)
    assert not missing, f"OpenCL kernels no test of tests/gpu launched: {missing}"


def test_the_guard_sees_a_kernel_that_never_ran():
    kernels, entries = wanted()
    everything = {(k, s, e, p) for p in PRECISIONS for k in kernels for s, e in [next(iter(entries))]}
    everything |= {("", s, e, p) for p in PRECISIONS for s, e in entries}
    assert missing_launches(everything) == []
    gone = "gpu.onnx.Ceil.default"
    assert missing_launches({t for t in everything if not (t[0] == gone and t[3] == "fp16")}) == [f"{gone} at fp16"]
