"""The enumeration of kernel programs (``optcli.gpu.variants``) is complete: walking the
registry over the representative nodes of ``cases.py`` emits only (source, defines) pairs it
lists, every define a source reads has a domain, and every listed define value is exercised."""

from __future__ import annotations

from optcli.gpu.variants import define_keys, program_variants, source_names
from tests.metal.test_execute import planned_launches


def _categorical(defines: dict) -> frozenset:
    """Float defines (epilogue alpha / beta) take any value; the rest select code."""
    return frozenset((k, v) for k, v in defines.items() if not isinstance(v, float))


def test_launches_fall_inside_the_enumeration():
    listed = {(s, _categorical(d)) for s, d in program_variants()}
    seen = set()
    for case, _kern, launches in planned_launches("fp32"):
        for launch in launches:
            key = (launch.source, _categorical(launch.defines))
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
        read = define_keys(source) - {"ACT_ALPHA", "ACT_BETA"}  # floats with defaults
        if "ACTIVATION" in read and source not in ("conv.cl", "winograd.cl", "gemm.cl", "elementwise.cl"):
            read.discard("ACTIVATION")  # the shared epilogue: present, unused by this source's launches
        if "FAKE_QUANT" in read and source not in ("conv.cl", "winograd.cl", "gemm.cl", "elementwise.cl", "pool.cl"):
            read.discard("FAKE_QUANT")  # the epilogue's fused FakeQuant, likewise
        assert read <= by_source.get(source, set()), f"{source} reads {sorted(read)} without a listed domain"
