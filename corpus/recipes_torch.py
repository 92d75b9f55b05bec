"""torch.onnx exports of timm architectures (random weights) and a keras-style NHWC model.

Why: most ONNX files people feed an optimizer come out of torch.onnx, and the two exporters
write very different graphs. The TorchScript exporter (`dynamo=False`) writes opset 13-17 graphs
with Constant nodes, Shape/Gather/Unsqueeze chains for dynamic axes and BN already folded into
Conv. The dynamo exporter (`dynamo=True`, via onnxscript) writes opset 18 graphs with
initializers named after module paths, value_info everywhere, and (by default) the weights in
an external `.data` file. timm's TF ports (tf_efficientnet_lite0, tf_mobilenetv3_*) use
TF-style "same" padding, which the exporters write as explicit Pad nodes or asymmetric pads.
"""
from __future__ import annotations

from common import Feed, Recipe, seed_everything, seeded_eval

IMG = [1, 3, 224, 224]


def _timm(arch: str):
    """Random-init timm model; BatchNorm stats and affine params randomised (seeded) too.

    With timm's default init every folded BN bias is 0, so the TorchScript exporter
    deduplicates them into Identity nodes and conv+BN folding goes untested; trained models
    have distinct, non-zero BN parameters, so we give them some.
    """
    import timm
    import torch
    seed_everything()
    model = timm.create_model(arch, pretrained=False).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                n = m.num_features
                m.running_mean.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
    return model


def _export_ts(model, x, out: str, opset: int, dynamic_batch: bool, input_layout="NCHW"):
    import torch
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["output"], dynamic_axes=axes,
                          do_constant_folding=True)


def _export_dynamo(model, x, out: str, opset: int, dynamic_batch: bool, external_data: bool):
    import torch
    shapes = ({0: torch.export.Dim("batch", min=1, max=64)},) if dynamic_batch else None
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=True, opset_version=opset,
                          input_names=["input"], output_names=["output"],
                          dynamic_shapes=shapes, external_data=external_data)


def timm_build(arch: str, exporter: str, opset: int, dynamic_batch: bool, size: int = 224,
               external_data: bool = False):
    def build(out: str, ctx: dict) -> None:
        import torch
        model = _timm(arch)
        # torch.export specialises a dim whose example size is 1: use batch 2 when dynamic.
        batch = 2 if dynamic_batch and exporter != "ts" else 1
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        if exporter == "ts":
            _export_ts(model, x, out, opset, dynamic_batch)
        else:
            _export_dynamo(model, x, out, opset, dynamic_batch, external_data)
    return build


def timm_recipe(arch: str, exporter: str, opset: int, *, dynamic_batch=False, size=224,
                external_data=False, subset=("all",), feed_batch=1) -> Recipe:
    tag = "ts" if exporter == "ts" else "dynamo"
    label = ("torch.onnx TorchScript" if exporter == "ts" else "torch.onnx dynamo") + f" opset {opset}"
    if external_data:
        label += " (external data)"
    return Recipe(
        name=f"{tag}_{arch}_op{opset}" + ("_dynbatch" if dynamic_batch else ""),
        family="vision", exporter=label,
        build=timm_build(arch, exporter, opset, dynamic_batch, size, external_data),
        feeds={"input": Feed([feed_batch, 3, size, size], -1.0, 1.0)},
        params={"src": "timm", "arch": arch, "exporter": exporter, "opset": opset,
                "dynamic_batch": dynamic_batch, "size": size, "external_data": external_data,
                "bn": "random", "v": 2},
        subset=tuple(subset), needs=("torch", "timm") + (("onnxscript",) if tag == "dynamo" else ()))


def nhwc_build(out: str, ctx: dict) -> None:
    """A keras-like CNN taking NHWC: Transpose in, conv stack, Transpose out (NHWC mask + logits)."""
    import torch
    from torch import nn

    def cbr(cin, cout, stride=1, groups=1):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU6())

    class KerasLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(cbr(3, 16, 2), cbr(16, 16, 1, 16), cbr(16, 32), cbr(32, 32, 2, 32),
                                      cbr(32, 64), cbr(64, 64, 1, 64))
            self.mask = nn.Conv2d(64, 1, 1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):                      # x: N,H,W,C as keras / tflite feed it
            y = self.body(x.permute(0, 3, 1, 2))
            mask = torch.sigmoid(self.mask(y)).permute(0, 2, 3, 1)
            logits = torch.softmax(self.fc(y.mean((2, 3))), -1)
            return mask, logits

    model = seeded_eval(KerasLike)                 # non-trivial BN stats so folding matters
    x = torch.rand(1, 128, 128, 3)
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=False, opset_version=13,
                          input_names=["input_1"], output_names=["mask", "logits"])


def recipes() -> list[Recipe]:
    r = [
        # CI: one TorchScript TF port and one dynamo small CNN with dynamic batch.
        timm_recipe("tf_mobilenetv3_small_minimal_100", "ts", 13, subset=("ci", "all")),
        timm_recipe("regnetx_002", "dynamo", 18, dynamic_batch=True, subset=("ci", "all")),
        # TorchScript exporter.
        timm_recipe("tf_efficientnet_lite0", "ts", 13),
        timm_recipe("tf_mobilenetv3_small_minimal_100", "ts", 17, dynamic_batch=True, feed_batch=2),
        timm_recipe("mixnet_s", "ts", 13, dynamic_batch=True),
        timm_recipe("resnet18", "ts", 13),
        timm_recipe("resnet18", "ts", 17, dynamic_batch=True, feed_batch=2),
        timm_recipe("regnetx_002", "ts", 13),
        timm_recipe("convnext_atto", "ts", 17),
        timm_recipe("vit_tiny_patch16_224", "ts", 17, dynamic_batch=True),
        # dynamo exporter (opset 18; resnet18 keeps the exporter's default external data).
        timm_recipe("resnet18", "dynamo", 18, external_data=True),
        timm_recipe("tf_efficientnet_lite0", "dynamo", 18),
        timm_recipe("mixnet_s", "dynamo", 18),
        timm_recipe("convnext_atto", "dynamo", 18, dynamic_batch=True),
        timm_recipe("vit_tiny_patch16_224", "dynamo", 18),
        Recipe(name="ts_keras_like_nhwc_op13", family="vision",
               exporter="torch.onnx TorchScript opset 13 (NHWC input, Transposes at the edges)",
               build=nhwc_build, feeds={"input_1": Feed([1, 128, 128, 3], 0.0, 1.0)},
               params={"src": "torch", "model": "KerasLike", "v": 1}, needs=("torch",)),
    ]
    return r
