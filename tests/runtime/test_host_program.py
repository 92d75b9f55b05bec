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


def _shape_arithmetic_nb() -> bytes:
    """x [N, 4] (N dynamic): y = Reshape(x, [N, 2, 2]) + Range(N) (torch's Shape -> Gather ->
    Unsqueeze -> Concat chain and a position Range), and count = Cast(Range(number of x's positive
    elements)) with the count from Shape(NonZero(x > 0)): a shape that follows from x's values."""
    i64 = TensorProto.INT64
    consts = [helper.make_tensor("zero", i64, [], [0]), helper.make_tensor("one", i64, [], [1]),
              helper.make_tensor("axes0", i64, [1], [0]), helper.make_tensor("two_two", i64, [2], [2, 2]),
              helper.make_tensor("fzero", TensorProto.FLOAT, [], [0.0])]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "two_two"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["posf", "target_pos"], ["posr"]),
        helper.make_node("Add", ["r", "posr"], ["y"]),
        helper.make_node("Greater", ["x", "fzero"], ["gt"]),
        helper.make_node("NonZero", ["gt"], ["nz"]),
        helper.make_node("Shape", ["nz"], ["nzs"]),
        helper.make_node("Gather", ["nzs", "one"], ["count"], axis=0),
        helper.make_node("Range", ["zero", "count", "one"], ["upto"]),
        helper.make_node("Cast", ["upto"], ["count_range"], to=TensorProto.FLOAT),
    ]
    consts.append(helper.make_tensor("target_pos", i64, [3], [-1, 1, 1]))
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 2]),
                               helper.make_tensor_value_info("count_range", TensorProto.FLOAT, ["C"])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets="arm").data


def _want_shape_arithmetic(x: np.ndarray) -> dict[str, np.ndarray]:
    n = x.shape[0]
    return {"y": x.reshape(n, 2, 2) + np.arange(n, dtype=np.float32).reshape(-1, 1, 1),
            "count_range": np.arange(int((x > 0).sum()), dtype=np.float32)}


def test_shape_arithmetic_runs_once_per_shape_and_follows_shapes_that_data_decides():
    from optcli.runtime.host.program import shape_derived

    p = optcli.load(_shape_arithmetic_nb(), threads=1)
    plan = p.plan
    derived = shape_derived(plan)
    ops = {plan.steps[k].op_type for k in derived}
    assert ops == {"Gather", "Range", "Cast", "Reshape"}, ops  # (the compiler folds the Concat into a Reshape's shape)
    assert not any(plan.steps[k].inputs[0] in ("x", "r", "gt") for k in derived)  # steps that read x's values
    # the graph output count_range is made every run (the caller gets an array of its own)
    assert not any("count_range" in plan.steps[k].outputs for k in derived)
    calls = []

    def counted(k, fn):
        return lambda args: calls.append(k) or fn(args)

    base = list(p._executor.fns)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 5, 3, 3, 5)]
    xs.append(-np.abs(xs[2]))  # N = 3 again with no positive element: a new NonZero shape, same input shape
    for k, x in enumerate(xs):
        p.run({"x": x})  # a first run of each shape goes through the loop, which records the sizes
        p._executor.fns = [counted(j, fn) for j, fn in enumerate(base)]
        calls.clear()
        for _ in range(2):
            got = p.run({"x": x})
            for name, want in _want_shape_arithmetic(x).items():
                np.testing.assert_array_equal(got[name], want, err_msg=f"run with x {k}: {name}")
            assert got["count_range"].flags.writeable
        # replacing the kernels remakes the function (and its memo): each derived step runs once,
        # on the first of the two runs, the rest of the plan twice
        ran = {j: calls.count(j) for j in set(calls)}
        assert all(ran[j] == 1 for j in derived), (k, ran)
        assert all(n == 2 for j, n in ran.items() if j not in derived), (k, ran)
    # the same function across shapes: each shape made once, then taken from the memo
    p._executor.fns = [counted(j, fn) for j, fn in enumerate(base)]
    for x in xs:
        p.run({"x": x})
    calls.clear()
    for x in xs:
        got = p.run({"x": x})
        for name, want in _want_shape_arithmetic(x).items():
            np.testing.assert_array_equal(got[name], want)
    assert not [j for j in calls if j in derived], "a shape seen before ran its shape arithmetic again"


def test_kept_shape_arithmetic_is_read_only():
    from optcli.runtime.host import program

    memo = program._ShapeMemo()
    small, big = np.arange(4), np.zeros(program.MEMO_BYTES // 4 + 1, np.float32)
    memo.keep(((4,),), (small,))
    assert memo.get(((4,),))[0] is small and not small.flags.writeable
    memo.keep(((5,),), (big,))
    assert memo.get(((5,),)) is None and big.flags.writeable  # too large to keep: made every run
    memo.keep(((6,),), ([1, 2],))
    assert memo.get(((6,),)) is None  # a sequence from the reference fallback: not kept
