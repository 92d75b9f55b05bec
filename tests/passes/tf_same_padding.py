"""A strided conv with TensorFlow 'same' padding computed at run time, as timm's ``tf_*`` ports
export it through torch.onnx: Shape -> Gather -> Cast -> Div -> Ceil -> Sub -> Mul -> Max ->
Concat -> Pad before the conv.  With a static input every bit of it is constant."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _pad_amount(src: str, axis: int, kernel: int, stride: int, tag: str) -> tuple[list[onnx.NodeProto], str]:
    """pad = max((ceil(size / stride) - 1) * stride + kernel - size, 0) for one spatial axis."""
    n = lambda *a, **k: helper.make_node(*a, **k)  # noqa: E731
    p = f"{tag}{axis}_"
    nodes = [
        n("Shape", [src], [p + "shape"]),
        n("Gather", [p + "shape", p + "axis"], [p + "size"], axis=0),
        n("Cast", [p + "size"], [p + "sizef"], to=TensorProto.FLOAT),
        n("Div", [p + "sizef", "stride_f"], [p + "q"]),
        n("Ceil", [p + "q"], [p + "ceil"]),
        n("Sub", [p + "ceil", "one_f"], [p + "m1"]),
        n("Mul", [p + "m1", "stride_f"], [p + "ms"]),
        n("Add", [p + "ms", "kernel_f"], [p + "mk"]),
        n("Sub", [p + "mk", p + "sizef"], [p + "raw"]),
        n("Max", [p + "raw", "zero_f"], [p + "padf"]),
        n("Cast", [p + "padf"], [p + "pad"], to=TensorProto.INT64),
    ]
    return nodes, p


def _same_conv(src: str, dst: str, tag: str, channels: tuple[int, int], inits: dict) -> list[onnx.NodeProto]:
    kernel, stride = 3, 2
    nodes: list[onnx.NodeProto] = []
    halves = []
    for axis in (2, 3):
        part, p = _pad_amount(src, axis, kernel, stride, tag)
        inits[p + "axis"] = np.array(axis, np.int64)
        nodes += part
        nodes += [helper.make_node("Div", [p + "pad", "two"], [p + "lo"]),
                  helper.make_node("Sub", [p + "pad", p + "lo"], [p + "hi"]),
                  helper.make_node("Unsqueeze", [p + "lo", "axes0"], [p + "lo1"]),
                  helper.make_node("Unsqueeze", [p + "hi", "axes0"], [p + "hi1"])]
        halves.append(p)
    (h, w) = halves
    nodes.append(helper.make_node("Concat", ["zeros2", h + "lo1", w + "lo1", "zeros2", h + "hi1", w + "hi1"],
                                  [tag + "pads"], axis=0))
    nodes.append(helper.make_node("Pad", [src, tag + "pads"], [tag + "xp"]))
    rng = np.random.default_rng(len(inits))
    inits[tag + "w"] = rng.standard_normal((channels[1], channels[0], kernel, kernel)).astype(np.float32)
    inits[tag + "b"] = rng.standard_normal(channels[1]).astype(np.float32)
    nodes.append(helper.make_node("Conv", [tag + "xp", tag + "w", tag + "b"], [tag + "c"], strides=[stride, stride]))
    nodes.append(helper.make_node("Relu", [tag + "c"], [dst]))
    return nodes


def tf_same_padding_model(size: int = 15, dynamic: str | bool = False) -> onnx.ModelProto:
    """Two such convs in a row: the second one's Shape reads the first Pad's output, whose shape
    only a second round of inference (after folding the first pads) can know.  ``dynamic``:
    False (static input), "batch" (only the batch dim is a symbol) or True (N, H, W symbols)."""
    inits = {"stride_f": np.array(2, np.float32), "one_f": np.array(1, np.float32),
             "kernel_f": np.array(3, np.float32), "zero_f": np.array(0, np.float32),
             "two": np.array(2, np.int64), "zeros2": np.zeros(2, np.int64), "axes0": np.array([0], np.int64)}
    nodes = _same_conv("x", "h1", "a", (3, 8), inits) + _same_conv("h1", "y", "b", (8, 8), inits)
    dims = ["N", 3, size, size] if dynamic == "batch" else ["N", 3, "H", "W"] if dynamic else [1, 3, size, size]
    graph = helper.make_graph(nodes, "tf_same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
