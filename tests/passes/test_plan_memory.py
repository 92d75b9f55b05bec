"""Memory planning: lifetimes, greedy-by-size offsets that never overlap while alive."""

from __future__ import annotations

import itertools

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
