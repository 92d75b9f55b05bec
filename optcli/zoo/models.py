"""The model zoo: classic architectures rebuilt in code with seeded random weights.

Why: tests, benchmarks and the README quickstart need real-shaped ONNX graphs (BatchNorm left
unfolded, Clip-style Relu6, decomposed hard-swish, explicit Pad, Split/shuffle, Resize and
ConvTranspose, an LSTM, symbolic dims) without downloading model files.  Every function takes
``seed`` and size knobs: the defaults are tiny so a test builds and runs each model in well under a
second, and ``build(name, full=True)`` (or explicit ``resolution=224, width=1.0, ...``) gives
the published sizes, with roughly the real parameter counts and multiply-accumulates, for
benchmarks.  Weights are random, so outputs are meaningless but deterministic and O(1).
Every ``batch`` knob also accepts a string (e.g. ``batch="N"``) for a symbolic batch dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from .builder import GraphBuilder


def _divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision's _make_divisible: round channels to a multiple of ``divisor``, never below 90%."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _image_input(g: GraphBuilder, batch: int | str, resolution: int, channels: int = 3) -> str:
    return g.input("input", [batch, channels, resolution, resolution])


def _conv_bn(g: GraphBuilder, x: str, out_ch: int, k: int, stride: int = 1, group: int = 1,
             act: Callable[[str], str] | None = None, gain: float = 1.0) -> str:
    y = g.bn(g.conv(x, out_ch, k, stride=stride, group=group, bias=False), gain=gain)
    return act(y) if act is not None else y


def mobilenet_v2(seed: int = 0, resolution: int = 64, width: float = 0.5, num_classes: int = 10,
                 batch: int | str = 1, classifier: str = "gemm") -> onnx.ModelProto:
    """MobileNetV2 (inverted residuals, Relu6 as Clip).  224/1.0/1000 is ~3.5 M params, ~300 M MACs.

    ``classifier``: "gemm" (torch export) or "matmul" (MatMul + Add).
    """
    g = GraphBuilder("mobilenet_v2", seed)
    x = _image_input(g, batch, resolution)
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]
    in_ch = _divisible(32 * width)
    x = _conv_bn(g, x, in_ch, 3, 2, act=g.relu6)
    for t, c, n, s in cfg:
        out_ch = _divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            y = x
            hidden = in_ch * t
            if t != 1:
                y = _conv_bn(g, y, hidden, 1, act=g.relu6)
            y = _conv_bn(g, y, hidden, 3, stride, group=hidden, act=g.relu6)
            y = _conv_bn(g, y, out_ch, 1, gain=0.5 if stride == 1 and in_ch == out_ch else 1.0)
            x = g.add(x, y) if stride == 1 and in_ch == out_ch else y
            in_ch = out_ch
    x = _conv_bn(g, x, _divisible(1280 * max(1.0, width)), 1, act=g.relu6)
    x = g.flatten(g.global_avgpool(x))
    y = g.gemm(x, num_classes) if classifier == "gemm" else g.matmul_add(x, num_classes)
    return g.build(outputs=[y], output_names=["output"])


_V3_LARGE = [  # kernel, expanded, out, SE, activation, stride
    (3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1),
]
_V3_SMALL = [
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
]


def mobilenet_v3(seed: int = 0, resolution: int = 64, width: float = 0.5, num_classes: int = 10,
                 batch: int | str = 1, variant: str = "small", hardswish: str = "mixed") -> onnx.ModelProto:
    """MobileNetV3 (hard-swish, squeeze-excite gated by HardSigmoid, 5x5 depthwise, MatMul+Add head).

    ``variant``: "small" or "large" (224/1.0/1000: ~5.5 M params, ~220 M MACs).
    ``hardswish``: "op" (HardSwish), "decomposed" (x*Relu6(x+3)/6) or "mixed" (alternating, default).
    """
    if variant not in ("small", "large"):
        raise ValueError(f"mobilenet_v3 variant must be 'small' or 'large', got {variant!r}")
    g = GraphBuilder(f"mobilenet_v3_{variant}", seed)
    count = [0]

    def hs(t: str) -> str:
        count[0] += 1
        decomposed = hardswish == "decomposed" or (hardswish == "mixed" and count[0] % 2 == 0)
        return g.hardswish(t, decomposed=decomposed)

    x = _image_input(g, batch, resolution)
    in_ch = _divisible(16 * width)
    x = _conv_bn(g, x, in_ch, 3, 2, act=hs)
    for k, exp, out, se, nl, s in _V3_LARGE if variant == "large" else _V3_SMALL:
        act = hs if nl == "HS" else g.relu
        hidden, out_ch = _divisible(exp * width), _divisible(out * width)
        y = x
        if hidden != in_ch:
            y = _conv_bn(g, y, hidden, 1, act=act)
        y = _conv_bn(g, y, hidden, k, s, group=hidden, act=act)
        if se:
            y = g.squeeze_excite(y, _divisible(hidden / 4), gate="hardsigmoid")
        residual = s == 1 and in_ch == out_ch
        gain = (2.0 if se else 1.0) * (0.5 if residual else 1.0)  # the SE gate averages ~0.5
        y = _conv_bn(g, y, out_ch, 1, gain=gain)
        x = g.add(x, y) if residual else y
        in_ch = out_ch
    last = _divisible(6 * in_ch)
    x = _conv_bn(g, x, last, 1, act=hs)
    x = g.flatten(g.global_avgpool(x))
    x = hs(g.matmul_add(x, _divisible((1280 if variant == "large" else 1024) * max(1.0, width))))
    return g.build(outputs=[g.matmul_add(x, num_classes)], output_names=["output"])


def resnet18(seed: int = 0, resolution: int = 64, width: float = 0.25, num_classes: int = 10,
             batch: int | str = 1) -> onnx.ModelProto:
    """ResNet-18: basic blocks, strided 1x1 conv+BN shortcuts, stem with explicit Pad before MaxPool.

    224/1.0/1000 is ~11.7 M params, ~1.8 G MACs.
    """
    g = GraphBuilder("resnet18", seed)
    x = _image_input(g, batch, resolution)
    stem = max(8, int(64 * width))
    x = _conv_bn(g, x, stem, 7, 2, act=g.relu)
    x = g.maxpool(g.pad(x, [1, 1, 1, 1]), 3, 2)  # after Relu, zero padding == -inf padding
    in_ch = stem
    for stage, c in enumerate([64, 128, 256, 512]):
        out_ch = max(8, int(c * width))
        for i in range(2):
            stride = 2 if stage > 0 and i == 0 else 1
            y = _conv_bn(g, x, out_ch, 3, stride, act=g.relu)
            y = _conv_bn(g, y, out_ch, 3, gain=0.5)
            short = _conv_bn(g, x, out_ch, 1, stride) if stride != 1 or in_ch != out_ch else x
            x = g.relu(g.add(y, short))
            in_ch = out_ch
    x = g.flatten(g.global_avgpool(x))
    return g.build(outputs=[g.gemm(x, num_classes)], output_names=["output"])


def efficientnet_lite0(seed: int = 0, resolution: int = 64, width: float = 0.5, num_classes: int = 10,
                       batch: int | str = 1) -> onnx.ModelProto:
    """EfficientNet-Lite0: MBConv with Relu6, 3x3 and 5x5 depthwise, no SE, TF-style explicit Pad.

    Strided convs get an asymmetric Pad node in front (TF "SAME" padding as tf2onnx exports it).
    224/1.0/1000 is ~4.7 M params, ~400 M MACs.  As in the Lite variant, stem and head don't scale.
    """
    g = GraphBuilder("efficientnet_lite0", seed)
    x = _image_input(g, batch, resolution)

    def conv_same(t: str, out_ch: int, k: int, stride: int, group: int = 1) -> str:
        if stride == 1:
            return g.conv(t, out_ch, k, 1, group=group, bias=False)
        size = g.shape(t)[2]
        total = max((-(-size // stride) - 1) * stride + k - size, 0) if isinstance(size, int) else k - stride
        lo, hi = total // 2, total - total // 2
        return g.conv(g.pad(t, [lo, lo, hi, hi]), out_ch, k, stride, pad=0, group=group, bias=False)

    x = g.relu6(g.bn(conv_same(x, 32, 3, 2)))
    in_ch = 32
    cfg = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
           (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # expand, kernel, stride, out, repeats
    for e, k, s, c, n in cfg:
        out_ch = _divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = in_ch * e
            y = x
            if e != 1:
                y = g.relu6(g.bn(g.conv(y, hidden, 1, bias=False)))
            y = g.relu6(g.bn(conv_same(y, hidden, k, stride, group=hidden)))
            residual = stride == 1 and in_ch == out_ch
            y = g.bn(g.conv(y, out_ch, 1, bias=False), gain=0.5 if residual else 1.0)
            x = g.add(x, y) if residual else y
            in_ch = out_ch
    x = g.relu6(g.bn(g.conv(x, 1280, 1, bias=False)))
    x = g.flatten(g.global_avgpool(x))
    return g.build(outputs=[g.matmul_add(x, num_classes)], output_names=["output"])


def squeezenet(seed: int = 0, resolution: int = 64, width: float = 0.5, num_classes: int = 10,
               batch: int | str = 1) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (squeeze 1x1, expand 1x1 || 3x3, Concat), ceil-mode MaxPool, no BN.

    224/1.0/1000 is ~1.2 M params, ~350 M MACs.
    """
    g = GraphBuilder("squeezenet1_1", seed)
    x = _image_input(g, batch, resolution)

    def ch(c: int) -> int:
        return max(4, int(c * width))

    def fire(t: str, sq: int, ex: int) -> str:
        s = g.relu(g.conv(t, ch(sq), 1, pad=0))
        return g.concat([g.relu(g.conv(s, ch(ex), 1, pad=0)), g.relu(g.conv(s, ch(ex), 3))])

    x = g.relu(g.conv(x, ch(64), 3, 2, pad=0))
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = fire(fire(x, 16, 64), 16, 64)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = fire(fire(x, 32, 128), 32, 128)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    for sq, ex in [(48, 192), (48, 192), (64, 256), (64, 256)]:
        x = fire(x, sq, ex)
    x = g.relu(g.conv(x, num_classes, 1, pad=0))
    return g.build(outputs=[g.flatten(g.global_avgpool(x))], output_names=["output"])


_SHUFFLE_CHANNELS = {0.5: [24, 48, 96, 192, 1024], 1.0: [24, 116, 232, 464, 1024],
                     1.5: [24, 176, 352, 704, 1024], 2.0: [24, 244, 488, 976, 2048]}


def shufflenet_v2(seed: int = 0, resolution: int = 64, width: float = 0.5, num_classes: int = 10,
                  batch: int | str = 1) -> onnx.ModelProto:
    """ShuffleNetV2: channel split via Split, shuffle via Reshape/Transpose/Reshape.

    ``width`` 0.5/1.0/1.5/2.0 use the paper's channel table (1.0 at 224/1000: ~2.3 M params, ~150 M MACs).
    """
    g = GraphBuilder("shufflenet_v2", seed)
    scaled = [2 * max(4, int(c * width / 2)) for c in (116, 232, 464)]  # even, so the split halves match
    chans = _SHUFFLE_CHANNELS.get(width) or [24, *scaled, 1024]
    x = _image_input(g, batch, resolution)
    x = _conv_bn(g, x, chans[0], 3, 2, act=g.relu)
    x = g.maxpool(x, 3, 2, pad=1)
    in_ch = chans[0]
    for out_ch, repeats in zip(chans[1:4], [4, 8, 4]):
        half = out_ch // 2
        for i in range(repeats):
            if i == 0:
                b1 = _conv_bn(g, x, in_ch, 3, 2, group=in_ch)
                b1 = _conv_bn(g, b1, half, 1, act=g.relu)
                b2 = x
                stride = 2
            else:
                b1, b2 = g.split(x, [half, half])
                stride = 1
            b2 = _conv_bn(g, b2, half, 1, act=g.relu)
            b2 = _conv_bn(g, b2, half, 3, stride, group=half)
            b2 = _conv_bn(g, b2, half, 1, act=g.relu)
            x = g.channel_shuffle(g.concat([b1, b2]), 2)
            in_ch = out_ch
    x = _conv_bn(g, x, chans[4], 1, act=g.relu)
    x = g.flatten(g.global_avgpool(x))
    return g.build(outputs=[g.gemm(x, num_classes)], output_names=["output"])


def unet(seed: int = 0, resolution: int = 64, base: int = 8, depth: int = 3, in_channels: int = 3,
         out_channels: int = 1, batch: int | str = 1) -> onnx.ModelProto:
    """U-Net: double conv+BN+Relu per level, MaxPool down, Concat skips, Sigmoid head.

    Up paths cycle ConvTranspose(2, stride 2), Resize nearest + 1x1 conv, Resize linear + 1x1 conv,
    so all three appear once ``depth >= 3``.  ``resolution`` must be divisible by ``2**depth``.
    base=64, depth=4 is the paper's ~31 M params.
    """
    if resolution % (2**depth):
        raise ValueError(f"unet resolution {resolution} must be divisible by 2**depth = {2**depth}")
    g = GraphBuilder("unet", seed)
    x = _image_input(g, batch, resolution, in_channels)

    def double(t: str, c: int) -> str:
        return _conv_bn(g, _conv_bn(g, t, c, 3, act=g.relu), c, 3, act=g.relu)

    skips = []
    for level in range(depth):
        x = double(x, base * 2**level)
        skips.append(x)
        x = g.maxpool(x, 2, 2)
    x = double(x, base * 2**depth)
    for level in reversed(range(depth)):
        c = base * 2**level
        kind = ["convT", "nearest", "linear"][(depth - 1 - level) % 3]
        if kind == "convT":
            x = g.conv_transpose(x, c, 2, 2)
        else:
            x = g.conv(g.resize(x, 2.0, kind), c, 1, pad=0)
        x = double(g.concat([skips[level], x]), c)
    return g.build(outputs=[g.sigmoid(g.conv(x, out_channels, 1, pad=0))], output_names=["output"])


def lstm_model(seed: int = 0, seq_len: int = 16, batch: int | str = 1, features: int = 32, hidden: int = 64,
               num_outputs: int = 10) -> onnx.ModelProto:
    """An ONNX LSTM over input [seq, batch, features], Squeeze of the direction axis, MatMul+Add head.

    Output: [seq, batch, num_outputs].
    """
    g = GraphBuilder("lstm_model", seed)
    x = g.input("input", [seq_len, batch, features])
    y = g.squeeze(g.lstm(x, hidden), [1])
    return g.build(outputs=[g.matmul_add(y, num_outputs)], output_names=["output"])


def dynamic_cnn(seed: int = 0, width: int = 16, num_classes: int = 10) -> onnx.ModelProto:
    """Small CNN with input ["N", 3, "H", "W"]: any batch and any H, W >= 8 works.

    Conv/BN/Relu, a strided conv, HardSwish, MaxPool, then GlobalAveragePool + Flatten + Gemm.
    """
    g = GraphBuilder("dynamic_cnn", seed)
    x = g.input("input", ["N", 3, "H", "W"])
    x = _conv_bn(g, x, width, 3, act=g.relu)
    x = _conv_bn(g, x, 2 * width, 3, 2, act=g.relu6)
    x = g.maxpool(x, 2, 2)
    x = _conv_bn(g, x, 4 * width, 3, act=g.hardswish)
    x = g.flatten(g.global_avgpool(x))
    return g.build(outputs=[g.gemm(x, num_classes)], output_names=["output"])


ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3": mobilenet_v3,
    "resnet18": resnet18,
    "efficientnet_lite0": efficientnet_lite0,
    "squeezenet": squeezenet,
    "shufflenet_v2": shufflenet_v2,
    "unet": unet,
    "lstm_model": lstm_model,
    "dynamic_cnn": dynamic_cnn,
}

#: Keyword arguments giving each model its published size (for benchmarks): ``build(name, full=True)``.
FULL_SIZE: dict[str, dict[str, Any]] = {
    "mobilenet_v2": dict(resolution=224, width=1.0, num_classes=1000),
    "mobilenet_v3": dict(resolution=224, width=1.0, num_classes=1000, variant="large"),
    "resnet18": dict(resolution=224, width=1.0, num_classes=1000),
    "efficientnet_lite0": dict(resolution=224, width=1.0, num_classes=1000),
    "squeezenet": dict(resolution=224, width=1.0, num_classes=1000),
    "shufflenet_v2": dict(resolution=224, width=1.0, num_classes=1000),
    "unet": dict(resolution=256, base=64, depth=4),
    "lstm_model": dict(seq_len=128, features=128, hidden=512, num_outputs=128),
    "dynamic_cnn": dict(width=64, num_classes=1000),
}


def build(name: str, full: bool = False, **kw: Any) -> onnx.ModelProto:
    """Build zoo model ``name``; ``full=True`` starts from FULL_SIZE[name], explicit ``kw`` win."""
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(sorted(ZOO))}")
    args = {**(FULL_SIZE[name] if full else {}), **kw}
    return ZOO[name](**args)


def sample_inputs(model: onnx.ModelProto, seed: int = 0, batch: int | str = 1,
                  spatial: int | Sequence[int] | dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 feeds for every graph input (initializers excluded).

    Symbolic dims are bound as follows: a dict ``spatial`` maps dim names to values; a symbolic
    leading dim (or one named N/batch/B) gets ``batch``; the other symbolic dims take ``spatial``
    in order (an int is used for all of them; default 64).
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    named = dict(spatial) if isinstance(spatial, dict) else {}
    if spatial is None or isinstance(spatial, dict):
        rest: list[int] = []
    elif isinstance(spatial, int):
        rest = []
        named.setdefault("*", spatial)
    else:
        rest = [int(s) for s in spatial]
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape, k = [], 0
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in named:
                shape.append(named[d.dim_param])
            elif i == 0 or d.dim_param in ("N", "batch", "B", "batch_size"):
                shape.append(batch)
            else:
                shape.append(rest[k] if k < len(rest) else named.get("*", 64))
                k += 1
        elem = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        feeds[vi.name] = rng.standard_normal(shape).astype(elem)
    return feeds
