"""The enumeration of kernel programs (``optcli.gpu.variants``) is complete and finite: walking
the registry over the representative nodes of ``cases.py`` emits only (source, defines) pairs it
lists (exactly: no float parameter rides in a define), every define a source reads has a
domain, every listed define value is exercised, and the runtime refuses anything else."""

from __future__ import annotations

import pytest

from optcli.gpu.dialect import render_opencl
from optcli.gpu.variants import check_program, define_keys, program_variants, source_names
from tests.metal.test_execute import planned_launches


def test_launches_fall_inside_the_enumeration():
    listed = {(s, frozenset(d.items())) for s, d in program_variants()}
    seen = set()
    for case, _kern, launches in planned_launches("fp32"):
        for launch in launches:
            assert all(isinstance(v, int) for v in launch.defines.values()), f"{case.id}: {launch.defines}"
            check_program(launch.source, {**launch.defines, "STORAGE_HALF": 1})
            key = (launch.source, frozenset(launch.defines.items()))
            assert key in listed, f"{case.id}: {launch.source} {launch.defines} is not in optcli.gpu.variants"
            seen |= {(launch.source, k, v) for k, v in key[1]}
    # every value of every define runs on its source (all combinations compile: test_compile)
    values = {(s, k, v) for s, d in listed for k, v in d}
    assert not values - seen, f"define values no case runs: {sorted(map(str, values - seen))}"


def test_every_read_define_has_a_domain():
    by_source: dict[str, set[str]] = {}
    for source, defines in program_variants():
        by_source.setdefault(source, set()).update(defines)
    for source in source_names():
        read = define_keys(source)
        if "ACTIVATION" in read and source not in ("conv.cl", "winograd.cl", "gemm.cl", "elementwise.cl"):
            read.discard("ACTIVATION")  # the shared epilogue: present, unused by this source's launches
        if "FAKE_QUANT" in read and source not in ("conv.cl", "winograd.cl", "gemm.cl", "elementwise.cl", "pool.cl"):
            read.discard("FAKE_QUANT")  # the epilogue's fused FakeQuant, likewise
        assert read <= by_source.get(source, set()), f"{source} reads {sorted(read)} without a listed domain"


def test_the_enumeration_is_small_and_nothing_else_builds():
    """However many steps a file holds, the programs it can make the runtime build are these."""
    programs = list(program_variants())
    assert len(programs) < 200
    with pytest.raises(ValueError, match="not a program of the kernel library"):
        check_program("conv.cl", {"ACTIVATION": 99, "STORAGE_HALF": 0})
    with pytest.raises(ValueError, match="not a program of the kernel library"):
        check_program("conv.cl", {"ACTIVATION": 3, "ACT_ALPHA": 1, "STORAGE_HALF": 0})
    with pytest.raises(ValueError, match="enumerated ints only"):
        render_opencl("conv.cl", {"ACTIVATION": 3, "ACT_ALPHA": 0.25})  # a float is an argument, not a define
