"""Shape derivation from input shapes (``optcli.ops.shape_rules``), which placement of dynamic
dims and the runtime's per-shape GPU binding use."""

from __future__ import annotations

import numpy as np

from optcli.ir import Node
from optcli.ops.shape_rules import derive_shapes


def _position_slice():
    """A transformer's position embedding: Slice a [1, 512] table to the sequence length, read
    from the input's shape at run time (onnx's data propagation does not cover Slice)."""
    nodes = [Node("Shape", ["ids"], ["s"]), Node("Gather", ["s", "one"], ["len"], {"axis": 0}),
             Node("Unsqueeze", ["len", "zero1"], ["end"]),
             Node("Slice", ["table", "zero1", "end", "one1"], ["pos"]),
             Node("FullyConnected", ["pos_f", "w"], ["fc"], domain="optcli"),
             Node("Cast", ["pos"], ["pos_f"], {"to": 1})]
    nodes = nodes[:4] + [nodes[5], nodes[4]]
    consts = {"one": np.array(1, np.int64), "zero1": np.array([0], np.int64), "one1": np.array([1], np.int64),
              "table": np.arange(512, dtype=np.int64).reshape(1, 512),
              "w": np.zeros((7, 1000), np.float32)}  # too big to fold: fc is derived, not evaluated
    return nodes, consts


def test_shape_arithmetic_is_evaluated_between_inference_rounds():
    nodes, consts = _position_slice()
    shapes = derive_shapes(nodes, {"ids": ("int64", (2, 7))}, consts, {"": 17}, ["fc"])
    assert shapes["pos"] == (1, 7) and shapes["fc"] == (1, 1000)  # FullyConnected derives as MatMul
    once = derive_shapes(nodes, {"ids": ("int64", (2, 7))}, consts, {"": 17}, ["fc"], rounds=1)
    assert not isinstance(once["pos"][1], int)  # inference alone cannot tell
