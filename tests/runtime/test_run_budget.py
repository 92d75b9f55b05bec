"""A run a file cannot make endless (issue 23, part 4b): a fallback ``Loop`` of 10**12 iterations
ends with ``RunLimitError`` at its iteration cap, at the run's deadline (``timeout_s=``,
``optcli run --timeout``), or when cancelled from another thread; the predictor stays usable."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import Cancelled, RunLimitError, UsageError
from optcli.ops import reference
from tests.commands.conftest import cli


def _endless_loop(trips: int = 10**12) -> onnx.ModelProto:
    """y = x + trips, one Add per iteration, in a Loop whose trip count is a constant."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(1, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body, name="endless")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(trips, np.int64), "M"), numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def endless():
    data = optcli.optimize(model=_endless_loop(), valid_targets="arm").data
    assert len(data) < 4096, "a small file"
    return data


X = {"x": np.zeros(4, np.float32)}


def _ends_within(seconds: float, fn) -> BaseException | None:
    """Run ``fn`` in a daemon thread; fail (rather than hang the suite) when it is still running after
    ``seconds``; return what it raised."""
    raised: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s: the endless Loop was not stopped"
    return raised[0] if raised else None


def test_a_deadline_ends_an_endless_loop(endless):
    p = optcli.load(endless)
    exc = _ends_within(2.0, lambda: p.run(X, timeout_s=0.5))
    assert isinstance(exc, RunLimitError)
    assert "longer than timeout_s=0.5 s; it stopped in a Loop's iteration" in str(exc)
    with pytest.raises(UsageError, match="timeout_s"):
        p.run(X, timeout_s=-1)


def test_the_iteration_cap_ends_it(endless, monkeypatch):
    monkeypatch.setattr(reference, "MAX_LOOP_ITERATIONS", 2000)
    p = optcli.load(endless)
    exc = _ends_within(10.0, lambda: p.run(X))
    assert isinstance(exc, RunLimitError) and "a Loop runs more than 2000 iterations" in str(exc)
    short = optcli.load(optcli.optimize(model=_endless_loop(trips=1500), valid_targets="arm").data)
    np.testing.assert_array_equal(short.run(X)["y"], np.full(4, 1500, np.float32))  # under the cap it runs


def test_cancel_ends_it_and_the_predictor_stays_usable(endless, monkeypatch):
    p = optcli.load(endless)
    threading.Timer(0.3, p.cancel).start()
    exc = _ends_within(2.0, lambda: p.run(X))
    assert isinstance(exc, Cancelled) and "cancelled" in str(exc)
    monkeypatch.setattr(reference, "MAX_LOOP_ITERATIONS", 100)
    with pytest.raises(RunLimitError):  # the next run is not cancelled: it runs to the cap
        p.run(X)


def test_optcli_run_timeout_exits_2_in_one_line(endless, tmp_path, capsys):
    nb = tmp_path / "endless.nb"
    nb.write_bytes(endless)
    np.save(tmp_path / "x.npy", X["x"])
    start = time.perf_counter()
    code, _, err = cli(["run", str(nb), "--input", f"x={tmp_path / 'x.npy'}", "--timeout", "0.5"], capsys)
    assert code == 2 and time.perf_counter() - start < 5
    assert len(err.strip().splitlines()) == 1 and "timeout_s=0.5" in err
