"""Ending a run early (issue 21): ``Predictor.cancel()`` from another thread, and Ctrl-C in the CLI.

Every host wait on the OpenCL device polls (``runtime/opencl/waits.py``), so a run that is waiting
for a long device queue ends within milliseconds of a cancel or a SIGINT, instead of when the
device is done.  The model is a chain of large MatMuls that PoCL takes seconds over; each test
measures a whole run first and judges the early end against it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import Cancelled

ROOT = Path(__file__).resolve().parents[2]
SIZE, LAYERS = 1024, 6


def _chain(layers: int = LAYERS, size: int = SIZE):
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [size, size])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def chain_nb():
    return optcli.optimize(model=_chain(), valid_targets="opencl,arm",
                           disabled_passes={"keep_small_islands_on_host"}).data


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


@pytest.mark.opencl
def test_cancel_from_another_thread_ends_a_device_wait(chain_nb, opencl_device):
    p = optcli.load(chain_nb, require_gpu=True)
    assert all(s.target == "opencl" for s in p.plan.steps if s.op_type == "MatMul")
    x = {"x": np.ones((SIZE, SIZE), np.float32)}
    p.run(x)  # programs built, buffers bound
    first, full = _timed(lambda: p.run(x))
    if full < 0.5:
        pytest.skip(f"{opencl_device.name} runs the chain in {full:.2f} s: too fast to cancel a run mid-way")
    threading.Timer(full * 0.15, p.cancel).start()
    start = time.perf_counter()
    with pytest.raises(Cancelled, match="cancelled"):
        p.run(x)
    early = time.perf_counter() - start
    assert early < full * 0.5, f"cancelled after {full * 0.15:.2f} s, the run ended at {early:.2f} s of {full:.2f} s"
    again, _ = _timed(lambda: p.run(x))  # the predictor is still usable, and right
    np.testing.assert_array_equal(again["y5"], first["y5"])


def test_cancel_between_host_steps_and_with_no_run():
    p = optcli.load(optcli.optimize(model=_chain(layers=40, size=512), valid_targets="arm").data)
    x = {"x": np.ones((512, 512), np.float32)}
    p.cancel()  # no run in progress: nothing happens, the next run is not cancelled
    first, full = _timed(lambda: p.run(x))
    threading.Timer(full * 0.2, p.cancel).start()
    start = time.perf_counter()
    with pytest.raises(Cancelled, match="before step"):
        p.run(x)
    assert time.perf_counter() - start < full * 0.7
    np.testing.assert_array_equal(p.run(x)["y39"], first["y39"])


CHILD = """
import sys
from optcli.cli import optcli_main
sys.argv = ["optcli", "bench", {nb!r}, "--warmup", "0", "--runs", "1000", "--max_secs", "600", "--profile_runs", "0",
            "--device", {device!r}]
print("ready", flush=True)
optcli_main()
"""


@pytest.mark.opencl
def test_sigint_ends_a_gpu_bench_within_2_s_with_exit_130(opencl_device, tmp_path):
    """A chain long enough that the device is still busy seconds after the signal (about 8 s a run on
    PoCL with 2 cores): a wait that did not come back to Python would end only with the run."""
    nb = tmp_path / "chain.nb"
    nb.write_bytes(optcli.optimize(model=_chain(layers=14), valid_targets="opencl,arm",
                                   disabled_passes={"keep_small_islands_on_host"}).data)
    env = {**os.environ, "OPTCLI_CACHE_DIR": str(tmp_path / "cache")}
    # The child starts with SIGINT's default action, whatever this process inherited (a shell's
    # background job ignores SIGINT, and so would its children): Python then raises KeyboardInterrupt.
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD.format(nb=str(nb),
                                                                                  device=opencl_device.name))],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(3.0)  # the load (a second or two): the bench is inside its first run on the device by now
        assert child.poll() is None, child.communicate()
        sent = time.perf_counter()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        took = time.perf_counter() - sent
    finally:
        child.kill()
    assert child.returncode == 130, err
    assert err.strip().splitlines()[-1] == "optcli: interrupted"
    assert took < 2.0, f"the bench ended {took:.2f} s after SIGINT"
