"""Shared test helpers: build one-node ONNX models, run onnxruntime and our kernels, compare."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from optcli.ops import kernels_for
from optcli.tolerance import describe_mismatch, within
from optcli.verify import onnxruntime_session

OPSET = 17


def single_node_model(
    op_type: str,
    inputs: dict[str, np.ndarray],
    n_outputs: int = 1,
    attrs: dict | None = None,
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = OPSET,
    input_names: list[str] | None = None,
) -> onnx.ModelProto:
    """A model with one node.  ``inputs`` become graph inputs, ``initializers`` constants.

    ``input_names`` gives the node's input order (use "" for an absent optional input);
    by default graph inputs then initializers, in dict order.
    """
    initializers = initializers or {}
    names = input_names if input_names is not None else list(inputs) + list(initializers)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return onnxruntime_session(model, opts).run(None, feeds)


def run_variants(op_type: str, inputs: list, attrs: dict, domain: str = "") -> dict[str, list[np.ndarray]]:
    """Run every registered variant of an op directly (ignores ``applies``)."""
    return {k.variant: k.fn([None if x is None else np.asarray(x) for x in inputs], dict(attrs))
            for k in kernels_for(op_type, domain)}


def gelu_ref(y: np.ndarray, tanh: bool = False) -> np.ndarray:
    """GELU in float64 from the standard library's erfc, independent of optcli's erf: x * Phi(x), or
    the tanh form 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), written as x / (1 + exp(-2u))
    so that the negative tail does not cancel (1 + tanh(u) does, even in float64)."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if tanh:
            return y / (1.0 + np.exp(-2.0 * np.sqrt(2.0 / np.pi) * (y + 0.044715 * y ** 3)))
        return y * 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-y / math.sqrt(2.0))


def assert_close(actual, expected, precision: str = "fp32", what: str = "") -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    if not within(actual, expected, precision):
        raise AssertionError(f"{what}: {describe_mismatch(actual, expected, precision)}")


def run_cli(main, prog: str, args: list[str], capsys) -> tuple[int, str, str]:
    """Run a console entry point (``opt_main``, ``optcli_main``) in-process with ``args``:
    (exit code, stdout, stderr).  Exit codes are the CLI's own (``_run_cli`` always exits)."""
    import sys

    import pytest

    old = sys.argv
    sys.argv = [prog, *args]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_matches(got, expected, what: str = "") -> None:
    """Same dtype and shape; floats within the fp32 budget, everything else exactly equal."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if expected.dtype.kind == "f":
        assert_close(got, expected, what=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)
