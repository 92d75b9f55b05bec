"""Put each FakeQuant of a pre-quantized model where onnxruntime puts its requantization: in the op.

``fold_qdq`` turns every QuantizeLinear -> DequantizeLinear pair of a QDQ model into an
``optcli.FakeQuant`` step.  onnxruntime runs the same model as QLinearConv / QLinearAdd / ...,
which requantize their result as part of the op, and drops the pairs around ops that only move
values (MaxPool, Reshape, Transpose...).  This pass does both, in one walk in graph order:

* a FakeQuant whose input is already on its grid (same scale, zero point and range) is
  removed: its input came from a FakeQuant (or a fused one) or a per-tensor DequantizeLinear (the
  integer steps of host plans: a QGlobalAveragePool's bytes dequantized for a float classifier) with
  those parameters, possibly through ops that only select, move or zero values (``_ON_GRID``).  Requantizing a value of
  the grid gives it back bit for bit (``(q - zp) * s / s`` rounds to ``q - zp`` for every 8/16-bit
  ``q``), so the result is unchanged;
* a FakeQuant that is the only reader of a Conv / ConvTranspose / Gemm / FullyConnected /
  ChannelAffine, a float Add / Sub / Mul or an (global) AveragePool becomes the last stage of
  that node's fused epilogue (attribute ``activation_quant``, see ``optcli.ops.activation``):
  applied after the activation and the cast to the output dtype, exactly where the stand-alone
  step ran, on every target (the GPU epilogue's ``FAKE_QUANT`` define);
* a FakeQuant after a Pad that pads with a value of its grid moves before the Pad (quantizing
  value by value commutes with padding by a value the quantization keeps), so that the Pad meets
  the Conv it feeds (``fold_pad_into_conv``): models quantized in front of a 'same' padding.

A Relu before a FakeQuant whose zero point is its lower bound needs no work either, but it is
already part of the producer's epilogue by the time this pass runs (one step either way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Node, Value
from optcli.ops.activation import QUANT_ATTR, fake_quantize
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import drop_values

NAME = "fuse_fake_quant"
DESCRIPTION = ("fold FakeQuant into the epilogue of the Conv/Gemm/FC/Add/... before it; "
               "drop FakeQuant that requantizes values already on its grid")

_PRODUCERS = {("", "Conv"), ("", "ConvTranspose"), ("", "Gemm"), (OPTCLI_DOMAIN, "FullyConnected"),
              (OPTCLI_DOMAIN, "ChannelAffine"), ("", "Add"), ("", "Sub"), ("", "Mul"), ("", "AveragePool"),
              ("", "GlobalAveragePool")}
_FLOATS = ("float32", "float16", "float64")

# Ops whose output holds only values of their first input (selected, moved, repeated): a tensor
# on a quantization grid stays on it.  Relu and zero padding add zeros, on the grid when the
# zero point is in range.
_ON_GRID = {"MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Slice",
            "Gather", "Split", "Expand", "Tile", "DepthToSpace", "SpaceToDepth"}

Grid = tuple[float, float, float, float]  # scale, zero point, qmin, qmax


def _key(node: Node) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def _params(node: Node) -> Grid:
    a = node.attrs
    return (float(a["scale"]), float(a.get("zero_point", 0.0)), float(a.get("qmin", -128)),
            float(a.get("qmax", 127)))


def _is_fake_quant(node: Node) -> bool:
    return node.domain == OPTCLI_DOMAIN and node.op_type == "FakeQuant"


def _on_grid(value: np.ndarray | None, g: Grid) -> bool:
    return value is not None and value.dtype.kind == "f" and bool(
        np.array_equal(fake_quantize(value.astype(np.float32), *g), value.astype(np.float32)))


_BYTE_RANGE = {"uint8": (0.0, 255.0), "int8": (-128.0, 127.0), "uint16": (0.0, 65535.0), "int16": (-32768.0, 32767.0)}


def _dequantized_grid(graph: Graph, node: Node) -> Grid | None:
    """The grid of a per-tensor DequantizeLinear's output (scale, zero point and range as ``fold_qdq`` gives
    the FakeQuant of the same pair)."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or node.attrs.get("block_size"):
        return None
    scale = graph.const(node.input(1))
    zp = graph.const(node.input(2)) if node.input(2) else None
    dtype = graph.dtype_of(node.input(0))
    if scale is None or scale.size != 1 or (node.input(2) and (zp is None or zp.size != 1)) or dtype not in _BYTE_RANGE:
        return None
    if zp is not None and zp.dtype.name != dtype:
        return None
    s = float(scale.reshape(-1)[0])
    if not (np.isfinite(s) and s > 0):
        return None
    return (s, float(zp.reshape(-1)[0]) if zp is not None else 0.0, *_BYTE_RANGE[dtype])


def _keeps_grid(graph: Graph, node: Node, grid: dict[str, Grid]) -> Grid | None:
    """The grid of a data-movement node's outputs, when its inputs are on one."""
    if node.domain not in ("", "ai.onnx") or node.proto is not None:
        return None
    g = grid.get(node.input(0))
    if g is None:
        return None
    if node.op_type in _ON_GRID:
        if node.op_type == "MaxPool" and len([o for o in node.outputs if o]) > 1:
            return None  # the Indices output is not a tensor of values
        return g
    zero_on_grid = g[2] <= g[1] <= g[3]
    if node.op_type == "Relu":
        return g if zero_on_grid else None
    if node.op_type == "Pad":
        # edge/reflect repeat values of the input; constant padding adds its value (0 by default)
        mode = node.attrs.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            return g
        value = graph.const(node.input(2)) if node.input(2) else np.zeros((), np.float32)
        return g if _on_grid(value, g) else None  # (a value computed at run time is None: not on it)
    if node.op_type == "Concat":
        grids = {grid.get(i) for i in node.inputs if i}
        return g if len(grids) == 1 else None
    return None


def _fusable(graph: Graph, consumers: dict[str, list[Node]], producer: Node | None, fq: Node) -> bool:
    if producer is None or _key(producer) not in _PRODUCERS or producer.proto is not None:
        return False
    if QUANT_ATTR in producer.attrs or len(producer.outputs) != 1:
        return False
    if graph_queries.sole_consumer(graph, consumers, producer.outputs[0]) is not fq:
        return False
    return graph.dtype_of(producer.outputs[0]) in _FLOATS and graph.dtype_of(fq.outputs[0]) in _FLOATS


def _pad_before(graph: Graph, consumers: dict[str, list[Node]], producer: Node | None, fq: Node) -> bool:
    """A constant/edge/reflect Pad read only by this FakeQuant, padding with a value of its grid:
    quantizing before padding gives the same tensor (the FakeQuant works value by value)."""
    if producer is None or producer.op_type != "Pad" or producer.domain not in ("", "ai.onnx") or producer.proto:
        return False
    if len(producer.outputs) != 1 or graph_queries.sole_consumer(graph, consumers, producer.outputs[0]) is not fq:
        return False
    mode = producer.attrs.get("mode", "constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return True
    value = graph.const(producer.input(2)) if producer.input(2) else np.zeros((), np.float32)
    return _on_grid(value, _params(fq))


def _swap(graph: Graph, pad: Node, fq: Node, index: dict[int, int], producers: dict[str, Node]) -> None:
    """Pad -> FakeQuant becomes FakeQuant -> Pad, so the Pad can meet the Conv after it."""
    x, mid, out = pad.input(0), pad.outputs[0], fq.outputs[0]
    fq.inputs, fq.outputs = [x], [mid]
    pad.inputs, pad.outputs = [mid, *pad.inputs[1:]], [out]
    i, j = index[id(pad)], index[id(fq)]
    graph.nodes[i], graph.nodes[j] = fq, pad
    index[id(fq)], index[id(pad)] = i, j
    producers[mid], producers[out] = fq, pad
    graph.values[mid] = Value(mid, graph.dtype_of(x) or "float32", graph.shape_of(x))


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    return walk(graph, fuse=True)


def walk(graph: Graph, fuse: bool) -> dict[str, int]:
    """One walk in graph order: drop FakeQuants already on their grid, and (``fuse``) fold the
    others into the epilogue of the node before them."""
    if not any(_is_fake_quant(n) for n in graph.nodes):
        return {"fused": 0, "removed": 0, "moved_before_pad": 0} if fuse else {"removed": 0, "moved_before_pad": 0}
    consumers = graph_queries.consumers(graph)
    producers = graph.producers()
    outputs = graph.output_names()
    grid: dict[str, Grid] = {}
    rename: dict[str, str] = {}  # output of a removed FakeQuant -> the value it equals
    gone: set[int] = set()
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    fused = removed = swapped = 0
    for position in range(len(graph.nodes)):
        node = graph.nodes[position]
        if rename:
            node.inputs = [rename.get(i, i) for i in node.inputs]
        if not _is_fake_quant(node):
            if QUANT_ATTR in node.attrs and len(node.outputs) == 1:
                grid[node.outputs[0]] = tuple(float(v) for v in node.attrs[QUANT_ATTR])  # type: ignore[assignment]
                continue
            g = _keeps_grid(graph, node, grid) or _dequantized_grid(graph, node)
            if g is not None:
                grid.update((o, g) for o in node.outputs if o)
            continue
        params, src, out = _params(node), node.input(0), node.outputs[0]
        if grid.get(src) == params and out not in outputs:
            rename[out] = src
            gone.add(id(node))
            drop_values(graph, out)
            removed += 1
            continue
        producer = producers.get(src)
        if _pad_before(graph, consumers, producer, node):
            _swap(graph, producer, node, index, producers)
            grid[producer.input(0)] = params
            grid[producer.outputs[0]] = params
            swapped += 1
            continue
        if fuse and _fusable(graph, consumers, producer, node):
            producer.attrs[QUANT_ATTR] = list(params)
            producer.outputs = [out]
            producers[out] = producer
            drop_values(graph, src)
            gone.add(id(node))
            fused += 1
        grid[out] = params
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    counts = {"removed": removed, "moved_before_pad": swapped}
    return {"fused": fused, **counts} if fuse else counts
