"""Memory planning: lifetimes, greedy-by-size offsets that never overlap while alive."""

from __future__ import annotations

import itertools

import numpy as np

from optcli.passes.plan_memory import ALIGN, lifetimes_of, plan_offsets
from optcli.zoo import build


def test_lifetimes_and_free_points():
    steps = [(["x"], ["a"]), (["a"], ["b"]), (["a", "b"], ["c"]), (["c", "w"], ["y"])]
    life, free_after = lifetimes_of(steps, ["x"], ["y"], {"w"})
    assert life == {"x": (-1, 0), "a": (0, 2), "b": (1, 2), "c": (2, 3), "y": (3, 3)}
    assert free_after == [["x"], [], ["a", "b"], ["c"]]


def test_offsets_never_collide_while_alive():
    life = {"a": (0, 2), "b": (1, 2), "c": (2, 3), "d": (3, 4), "e": (0, 4)}
    sizes = {"a": 1000, "b": 500, "c": 2000, "d": 1000, "e": 64}
    offsets, arena = plan_offsets(life, sizes)
    for p, q in itertools.combinations(sizes, 2):
        overlap_in_time = not (life[p][1] < life[q][0] or life[q][1] < life[p][0])
        if overlap_in_time:
            assert offsets[p] + sizes[p] <= offsets[q] or offsets[q] + sizes[q] <= offsets[p], (p, q)
    assert all(o % ALIGN == 0 for o in offsets.values())
    assert arena < sum(sizes.values()) + ALIGN * len(sizes)


def test_chain_reuses_memory():
    # A long chain needs two live buffers at a time, not one per value.
    n = 20
    steps = [([f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    life, _ = lifetimes_of(steps, ["v0"], [f"v{n}"], set())
    offsets, arena = plan_offsets(life, {k: 4096 for k in life})
    assert arena == 2 * 4096


def test_report_on_a_real_network():
    import optcli

    mem = optcli.optimize(model=build("resnet18")).report["memory"]
    assert 0 < mem["peak_activation_bytes"] < mem["naive_activation_bytes"] / 2


def _quadratic_reference(lifetimes, sizes):
    """The plain greedy-by-size placement, scanning every placed tensor (the definition)."""
    from optcli.passes.plan_memory import _align

    placed, offsets = [], {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], lifetimes[n][0], n)):
        size, (first, last) = _align(sizes[name]), lifetimes[name]
        offset = 0
        for o, e in sorted((o, e) for o, e, b, d in placed if not (d < first or b > last)):
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[name] = offset
        placed.append((offset, offset + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


def test_step_indexed_placement_equals_the_plain_greedy():
    """plan_offsets looks collisions up per step; it must place exactly as the definition does."""
    from optcli.passes.plan_memory import plan_offsets

    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(1, 60))
        firsts = rng.integers(-1, 40, n)
        lifetimes = {f"v{i}": (int(a), int(a + rng.integers(0, 12))) for i, a in enumerate(firsts)}
        sizes = {k: int(rng.integers(1, 5000)) for k in lifetimes}
        assert plan_offsets(lifetimes, sizes) == _quadratic_reference(lifetimes, sizes), trial
