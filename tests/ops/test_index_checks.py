"""Gather/scatter-family kernels read and write only the element an index names, or refuse (issue 23,
part 2): an index out of [-dim, dim - 1] is an ``IndexError`` (the executor makes it the input's
``StepError``), one of another dtype than int32/int64 an ``InputError``; never a wrap-around of an
index normalised once (-5 on a dim of 4 read the last element) or a cast (2.9 read element 2,
uint64 2**64-1 the last)."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.errors import InputError
from optcli.ir import Node
from optcli.ops.evaluate import evaluate_node

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def _run(op: str, inputs: list, **attrs):
    node = Node(op, [f"i{k}" for k in range(len(inputs))], ["y"], attrs, "n")
    return evaluate_node(node, inputs, {"": 18})[0]


@pytest.mark.parametrize("op, inputs, attrs", [
    ("Gather", [X, np.array([4])], {"axis": 1}),
    ("Gather", [X, np.array([-5])], {"axis": 1}),
    ("GatherElements", [X, np.full((3, 1), -5)], {"axis": 1}),
    ("GatherElements", [X, np.full((3, 1), 4)], {"axis": 1}),
    ("GatherND", [X, np.array([[0, -5]])], {}),
    ("GatherND", [X, np.array([[3, 0]])], {}),
    ("ScatterElements", [X, np.full((3, 1), -5), np.ones((3, 1), np.float32)], {"axis": 1}),
    ("ScatterND", [X, np.array([[-4]]), np.ones((1, 4), np.float32)], {}),
])
def test_an_index_out_of_range_is_refused(op, inputs, attrs):
    with pytest.raises(IndexError, match="out of range"):
        _run(op, inputs, **attrs)


@pytest.mark.parametrize("index", [np.array([2.9]), np.array([np.uint64(2**64 - 1)]), np.array([1], np.uint8)])
def test_an_index_of_another_dtype_is_refused(index):
    with pytest.raises(InputError, match="int32 or int64"):
        _run("Gather", [X, index], axis=1)


def test_negative_indices_in_range_still_count_from_the_end():
    np.testing.assert_array_equal(_run("Gather", [X, np.array([-1, 0], np.int32)], axis=1), X[:, [3, 0]])
    np.testing.assert_array_equal(_run("GatherElements", [X, np.full((3, 1), -4)], axis=1), X[:, :1])
    np.testing.assert_array_equal(_run("GatherND", [X, np.array([[-1, -1]])]), X[[2], [3]])
    out = _run("ScatterElements", [X, np.full((3, 1), -1), np.zeros((3, 1), np.float32)], axis=1)
    np.testing.assert_array_equal(out[:, 3], 0)
