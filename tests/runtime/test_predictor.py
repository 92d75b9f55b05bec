"""Predictor: input checks, list inputs, dynamic shapes, threads (the Paddle Lite facade: test_paddle_api.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import optcli
from optcli.errors import InputError, UsageError
from optcli.zoo import build, sample_inputs
from tests.helpers import assert_close


@pytest.fixture(scope="module")
def dynamic():
    model = build("dynamic_cnn")
    return model, optcli.load(optcli.optimize(model=model).data)


def test_describes_inputs_and_outputs(small_nb):
    p = optcli.load(small_nb)
    assert [i.name for i in p.inputs] == ["input"]
    assert p.inputs[0].shape == (1, 3, 32, 32) and p.inputs[0].dtype == "float32"
    assert p.outputs[0].name == "output"


def test_dict_list_and_array_inputs_agree(small_nb, small_cnn):
    p = optcli.load(small_nb)
    x = small_cnn[2]["input"]
    a = p.run({"input": x})["output"]
    np.testing.assert_array_equal(a, p.run([x])["output"])
    np.testing.assert_array_equal(a, p.run(x)["output"])


@pytest.mark.parametrize("feeds, message", [
    ({"image": np.zeros((1, 3, 32, 32), np.float32)}, "unknown 'image'.*missing 'input'"),
    ({"input": np.zeros((1, 3, 32, 32), np.float64)}, "dtype float64.*astype"),
    ({"input": np.zeros((1, 3, 32), np.float32)}, "rank 3"),
    ({"input": np.zeros((1, 3, 32, 31), np.float32)}, "dim 3 must be 32"),
    ([np.zeros(1), np.zeros(1)], "got 2 inputs"),
])
def test_wrong_inputs_are_clear_errors(small_nb, feeds, message):
    with pytest.raises(InputError, match=message):
        optcli.load(small_nb).run(feeds)


def test_dynamic_dims_accept_any_fitting_shape_and_replan_per_shape(dynamic):
    model, p = dynamic
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, size in [(1, 32), (3, 20), (1, 32)]:
        feeds = sample_inputs(model, batch=batch, spatial=size)
        assert_close(p.run(feeds)["output"], sess.run(None, feeds)[0], what=f"{batch}x{size}")
    plan32 = p.memory_plan({"input": (1, 3, 32, 32)})
    plan20 = p.memory_plan({"input": (3, 3, 20, 20)})
    assert plan32 is not None and plan20 is not None and len(p._shape_plans) == 2
    assert plan32.arena_bytes <= plan32.naive_bytes


def test_symbolic_dims_must_agree_across_inputs():
    from onnx import TensorProto, helper

    node = helper.make_node("Add", ["a", "b"], ["c"])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 2]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    p = optcli.load(optcli.optimize(model=model).data)
    with pytest.raises(InputError, match="'N' is 2 in input 'a'"):
        p.run({"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 2), np.float32)})


def test_threads_and_precision_arguments(small_nb, small_cnn):
    p = optcli.load(small_nb, threads=1)
    assert p.run(small_cnn[2])["output"].shape == (1, 10)
    with pytest.raises(UsageError, match="threads"):
        optcli.load(small_nb, threads=0)
    with pytest.raises(UsageError, match="precision 'fp8'"):
        optcli.load(small_nb, precision="fp8")


def test_outputs_are_writable_copies(small_nb, small_cnn):
    out = optcli.load(small_nb).run(small_cnn[2])["output"]
    out[...] = 0  # must not raise, must not alias weights


def test_threads_bound_blas_during_run(small_nb, small_cnn, monkeypatch):
    from threadpoolctl import threadpool_info

    seen = []
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    p = optcli.load(small_nb, threads=1)
    original = p._executor.run

    def spy(*args, **kwargs):
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        return original(*args, **kwargs)

    monkeypatch.setattr(p._executor, "run", spy)
    p.run(small_cnn[2])
    assert seen and all(n == 1 for n in seen)
    after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert after == before, "the run's thread limit must be undone when it returns"


@pytest.mark.parametrize("threads", [1, 3])
def test_threads_bound_the_native_pool_during_run(small_nb, small_cnn, monkeypatch, threads):
    """The native pool runs at the predictor's size during a run and goes back to its own after it
    (its setter gives the size it replaced: one call a run where no change is needed)."""
    from optcli import native

    if not native.available():
        pytest.skip(native.status())
    before = native.get_num_threads()
    p = optcli.load(small_nb, threads=threads)
    original, seen = p._executor.run, []

    def spy(*args, **kwargs):
        seen.append(native.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(p._executor, "run", spy)
    p.run(small_cnn[2])
    p.run(small_cnn[2])
    assert seen == [threads, threads]
    assert native.get_num_threads() == before, "the run's pool size must be undone when it returns"


def test_the_thread_limit_reads_each_library_as_threadpoolctl_does():
    """The limiter calls each library's own get-threads function, looked up once (threadpoolctl
    looks it up by name on every call): it must read what threadpoolctl reads, before and after a
    change, for every library threadpoolctl finds (OpenBLAS, the native pool).  A library with no
    getter (the native pool) is read through its setter, which must give the size it replaced."""
    from threadpoolctl import ThreadpoolController

    from optcli.runtime.predictor import _fast_getter, _fast_setter

    controllers = ThreadpoolController().lib_controllers
    assert controllers
    for c in controllers:
        get = _fast_getter(c)
        before = c.get_num_threads()
        if get is None:
            swap, want = _fast_setter(c), 1 if before != 1 else 2
            try:
                assert swap(want) == before and c.get_num_threads() == want, c.internal_api
                assert swap(before) == want and c.get_num_threads() == before, c.internal_api
            finally:
                c.set_num_threads(before)
            continue
        assert get() == before, c.internal_api
        c.set_num_threads(1 if before != 1 else 2)
        try:
            assert get() == c.get_num_threads() != before, c.internal_api
        finally:
            c.set_num_threads(before)


def test_the_thread_limit_sets_each_library_as_threadpoolctl_does():
    """The limiter's setters (the libraries' own functions, looked up once) leave each library where
    threadpoolctl's setter would, and OpenBLAS's respects threadpoolctl's controlling thread: from a
    thread that does not control OpenBLAS while another live one does, nothing changes."""
    import threading

    from threadpoolctl import ThreadpoolController

    from optcli.runtime.predictor import _fast_setter

    controllers = ThreadpoolController().lib_controllers
    assert controllers
    for c in controllers:
        before = c.get_num_threads()
        want = 1 if before != 1 else 2
        try:
            _fast_setter(c)(want)
            assert c.get_num_threads() == want, c.internal_api
        finally:
            c.set_num_threads(before)
        assert c.get_num_threads() == before
    blas = [c for c in controllers if c.internal_api == "openblas" and c.threading_layer != "openmp"]
    shared = getattr(type(blas[0]), "_SHARED_STATE", None) if blas else None
    if shared is None:
        return  # no OpenBLAS pool here, or a threadpoolctl without a controlling thread
    c, held, done = blas[0], threading.Event(), threading.Event()

    def control():  # another thread takes control of OpenBLAS and stays alive meanwhile
        c.set_num_threads(c.get_num_threads())
        held.set()
        done.wait(10)

    type(c).clear_controlling_thread(force=True)  # (this thread took control in earlier runs)
    owner = threading.Thread(target=control)
    owner.start()
    try:
        held.wait(10)
        assert shared.controlling_thread is owner
        before = c.get_num_threads()
        _fast_setter(c)(1 if before != 1 else 2)
        assert c.get_num_threads() == before, "set from a thread that does not control OpenBLAS"
    finally:
        done.set()
        owner.join()
        type(c).clear_controlling_thread(force=True)


def test_replacing_the_bound_kernels_after_a_run_takes_effect(small_nb, small_cnn):
    """The executor works out its loop once; ``optcli bench`` swaps ``fns`` to time each step, which
    must re-derive it, also after runs have happened."""
    p = optcli.load(small_nb)
    p.run(small_cnn[2])
    calls = []

    def counted(fn):
        return lambda args: calls.append(1) or fn(args)

    p._executor.fns = [counted(fn) for fn in p._executor.fns]
    expected = p.run(small_cnn[2])["output"]
    assert len(calls) == len(p.plan.steps)
    np.testing.assert_array_equal(expected, p.run(small_cnn[2])["output"])


def test_the_fast_input_path_takes_exact_feeds_only(small_nb, small_cnn, monkeypatch):
    """run() skips the full checks only for exactly the declared numpy arrays (issue 25's per-call
    cost); anything else (a subclass, a view of other strides, extra keys, a tuple of the wrong length)
    goes through ``_check_inputs``, which still says what is wrong."""
    p = optcli.load(small_nb)
    x = small_cnn[2]["input"]
    slow = []
    check = p._check_inputs
    monkeypatch.setattr(p, "_check_inputs", lambda feeds: slow.append(1) or check(feeds))
    want = p.run([x])["output"]
    assert slow == []
    p.run({"input": x}), p.run((x,))
    assert slow == []
    fortran = np.asfortranarray(x)
    np.testing.assert_array_equal(p.run([fortran])["output"], want)  # exact dtype and shape: fast, still right
    p.run(x)  # a bare array: the full path wraps it
    assert slow == [1]
    with pytest.raises(InputError, match="unknown 'extra'"):
        p.run({"input": x, "extra": x})
    with pytest.raises(InputError, match="dtype float64"):
        p.run([x.astype(np.float64)])
    with pytest.raises(InputError, match="got 2 inputs"):
        p.run((x, x))
    assert len(slow) == 4


def test_dynamic_dims_skip_the_checks_for_feeds_like_the_last_accepted(monkeypatch):
    """A plan with a symbolic dim checks a feed fully once per (dtype, shape) signature in a row:
    the same signature again takes the fast path; a new shape, a dim that disagrees between two
    inputs or another dtype goes through ``_check_inputs``, which still refuses what is wrong."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"])], "dyn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 3]) for n in ("x", "y")],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    p = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    slow = []
    check = p._check_inputs
    monkeypatch.setattr(p, "_check_inputs", lambda feeds: slow.append(1) or check(feeds))
    for rows, checks in ((2, 1), (2, 1), (5, 2), (5, 2), (2, 3)):
        x, y = (np.full((rows, 3), v, np.float32) for v in (1.0, 2.0))
        np.testing.assert_array_equal(p.run({"x": x, "y": y})["z"], np.full((rows, 3), 3.0, np.float32))
        assert len(slow) == checks, f"{rows} rows: {len(slow)} full checks, expected {checks}"
    with pytest.raises(InputError, match="dims with one name must agree"):
        p.run({"x": np.zeros((2, 3), np.float32), "y": np.zeros((4, 3), np.float32)})
    with pytest.raises(InputError, match="dtype float64"):
        p.run({"x": np.zeros((2, 3)), "y": np.zeros((2, 3))})
    with pytest.raises(InputError, match="unknown 'extra'"):
        p.run({"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32), "extra": 1})
