"""Load is bounded (issue 12 item 3): nothing is executed at load, what a load allocates follows
the file's size (not the sizes the file declares), and one file cannot make a load build programs
without bound.  The documented bound (docs/security.md) is checked here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, TargetError, UsageError
from optcli.runtime.opencl import steps as opencl_steps
from tests.reliability.nbfuzz import alloc_bound

KEEP_ON_GPU = {"keep_small_islands_on_host"}
LOAD_S = 5.0  # generous on a loaded 2-core CI machine; each of these loads takes well under a second


def _plan(nodes, inputs, inits=(), outputs=("y",)) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data


def _six_gb_input() -> bytes:
    return _plan([helper.make_node("Relu", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32768, 16384])])


def _timed_load(data: bytes, **kwargs):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        p = optcli.load(data, **kwargs)
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < LOAD_S, f"load took {elapsed:.2f} s"
    # The reader's bound, plus a fixed allowance for the runtime's derivation and the device set-up.
    assert peak <= alloc_bound(len(data)) + (8 << 20), f"load of {len(data)} bytes allocated {peak} bytes"
    return p


_RSS_PROBE = """
import json, resource, sys, time
import optcli
from onnx import TensorProto, helper
warm = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
warm = optcli.optimize(model=helper.make_model(warm, opset_imports=[helper.make_opsetid("", 17)]),
                       valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"}).data
optcli.load(warm)  # imports, the device and its smoke test: not the load being measured
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
p = optcli.load(data)
print(json.dumps({"seconds": time.perf_counter() - start, "grew_kib": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss - before, "gpu": p.gpu is not None}))
"""


def test_a_small_file_declaring_a_6_gb_input_loads_fast_in_little_memory(tmp_path, opencl_device):
    """The old check ran the plan on zeros at load: np.zeros of 6 GB, killed at 10 GiB."""
    data = _six_gb_input()
    assert len(data) < 2500
    path = tmp_path / "six_gb.nb"
    path.write_bytes(data)
    probe = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    measured = json.loads(probe.stdout.strip().splitlines()[-1])
    assert measured["seconds"] < LOAD_S and measured["gpu"]
    assert measured["grew_kib"] < 64 * 1024, f"peak RSS grew {measured['grew_kib']} KiB during load"
    p = _timed_load(data)
    assert p.gpu is not None and not p.gpu.buffers  # 6 GB of buffers: bound at the first run, not at load
    with pytest.raises(InputError, match="dim 2 must be 32768"):
        p.run({"x": np.zeros((1, 3, 4, 4), np.float32)})


@pytest.mark.parametrize("case", ["Expand", "MatMul", "Add", "constant Expand"])
def test_plans_opt_writes_that_broadcast_to_65536_squared_load(case, opencl_device):
    """...and deriving their shapes computes nothing large: a constant Expand to 65536 x 65536 (opt
    leaves it unfolded) is sized by onnx's inference, never evaluated."""
    f32 = TensorProto.FLOAT
    if case == "constant Expand":
        data = _plan([helper.make_node("Expand", ["c", "shape"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])],
                     [helper.make_tensor_value_info("x", f32, [1, 65536])],
                     [numpy_helper.from_array(np.ones((1, 1), np.float32), "c"),
                      numpy_helper.from_array(np.array([65536, 65536], np.int64), "shape")])
    elif case == "Expand":
        data = _plan([helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
                     [helper.make_tensor_value_info("x", f32, [1, 1])],
                     [numpy_helper.from_array(np.array([65536, 65536], np.int64), "shape")])
    else:
        data = _plan([helper.make_node(case, ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                     [helper.make_tensor_value_info("a", f32, [65536, 1]),
                      helper.make_tensor_value_info("b", f32, [1, 65536])])
    p = _timed_load(data, require_gpu=True)
    assert not p.gpu.buffers  # 16 GB of activations: nothing allocated at load


def test_a_loop_of_a_trillion_iterations_beside_a_gpu_conv_loads_in_bounded_time(opencl_device):
    def scalar(name: str, elem: int):
        return helper.make_tensor_value_info(name, elem, [])

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])],
        "body",
        [scalar("i", TensorProto.INT64), scalar("cond", TensorProto.BOOL), scalar("v", TensorProto.FLOAT)],
        [scalar("cond_out", TensorProto.BOOL), scalar("v_out", TensorProto.FLOAT)])
    inits = [numpy_helper.from_array(np.ones((4, 4, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.array(10**12, np.int64), "trips"),
             numpy_helper.from_array(np.array(0, np.float32), "v0"),
             numpy_helper.from_array(np.array(1, np.float32), "one")]
    data = _plan([helper.make_node("Loop", ["trips", "", "v0"], ["count"], body=body),
                  helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])], inits, outputs=("y", "count"))
    p = _timed_load(data, require_gpu=True)
    assert any(s.op_type == "Conv" and s.target == "opencl" for s in p.plan.steps)


def _two_programs() -> bytes:
    return _plan([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])])


def test_programs_beyond_the_cap_run_the_gpu_steps_on_the_cpu(monkeypatch, optcli_notices, opencl_device):
    data = _two_programs()
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    assert len(optcli.load(data, require_gpu=True).gpu.programs) >= 2
    monkeypatch.setattr(opencl_steps, "MAX_PROGRAMS", 1)
    monkeypatch.setattr("optcli.runtime.predictor._WARNED", set())
    p = optcli.load(data)
    assert p.gpu is None
    assert any("more than 1 distinct programs" in n for n in optcli_notices())
    np.testing.assert_allclose(p.run({"x": x})["y"], 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)
    with pytest.raises(TargetError, match="more than 1 distinct programs"):
        optcli.load(data, require_gpu=True)


def test_steps_differing_only_in_a_float_attribute_build_a_bounded_number_of_programs(tmp_path, monkeypatch,
                                                                                       opencl_device):
    """100 LeakyRelu steps, each with its own alpha: the load builds at most MAX_PROGRAMS programs
    (once alphas are kernel arguments, one), and the result is right wherever it runs."""
    monkeypatch.setenv("OPTCLI_CACHE_DIR", str(tmp_path))  # a cold binary cache: every program is built
    monkeypatch.setattr(opencl_steps, "MAX_PROGRAMS", 8)
    nodes, previous = [], "x"
    for i in range(100):
        nodes.append(helper.make_node("LeakyRelu", [previous], [f"l{i}"], alpha=0.5 + i / 1000))
        previous = f"l{i}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    data = _plan(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])])
    builds = opencl_device.builds
    p = optcli.load(data)
    assert opencl_device.builds - builds <= 8
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    expected = x.astype(np.float64)
    for i in range(100):
        expected = np.where(expected >= 0, expected, expected * np.float32(0.5 + i / 1000))
    np.testing.assert_allclose(p.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-30)


def test_random_data_for_an_absurd_declared_input_is_a_usage_error(tmp_path, capsys):
    """``optcli bench`` makes up inputs from the declared shapes: never 6 GB of them (exit 2)."""
    from optcli.commands.common import random_inputs
    from tests.commands.conftest import cli

    data = _six_gb_input()
    with pytest.raises(UsageError, match="more than the .* optcli makes up; give the input as a file"):
        random_inputs(optcli.load(data, targets="arm"))
    (tmp_path / "six_gb.nb").write_bytes(data)
    code, _, err = cli(["bench", str(tmp_path / "six_gb.nb"), "--runs=1", "--warmup=0", "--targets=arm"], capsys)
    assert code == 2 and "give the input as a file" in err
