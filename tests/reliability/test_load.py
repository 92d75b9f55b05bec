"""Concurrency and load: threads get correct answers; 10,000 runs leak neither host nor device memory.

Each thread feeds its own input and checks its own expected output, so answers crossing between
threads (a shared buffer, a shared queue) would show.  One predictor shared by threads is safe:
``Predictor.run`` holds the predictor's lock for the whole run, so calls serialise.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


# The soak runs in a fresh interpreter: RSS measured inside the test process also counts the heap
# that thousands of earlier tests left fragmented, and it grew 10-13 MB there in two CI runs while a
# lone run grew 0.0 MB.  The child samples RSS at checkpoints; a leak grows with the runs in every
# interval, warm-up (allocator pools, lazily built kernels) does not.
SOAK_CHILD = r"""
import json, os, sys, gc
import numpy as np
import optcli

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def device_state(p):
    g = p.gpu
    if g is None:
        return []
    return [len(g.buffers), g.device_bytes, len(g.ctx.weights), g.ctx.weight_bytes, len(g.ctx.temps), len(g._keep)]

path, targets, runs, checkpoints = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = optcli.load(path, require_gpu=targets != "arm")
x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
want = p.run({"input": x})["output"]
for _ in range(500):
    p.run({"input": x})
gc.collect()
device0, samples, worst = device_state(p), [rss()], 0.0
for c in range(checkpoints):
    for _ in range(runs // checkpoints):
        out = p.run({"input": x})["output"]
    worst = max(worst, float(np.max(np.abs(out - want))))
    gc.collect()
    samples.append(rss())
print(json.dumps({"rss": samples, "device_same": device_state(p) == device0, "worst": worst,
                  "on_gpu": p.gpu is not None}))
"""


@pytest.mark.parametrize("targets, runs", [("arm", 10_000),
                                           pytest.param("opencl,arm", 10_000, marks=pytest.mark.opencl)])
def test_soak_no_memory_growth(plans, targets, runs, tmp_path):
    path = tmp_path / "soak.nb"
    path.write_bytes(plans[targets])
    checkpoints = 4
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SOAK_CHILD, str(path), targets, str(runs), str(checkpoints)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    rss = got["rss"]
    steps = [b - a for a, b in zip(rss, rss[1:])]
    print(f"{targets}: {runs} runs in {time.perf_counter() - start:.1f} s, RSS growth per "
          f"{runs // checkpoints} runs (MB): {[round(s / 1e6, 2) for s in steps]}")
    assert got["worst"] <= 1e-5, f"answers drifted across runs (max error {got['worst']})"
    # On PoCL device buffers live in host memory, so the RSS bound covers the device's too.  A leak of
    # 200 bytes per run grows every interval by 0.5 MB: the last half must not grow by more than that.
    late = rss[-1] - rss[checkpoints // 2]
    assert late < 1 << 20, f"host memory grew by {late / 1e6:.2f} MB over the last {runs // 2} runs: {steps}"
    assert rss[-1] - rss[0] < 8 << 20, f"host memory grew by {(rss[-1] - rss[0]) / 1e6:.1f} MB over {runs} runs"
    assert got["device_same"], "device allocations changed across runs"
    assert got["on_gpu"] == (targets != "arm")
