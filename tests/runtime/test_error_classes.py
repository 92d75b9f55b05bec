"""Whose fault is it: a kernel crashing on valid input is ours (exit 1, "please report"), an
index out of range in the input data is the user's (exit 2), and `opt` never publishes a `.nb`
its own reader refuses."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import optcli
from optcli import compiler
from optcli.cli import opt_main, optcli_main
from optcli.errors import InternalError, KernelError, OptError
from optcli.runtime import executor
from optcli.runtime.host.steps import StepError
from tests.helpers import run_cli, single_node_model


def _gather_nb() -> bytes:
    m = single_node_model("Gather", {"x": np.zeros((4, 3), np.float32), "i": np.zeros(2, np.int64)})
    return optcli.optimize(model=m, valid_targets="arm").data


def _crash_every_kernel(monkeypatch):
    def bind_step(step, opsets):
        def crash(inputs):
            raise ValueError("operands could not be broadcast together (test)")
        return crash

    monkeypatch.setattr(executor, "bind_step", bind_step)


def test_kernel_crash_on_valid_input_is_an_internal_error(monkeypatch):
    _crash_every_kernel(monkeypatch)
    predictor = optcli.load(_gather_nb())
    with pytest.raises(KernelError, match=r"Gather.*crashed: ValueError.*please report") as exc:
        predictor.run({"x": np.ones((4, 3), np.float32), "i": np.array([0, 1])})
    assert not isinstance(exc.value, OptError) and isinstance(exc.value, InternalError)


def test_index_out_of_range_is_the_inputs_fault():
    predictor = optcli.load(_gather_nb())
    with pytest.raises(StepError, match="index in its input is out of range"):
        predictor.run({"x": np.ones((4, 3), np.float32), "i": np.array([0, 7])})


def test_cli_exit_codes_follow_the_fault(monkeypatch, tmp_path, capsys):
    nb = tmp_path / "g.nb"
    nb.write_bytes(_gather_nb())
    np.save(tmp_path / "x.npy", np.ones((4, 3), np.float32))
    np.save(tmp_path / "bad.npy", np.array([0, 9]))
    np.save(tmp_path / "good.npy", np.array([0, 1]))
    args = [str(nb), "--input", f"x={tmp_path / 'x.npy'}", "--output_dir", str(tmp_path / "out")]
    code, _, err = run_cli(optcli_main, "optcli", ["run", *args, "--input", f"i={tmp_path / 'bad.npy'}"], capsys)
    assert code == 2, err
    _crash_every_kernel(monkeypatch)
    code, _, err = run_cli(optcli_main, "optcli", ["run", *args, "--input", f"i={tmp_path / 'good.npy'}"], capsys)
    assert code == 1 and "internal error" in err and "please report" in err, err


def test_opt_never_writes_what_its_reader_refuses(monkeypatch, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    m = single_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    model.write_bytes(m.SerializeToString())
    real = compiler.to_bytes
    monkeypatch.setattr(compiler, "to_bytes", lambda plan: real(plan)[:-40] + bytes(40))  # a bad checksum
    out = tmp_path / "m.nb"
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={model}", f"--optimize_out={tmp_path / 'm'}"], capsys)
    assert code == 1 and "its own reader refuses" in err and "please report" in err, err
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_negative_dims_reach_the_file_as_symbols(tmp_path, capsys):
    """paddle2onnx writes -1 for "any size", on inputs and outputs: the .nb loads and runs."""
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], np.ones(6, np.float32))
    graph = helper.make_graph([node], "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2])], [w])
    model = tmp_path / "p.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    for extra in ([], ["--input_shapes=x:4,3"]):
        code, _, err = run_cli(opt_main, "opt", [f"--model_file={model}", f"--optimize_out={tmp_path / 'p'}", *extra],
                               capsys)
        assert code == 0, err
        out = optcli.load(tmp_path / "p.nb").run({"x": np.ones((4, 3), np.float32)})["y"]
        np.testing.assert_array_equal(out, np.full((4, 2), 3, np.float32))
