"""Merge an explicit ``Pad`` into the ``pads`` attribute of the Conv or pool that reads it.

TensorFlow-style exports (``padding="SAME"`` with asymmetric pads) write a zero ``Pad`` before a
conv; the conv can pad on the fly for free, so the padded copy of the activations is never
materialised.  Only when the merge is exact:

* the Pad is constant mode, its pads are constant, non-negative and touch only spatial axes
  (not batch or channels), and its output has no other reader;
* Conv: pad value 0 and ``auto_pad`` NOTSET;
* AveragePool: pad value 0, ``count_include_pad = 1`` (padded zeros counted, as with a Pad) and
  ``ceil_mode = 0`` (partial windows past the end would be averaged differently);
* MaxPool: pad value -inf, the only value a MaxPool's own padding is equivalent to in general;
  or pad value 0 when the padded tensor is provably non-negative (it comes from a Relu,
  Sigmoid, Clip with min >= 0, ...) and every window still holds at least one real element
  (merged pads smaller than the window, no ceil_mode): then max(window, 0) == max(window).
  ResNet stems (Relu -> Pad -> MaxPool) are exactly this.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Node
from optcli.passes._helpers.graph_queries import (
    consumers,
    drop_values,
    opset,
    remove_nodes,
    scalar_const,
    sole_consumer,
    sync_proto,
)

NAME = "fold_pad_into_conv"
DESCRIPTION = "merge a constant zero Pad on spatial axes into the following Conv/AveragePool/MaxPool pads"


def _pad_spec(graph: Graph, pad: Node) -> tuple[list[int], float] | None:
    """(pads over all axes as [begin..., end...], pad value) of a foldable Pad, else None."""
    if pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
        return None
    if opset(graph) < 11 and not pad.input(1):
        pads = [int(p) for p in pad.attrs.get("pads", [])]
        value = float(pad.attrs.get("value", 0.0))
    else:
        c = graph.const(pad.input(1))
        if c is None:
            return None
        pads = [int(p) for p in c.reshape(-1)]
        value = 0.0
        if pad.input(2):
            v = scalar_const(graph, pad.input(2))
            if v is None:
                return None
            value = v
        if pad.input(3):
            # Opset 18 ``axes``: expand the pads to every axis.
            axes = graph.const(pad.input(3))
            shape = graph.shape_of(pad.input(0))
            if axes is None or shape is None:
                return None
            rank, full = len(shape), [0] * (2 * len(shape))
            for k, axis in enumerate(int(a) % rank for a in axes.reshape(-1)):
                full[axis], full[axis + rank] = pads[k], pads[k + len(axes.reshape(-1))]
            pads = full
    rank = len(pads) // 2
    if rank < 3 or len(pads) != 2 * rank or any(p < 0 for p in pads):
        return None
    if any(pads[i] or pads[i + rank] for i in (0, 1)):
        return None
    return pads, value


_NON_NEGATIVE_OPS = {"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp", "Softplus"}
_NON_NEGATIVE_EPILOGUES = {"relu", "sigmoid", "hard_sigmoid"}


def _non_negative(graph: Graph, name: str) -> bool:
    """Whether value ``name`` is provably >= 0 (by the op or fused epilogue that makes it)."""
    node = graph.producers().get(name)
    if node is None or node.domain not in ("", "ai.onnx", "optcli"):
        return False
    act = node.attrs.get("activation")
    if act in _NON_NEGATIVE_EPILOGUES or (act == "clip" and float(node.attrs.get("activation_alpha", -1)) >= 0):
        return True
    if node.op_type == "Clip":
        low = scalar_const(graph, node.input(1)) if node.input(1) else node.attrs.get("min")
        return low is not None and float(low) >= 0
    return node.op_type in _NON_NEGATIVE_OPS and not act


def _windows_keep_real_elements(reader: Node, pads: list[int]) -> bool:
    a = reader.attrs
    kernel = [int(k) for k in a.get("kernel_shape", [])]
    dil = [int(d) for d in a.get("dilations", [1] * len(kernel))]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    n = len(kernel)
    return (bool(kernel) and not int(a.get("ceil_mode", 0))
            and all(pads[i] < extent[i] and pads[n + i] < extent[i] for i in range(n)))


def _accepts(reader: Node, value: float, non_negative: bool = False) -> bool:
    a = reader.attrs
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return False
    if reader.op_type == "Conv":
        return value == 0.0
    if reader.op_type == "AveragePool":
        return value == 0.0 and int(a.get("count_include_pad", 0)) == 1 and not int(a.get("ceil_mode", 0))
    if reader.op_type == "MaxPool":
        return (value == -np.inf or (value == 0.0 and non_negative)) and not any(reader.outputs[1:])
    return False


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    folded = 0
    for pad in list(graph.nodes):
        if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx"):
            continue
        reader = sole_consumer(graph, consumers(graph), pad.outputs[0])
        if reader is None or reader.domain not in ("", "ai.onnx") or reader.input(0) != pad.outputs[0]:
            continue
        spec = _pad_spec(graph, pad)
        if spec is None or not _accepts(reader, spec[1], _non_negative(graph, pad.input(0))):
            continue
        pads, spatial = spec[0], len(spec[0]) // 2 - 2
        rank = spatial + 2
        old = [int(p) for p in reader.attrs.get("pads", [0] * (2 * spatial))]
        if len(old) != 2 * spatial:
            continue
        merged = [old[i] + pads[2 + i] for i in range(spatial)] + [
            old[spatial + i] + pads[rank + 2 + i] for i in range(spatial)
        ]
        if reader.op_type == "MaxPool" and spec[1] != -np.inf and not _windows_keep_real_elements(reader, merged):
            continue
        reader.attrs["pads"] = merged
        reader.attrs.pop("auto_pad", None)
        reader.inputs[0] = pad.inputs[0]
        sync_proto(reader)
        remove_nodes(graph, pad)
        drop_values(graph, pad.outputs[0])
        folded += 1
    return {"folded": folded}
