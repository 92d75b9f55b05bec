"""GPU kernel for optcli.FakeQuant: how a float target honours activations quantized in the model
(QDQ models, int8 post-training quantization) -- the TensorFlow Lite GPU delegate does the same."""

from __future__ import annotations

from optcli.gpu.layout import dims4, packed_elements
from optcli.gpu.registry import Launch, common_check, gpu_kernel


@gpu_kernel("FakeQuant", domain="optcli", check=common_check)
def fake_quant(ctx, node) -> list[Launch]:
    shape = ctx.shape(node.outputs[0])
    _, channels, h, w = dims4(shape)
    count = packed_elements(shape) // 4
    a = node.attrs
    return [Launch("quant.cl", "fake_quant4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]), count,
                                               channels, h * w, float(a["scale"]), float(a.get("zero_point", 0.0)),
                                               float(a.get("qmin", -128)), float(a.get("qmax", 127))], (count,))]
