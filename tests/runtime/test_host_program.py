"""A host plan's steps as one generated function (optcli/runtime/host/program.py): the same results,
errors, stops, progress and memory as the executor's loop, which GPU plans and first runs keep."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

import optcli
from optcli.errors import Cancelled, KernelError
from optcli.runtime.executor import Executor
from optcli.runtime.host.steps import StepError


def _chain_nb(n: int = 6, dims=(2, 3)) -> bytes:
    """x -> Relu -> Neg -> ... (n steps, nothing to fuse) -> y, and a second output from step 1."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Neg" if i % 2 else "Sqrt" if i == 2 else "Relu", [prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes.append(helper.make_node("Add", [prev, "w"], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims)),
                               helper.make_tensor_value_info("t1", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor("w", TensorProto.FLOAT, [dims[-1]], [0.5] * dims[-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets="arm").data


def _loop_results(p, feeds):
    """The outputs through the executor's loop (a fresh Executor whose straight-line function is off)."""
    ex = Executor(p.plan)
    ex._straight = None
    return ex.run(feeds)


def test_a_host_plan_runs_as_one_function_with_the_loops_results():
    p = optcli.load(_chain_nb(), threads=1)
    x = np.array([[1.0, -4.0, 9.0], [0.0, 16.0, -1.0]], np.float32)
    got = p.run({"x": x})
    assert callable(p._executor._straight), "the host plan kept the loop"
    want = _loop_results(p, {"x": x})
    assert got.keys() == want.keys() == {"y", "t1"}
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_array_equal(got["t1"], -np.maximum(x, 0))


def test_replaced_kernels_are_compiled_again():
    p = optcli.load(_chain_nb(), threads=1)
    feeds = {"x": np.ones((2, 3), np.float32)}
    p.run(feeds)
    calls = []

    def counted(fn):
        return lambda args: calls.append(1) or fn(args)

    p._executor.fns = [counted(fn) for fn in p._executor.fns]
    p.run(feeds)
    assert len(calls) == len(p.plan.steps)


def test_a_kernels_exception_names_its_step_as_the_loop_did():
    p = optcli.load(_chain_nb(), threads=1)
    feeds = {"x": np.ones((2, 3), np.float32)}
    p.run(feeds)
    fns = list(p._executor.fns)

    def broken(args):
        raise ValueError("planted")

    fns[3] = broken
    p._executor.fns = fns
    with pytest.raises(KernelError, match=r"step 3 .*crashed: ValueError: planted"):
        p.run(feeds)
    fns[3] = lambda args: []  # no outputs where the model uses one
    p._executor.fns = fns
    with pytest.raises(StepError, match=r"step 3 .*gave 0 outputs, the model uses 1"):
        p.run(feeds)


def test_a_value_is_freed_after_its_last_reader():
    """The generated function drops each value where the memory plan says, as the loop popped it:
    step 0's output is gone while step 4 runs."""
    p = optcli.load(_chain_nb(), threads=1)
    feeds = {"x": np.ones((2, 3), np.float32)}
    p.run(feeds)
    fns, refs, alive = list(p._executor.fns), [], []

    def keep_ref(fn):
        def run(args):
            outs = fn(args)
            refs.append(weakref.ref(outs[0]))
            return outs
        return run

    def look(fn):
        def run(args):
            gc.collect()
            alive.append(refs[0]() is not None)
            return fn(args)
        return run

    fns[0], fns[4] = keep_ref(fns[0]), look(fns[4])
    p._executor.fns = fns
    p.run(feeds)
    assert alive == [False]


def test_a_cancel_stops_between_generated_steps_and_progress_sees_the_step():
    p = optcli.load(_chain_nb(), threads=1)
    feeds = {"x": np.ones((2, 3), np.float32)}
    p.run(feeds)
    fns, started, seen = list(p._executor.fns), threading.Event(), []
    from optcli.progress import current_op

    def slow(fn):
        def run(args):
            started.set()
            time.sleep(0.3)
            return fn(args)
        return run

    fns[2] = slow(fns[2])
    p._executor.fns = fns
    runner = threading.current_thread().ident

    def cancel():
        started.wait(5)
        seen.append(current_op(runner))
        p.cancel()

    t = threading.Thread(target=cancel)
    t.start()
    with pytest.raises(Cancelled, match="before step 3"):
        p.run(feeds)
    t.join()
    assert seen and seen[0] and seen[0].startswith(p.plan.steps[2].op_type)


def test_plans_the_function_cannot_take_keep_the_loop(monkeypatch):
    """A first run of a new shape records sizes through the loop; later runs take the function."""
    from onnx import helper as h

    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    data = optcli.optimize(model=h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), valid_targets="arm").data
    p = optcli.load(data, threads=1)
    p.run({"x": np.ones((2, 3), np.float32)})
    assert p._executor._straight is False  # the recording run used the loop
    y = p.run({"x": -np.ones((2, 3), np.float32)})["y"]
    assert callable(p._executor._straight)
    np.testing.assert_array_equal(y, 0)
