"""Concurrency and load: threads get correct answers; 10,000 runs leak neither host nor device memory.

Each thread feeds its own input and checks its own expected output, so answers crossing between
threads (a shared buffer, a shared queue) would show.  One predictor shared by threads is safe:
``Predictor.run`` holds the predictor's lock for the whole run, so calls serialise.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import optcli
from optcli.zoo import build

THREADS, RUNS = 4, 500
SHAPE = (1, 3, 16, 16)
TARGETS = ["arm", pytest.param("opencl,arm", marks=pytest.mark.opencl)]


@pytest.fixture(scope="module")
def plans() -> dict[str, bytes]:
    m = build("dynamic_cnn")
    return {t: optcli.optimize(model=m, valid_targets=t, input_shapes="input:1,3,16,16",
                               disabled_passes={"keep_small_islands_on_host"}).data for t in ("arm", "opencl,arm")}


def _load(data: bytes, targets: str):
    """A GPU plan loads with require_gpu=True: a CPU fallback would make these tests prove nothing."""
    return optcli.load(data, require_gpu=targets != "arm")


def _cases(data: bytes, targets: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (input, expected output) per thread, the expectation from a lone predictor."""
    p = _load(data, targets)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(THREADS)]
    return [(x, p.run({"input": x})["output"]) for x in xs]


def _hammer(predictors, cases) -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def work(k: int) -> None:
        p, (x, want) = predictors[k], cases[k]
        barrier.wait()
        try:
            for i in range(RUNS):
                got = p.run({"input": x})["output"]
                if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                    errors.append(f"thread {k} run {i}: wrong answer (max error {np.abs(got - want).max()})")
                    return
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


@pytest.mark.parametrize("targets", TARGETS)
def test_one_predictor_per_thread(plans, targets):
    cases = _cases(plans[targets], targets)
    predictors = [_load(plans[targets], targets) for _ in range(THREADS)]
    if targets != "arm":
        assert all(p.gpu is not None for p in predictors)
    assert _hammer(predictors, cases) == []


@pytest.mark.parametrize("targets", TARGETS)
def test_one_predictor_shared_by_threads(plans, targets):
    cases = _cases(plans[targets], targets)
    shared = _load(plans[targets], targets)
    assert _hammer([shared] * THREADS, cases) == []


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _device_state(p) -> tuple:
    """What a predictor holds on the device: buffers, weights, temporaries and their bytes."""
    g = p.gpu
    if g is None:
        return ()
    return (len(g.buffers), g.device_bytes, len(g.ctx.weights), g.ctx.weight_bytes, len(g.ctx.temps), len(g._keep))


@pytest.mark.parametrize("targets, runs", [("arm", 10_000),
                                           pytest.param("opencl,arm", 10_000, marks=pytest.mark.opencl)])
def test_soak_no_memory_growth(plans, targets, runs):
    p = _load(plans[targets], targets)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    want = p.run({"input": x})["output"]
    for _ in range(500):  # warm-up: allocator pools, caches, lazily built kernels
        p.run({"input": x})
    gc.collect()
    rss0, device0 = _rss_bytes(), _device_state(p)
    start = time.perf_counter()
    for i in range(runs):
        out = p.run({"input": x})["output"]
        if i % 1000 == 0:
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    elapsed = time.perf_counter() - start
    gc.collect()
    growth = _rss_bytes() - rss0
    print(f"{targets}: {runs} runs in {elapsed:.1f} s, RSS growth {growth / 1e6:.2f} MB")
    # On PoCL device buffers live in host memory, so the RSS bound covers the device's too.
    assert growth < 8 << 20, f"host memory grew by {growth / 1e6:.1f} MB over {runs} runs"
    assert _device_state(p) == device0, "device allocations changed across runs"
    assert (p.gpu is not None) == (targets != "arm")
