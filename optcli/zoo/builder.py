"""GraphBuilder: a thin, seeded layer over ``onnx.helper`` for writing model architectures in code.

Why: the zoo needs realistic ONNX graphs (the node patterns exporters actually emit: Clip-as-Relu6
with initializer bounds, decomposed hard-swish, MatMul+Add linear layers, explicit Pad before
conv, Reshape/Transpose channel shuffles) without shipping binary model files.  Building them
in code keeps the repository small, makes every size knob available, and makes weights
reproducible: one ``np.random.default_rng(seed)`` drives every initializer, in emission order,
so the same seed gives a byte-identical model.

The builder tracks each tensor's shape (ints for static dims, strings for symbolic ones, ``None``
where a symbolic dim went through arithmetic) so layers need not be told their input channels,
and ``build`` can declare output shapes that ``onnx.checker`` verifies against shape inference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
#: IR version 8 is what opset 17 was released with; every onnxruntime since 1.12 loads it.
IR_VERSION = 8

Dim = int | str | None

# Ops whose output is (about) non-negative / whose output keeps that property of all data inputs.
_RECTIFYING = {"Relu", "Clip", "HardSwish", "Sigmoid", "HardSigmoid"}
_PASSTHROUGH = {"MaxPool", "AveragePool", "GlobalAveragePool", "Pad", "Reshape", "Transpose", "Split",
                "Concat", "Flatten", "Squeeze", "Resize", "Mul", "Div"}


def _out_dim(size: Dim, k: int, stride: int, pad_total: int, dilation: int = 1, ceil: bool = False) -> Dim:
    if not isinstance(size, int):
        return None
    span = size + pad_total - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_total // 2:  # ONNX/PyTorch: last window must start inside
        out -= 1
    return out


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class GraphBuilder:
    """Accumulates nodes and initializers for one graph; every layer method returns its output name."""

    def __init__(self, name: str = "model", seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, list[Dim]] = {}
        self._counts: dict[str, int] = {}
        self._scalars: dict[tuple[str, float], str] = {}
        self._rectified: set[str] = set()

    # ------------------------------------------------------------------ plumbing
    def unique(self, prefix: str) -> str:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def shape(self, x: str) -> list[Dim]:
        return list(self.shapes[x])

    def channels(self, x: str) -> int:
        c = self.shapes[x][1]
        if not isinstance(c, int):
            raise ValueError(f"{x}: channel dim is not static ({c!r})")
        return c

    def input(self, name: str, shape: Sequence[Dim], dtype: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        self.shapes[name] = list(shape)
        return name

    def initializer(self, array: np.ndarray, prefix: str = "const") -> str:
        name = self.unique(prefix)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def scalar(self, value: float, dtype: str = "float32") -> str:
        """A shared 0-d initializer (Clip bounds, the 3 and 6 of hard-swish, ...)."""
        key = (dtype, float(value))
        if key not in self._scalars:
            self._scalars[key] = self.initializer(np.array(value, dtype=dtype), f"scalar_{dtype}")
        return self._scalars[key]

    def ints(self, values: Sequence[int], prefix: str = "ints") -> str:
        return self.initializer(np.asarray(values, dtype=np.int64), prefix)

    def node(self, op: str, inputs: Sequence[str], shape: Sequence[Dim] | None, n_out: int = 1,
             out_shapes: Sequence[Sequence[Dim]] | None = None, **attrs) -> str:
        """Emit one node; returns its first output (all outputs are ``<name>`` / ``<name>_<i>``)."""
        name = self.unique(op.lower())
        outs = [name if i == 0 else f"{name}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        shapes = out_shapes if out_shapes is not None else [shape] * n_out
        data = [i for i in inputs if i in self.shapes]
        if op in _RECTIFYING or (op in _PASSTHROUGH and data and all(i in self._rectified for i in data)):
            self._rectified.update(outs)
        for o, s in zip(outs, shapes):
            if s is not None:
                self.shapes[o] = list(s)
        return name

    def _unary(self, op: str, x: str, **attrs) -> str:
        return self.node(op, [x], self.shapes[x], **attrs)

    def rectified(self, x: str) -> bool:
        """Whether ``x`` is (roughly) non-negative, e.g. after Relu: He init wants gain 2 then, else 1."""
        return x in self._rectified

    def _fan_in_std(self, x: str, fan_in: float) -> float:
        return math.sqrt((2.0 if self.rectified(x) else 1.0) / fan_in)

    def _weights(self, shape: Sequence[int], std: float, prefix: str) -> str:
        return self.initializer(self.rng.normal(0.0, std, size=tuple(shape)).astype(np.float32), prefix)

    # ------------------------------------------------------------------ convolutions
    def conv(self, x: str, out_ch: int, k: int | Sequence[int], stride: int = 1,
             pad: int | Sequence[int] | None = None, group: int = 1, bias: bool = True, dilation: int = 1,
             gain: float = 1.0) -> str:
        """Conv with He-normal weights; ``pad=None`` means "same" for odd k.

        std = gain * sqrt(2 / fan_in) after a rectifier, gain * sqrt(1 / fan_in) on a signed input, so
        activations stay O(1) through deep nets even though BN uses random (not data) statistics.

        ``pad`` may be an int, or 4 ints [top, left, bottom, right].
        """
        n, c, h, w = self.shapes[x]
        assert isinstance(c, int) and c % group == 0 and out_ch % group == 0, (x, c, out_ch, group)
        kh, kw = _pair(k)
        if pad is None:
            pad = [dilation * (kh - 1) // 2, dilation * (kw - 1) // 2] * 2
        pads = [pad] * 4 if isinstance(pad, int) else list(pad)
        fan_in = c // group * kh * kw
        wname = self._weights([out_ch, c // group, kh, kw], gain * self._fan_in_std(x, fan_in), "conv.weight")
        ins = [x, wname]
        if bias:
            ins.append(self.initializer(self.rng.normal(0.0, 0.05, out_ch).astype(np.float32), "conv.bias"))
        shape = [n, out_ch, _out_dim(h, kh, stride, pads[0] + pads[2], dilation),
                 _out_dim(w, kw, stride, pads[1] + pads[3], dilation)]
        return self.node("Conv", ins, shape, kernel_shape=[kh, kw], strides=[stride, stride], pads=pads,
                         group=group, dilations=[dilation, dilation])

    def conv_transpose(self, x: str, out_ch: int, k: int = 2, stride: int = 2, pad: int = 0,
                       bias: bool = True, output_padding: int = 0) -> str:
        n, c, h, w = self.shapes[x]
        assert isinstance(c, int)
        fan_in = max(1.0, c * k * k / (stride * stride))  # inputs that reach one output pixel
        wname = self._weights([c, out_ch, k, k], self._fan_in_std(x, fan_in), "convT.weight")
        ins = [x, wname]
        if bias:
            ins.append(self.initializer(self.rng.normal(0.0, 0.05, out_ch).astype(np.float32), "convT.bias"))

        def up(d: Dim) -> Dim:
            return (d - 1) * stride - 2 * pad + k + output_padding if isinstance(d, int) else None

        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if output_padding:
            attrs["output_padding"] = [output_padding] * 2
        return self.node("ConvTranspose", ins, [n, out_ch, up(h), up(w)], **attrs)

    def bn(self, x: str, gain: float = 1.0, eps: float = 1e-5) -> str:
        """BatchNormalization (inference form) with random, non-trivial statistics: a pass must fold it."""
        c = self.channels(x)
        r = self.rng
        scale = self.initializer((gain * r.uniform(0.6, 1.4, c)).astype(np.float32), "bn.scale")
        beta = self.initializer(r.normal(0.0, 0.1, c).astype(np.float32), "bn.bias")
        mean = self.initializer(r.normal(0.0, 0.1, c).astype(np.float32), "bn.mean")
        var = self.initializer(r.uniform(0.6, 1.4, c).astype(np.float32), "bn.var")
        return self.node("BatchNormalization", [x, scale, beta, mean, var], self.shapes[x], epsilon=eps)

    def pad(self, x: str, pads: Sequence[int], mode: str = "constant") -> str:
        """Explicit Pad on the spatial dims, ``pads`` = [top, left, bottom, right] (TF-export style)."""
        t, left, b, r = pads
        n, c, h, w = self.shapes[x]
        shape = [n, c, h + t + b if isinstance(h, int) else None,
                 w + left + r if isinstance(w, int) else None]
        p = self.ints([0, 0, t, left, 0, 0, b, r], "pad.pads")
        return self.node("Pad", [x, p], shape, mode=mode)

    # ------------------------------------------------------------------ activations
    def relu(self, x: str) -> str:
        return self._unary("Relu", x)

    def clip(self, x: str, lo: float, hi: float) -> str:
        return self.node("Clip", [x, self.scalar(lo), self.scalar(hi)], self.shapes[x])

    def relu6(self, x: str) -> str:
        """Relu6 the way exporters write it since opset 11: Clip with min/max as initializer inputs."""
        return self.clip(x, 0.0, 6.0)

    def sigmoid(self, x: str) -> str:
        return self._unary("Sigmoid", x)

    def swish(self, x: str) -> str:
        """x * Sigmoid(x) as two nodes (SiLU as exported)."""
        return self.mul(x, self.sigmoid(x))

    def hardsigmoid(self, x: str, decomposed: bool = False) -> str:
        """HardSigmoid(alpha=1/6, beta=0.5) as the op, or decomposed Relu6(x+3)/6 (Add, Clip, Div)."""
        if not decomposed:
            return self._unary("HardSigmoid", x, alpha=1.0 / 6.0, beta=0.5)
        return self.div(self.relu6(self.add(x, self.scalar(3.0))), self.scalar(6.0))

    def hardswish(self, x: str, decomposed: bool = False) -> str:
        """HardSwish op, or the exported pattern x * Relu6(x + 3) / 6 (Add, Clip, Mul, Div)."""
        if not decomposed:
            return self._unary("HardSwish", x)
        y = self.div(self.mul(x, self.relu6(self.add(x, self.scalar(3.0)))), self.scalar(6.0))
        self._rectified.add(y)  # same init statistics as the HardSwish op
        return y

    # ------------------------------------------------------------------ elementwise / tensor
    def _binary(self, op: str, a: str, b: str) -> str:
        sa, sb = self.shapes.get(a), self.shapes.get(b)
        shape = sa if sa is not None and (sb is None or len(sa) >= len(sb)) else sb
        return self.node(op, [a, b], shape)

    def add(self, a: str, b: str) -> str:
        return self._binary("Add", a, b)

    def mul(self, a: str, b: str) -> str:
        return self._binary("Mul", a, b)

    def div(self, a: str, b: str) -> str:
        return self._binary("Div", a, b)

    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        shape = self.shape(xs[0])
        dims = [self.shapes[x][axis] for x in xs]
        shape[axis] = sum(dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]
        return self.node("Concat", list(xs), shape, axis=axis)

    def split(self, x: str, sizes: Sequence[int], axis: int = 1) -> list[str]:
        shapes = []
        for s in sizes:
            sh = self.shape(x)
            sh[axis] = s
            shapes.append(sh)
        sizes_name = self.ints(sizes, "split.sizes")
        first = self.node("Split", [x, sizes_name], None, n_out=len(sizes), out_shapes=shapes, axis=axis)
        return [first] + [f"{first}_{i}" for i in range(1, len(sizes))]

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        src = self.shapes[x]
        out: list[Dim] = [src[i] if d == 0 else d for i, d in enumerate(shape)]
        if -1 in out:
            known = [d for d in out if d != -1]
            if all(isinstance(d, int) for d in src) and all(isinstance(d, int) for d in known):
                out[out.index(-1)] = int(np.prod(src)) // int(np.prod(known))  # type: ignore[arg-type]
            else:
                out[out.index(-1)] = None
        return self.node("Reshape", [x, self.ints(shape, "reshape.shape")], out)

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        src = self.shapes[x]
        return self.node("Transpose", [x], [src[p] for p in perm], perm=list(perm))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        src = self.shapes[x]
        keep = [d for i, d in enumerate(src) if i not in {a % len(src) for a in axes}]
        return self.node("Squeeze", [x, self.ints(axes, "squeeze.axes")], keep)

    def flatten(self, x: str, axis: int = 1) -> str:
        src = self.shapes[x]
        head, tail = src[:axis], src[axis:]
        def prod(ds: list[Dim]) -> Dim:
            return int(np.prod(ds)) if all(isinstance(d, int) for d in ds) else None  # type: ignore[arg-type]
        return self.node("Flatten", [x], [prod(head) if axis != 1 else head[0], prod(tail)], axis=axis)

    def channel_shuffle(self, x: str, groups: int) -> str:
        """ShuffleNet's shuffle as exported: Reshape [N,g,C/g,H,W] -> Transpose -> Reshape [N,C,H,W]."""
        n, c, h, w = self.shapes[x]
        if not (isinstance(c, int) and isinstance(h, int) and isinstance(w, int)):
            raise ValueError("channel_shuffle needs static C, H, W")
        nb = n if isinstance(n, int) else 0
        y = self.reshape(x, [nb, groups, c // groups, h, w])
        y = self.transpose(y, [0, 2, 1, 3, 4])
        return self.reshape(y, [nb, c, h, w])

    def resize(self, x: str, scale: float = 2.0, mode: str = "nearest") -> str:
        """Upsample H, W by ``scale`` via Resize with a scales input (roi left empty)."""
        n, c, h, w = self.shapes[x]
        scales = self.initializer(np.array([1.0, 1.0, scale, scale], dtype=np.float32), "resize.scales")

        def up(d: Dim) -> Dim:
            return int(math.floor(d * scale)) if isinstance(d, int) else None

        if mode == "nearest":  # what torch.nn.Upsample(mode="nearest") exports
            attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            attrs = dict(mode=mode, coordinate_transformation_mode="half_pixel")
        return self.node("Resize", [x, "", scales], [n, c, up(h), up(w)], **attrs)

    # ------------------------------------------------------------------ pooling
    def maxpool(self, x: str, k: int = 3, stride: int = 2, pad: int = 0, ceil_mode: bool = False) -> str:
        return self._pool("MaxPool", x, k, stride, pad, ceil_mode)

    def avgpool(self, x: str, k: int = 3, stride: int = 2, pad: int = 0, ceil_mode: bool = False) -> str:
        return self._pool("AveragePool", x, k, stride, pad, ceil_mode)

    def _pool(self, op: str, x: str, k: int, stride: int, pad: int, ceil_mode: bool) -> str:
        n, c, h, w = self.shapes[x]
        shape = [n, c, _out_dim(h, k, stride, 2 * pad, ceil=ceil_mode),
                 _out_dim(w, k, stride, 2 * pad, ceil=ceil_mode)]
        return self.node(op, [x], shape, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                         ceil_mode=int(ceil_mode))

    def global_avgpool(self, x: str) -> str:
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], [n, c, 1, 1])

    # ------------------------------------------------------------------ blocks / linear layers
    def squeeze_excite(self, x: str, squeeze_ch: int, gate: str = "hardsigmoid") -> str:
        """GlobalAveragePool -> 1x1 conv -> Relu -> 1x1 conv -> gate -> Mul(x, gate)."""
        c = self.channels(x)
        s = self.relu(self.conv(self.global_avgpool(x), squeeze_ch, 1, pad=0))
        s = self.conv(s, c, 1, pad=0)
        s = self.hardsigmoid(s) if gate == "hardsigmoid" else self.sigmoid(s)
        return self.mul(x, s)

    def _linear_params(self, x: str, in_f: int, out_f: int, transposed: bool) -> tuple[str, str]:
        shape = [out_f, in_f] if transposed else [in_f, out_f]
        w = self._weights(shape, self._fan_in_std(x, in_f) / math.sqrt(2.0), "fc.weight")
        b = self.initializer(self.rng.normal(0.0, 0.05, out_f).astype(np.float32), "fc.bias")
        return w, b

    def gemm(self, x: str, out_features: int) -> str:
        """Gemm(x, W^T, b) with transB=1, the way torch exports nn.Linear on 2-D inputs."""
        n, in_f = self.shapes[x]
        assert isinstance(in_f, int)
        w, b = self._linear_params(x, in_f, out_features, transposed=True)
        return self.node("Gemm", [x, w, b], [n, out_features], transB=1)

    def matmul_add(self, x: str, out_features: int) -> str:
        """MatMul + Add over the last axis, the way exporters write linear layers on N-D inputs."""
        src = self.shapes[x]
        in_f = src[-1]
        assert isinstance(in_f, int)
        w, b = self._linear_params(x, in_f, out_features, transposed=False)
        y = self.node("MatMul", [x, w], src[:-1] + [out_features])
        return self.add(y, b)

    def lstm(self, x: str, hidden: int) -> str:
        """One forward LSTM layer over [seq, batch, feat]; returns Y, shaped [seq, 1, batch, hidden]."""
        seq, batch, feat = self.shapes[x]
        assert isinstance(feat, int)
        bound = 1.0 / math.sqrt(hidden)  # torch.nn.LSTM's init

        def u(*shape: int) -> np.ndarray:
            return self.rng.uniform(-bound, bound, size=shape).astype(np.float32)

        w = self.initializer(u(1, 4 * hidden, feat), "lstm.W")
        r = self.initializer(u(1, 4 * hidden, hidden), "lstm.R")
        b = self.initializer(u(1, 8 * hidden), "lstm.B")
        shapes = [[seq, 1, batch, hidden], [1, batch, hidden], [1, batch, hidden]]
        return self.node("LSTM", [x, w, r, b], None, n_out=3, out_shapes=shapes, hidden_size=hidden,
                         direction="forward")

    # ------------------------------------------------------------------ finish
    def rename(self, old: str, new: str) -> str:
        """Rename a node output (e.g. the final one to "output"), updating every consumer."""
        for node in self.nodes:
            for field in (node.input, node.output):
                for i, v in enumerate(field):
                    if v == old:
                        field[i] = new
        if old in self.shapes:
            self.shapes[new] = self.shapes.pop(old)
        if old in self._rectified:
            self._rectified.add(new)
        return new

    def build(self, inputs: Sequence[str] | None = None, outputs: Sequence[str] = (),
              output_names: Sequence[str] | None = None) -> onnx.ModelProto:
        """Assemble an opset-17 model; ``inputs`` defaults to every ``input()`` declared, in order.

        ``output_names`` optionally renames the outputs (the zoo calls its single output "output").
        Output value_infos carry the tracked shapes, so ``check_model(full_check=True)`` cross-checks
        the builder's shape bookkeeping against ONNX shape inference.
        """
        if output_names is not None:
            outputs = [self.rename(o, n) for o, n in zip(outputs, output_names)]
        by_name = {vi.name: vi for vi in self.inputs}
        ins = list(self.inputs) if inputs is None else [by_name[i] for i in inputs]
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, self.shapes.get(o)) for o in outputs]
        graph = helper.make_graph(self.nodes, self.name, ins, outs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="optcli.zoo", ir_version=IR_VERSION)
        onnx.checker.check_model(model)
        return model
