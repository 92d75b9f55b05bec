"""Models derived from other corpus models: paddle-style -1 dims and onnxruntime quantization.

Why:
- paddle2onnx writes unknown dims as `dim_value: -1` (not `dim_param`) and little value_info;
  a reader that trusts dim_value > 0, or treats -1 as a size, breaks. We rewrite a built model
  the same way instead of installing paddle (a large, separate stack).
- onnxruntime.quantization is how most int8 ONNX files are made: quantize_static with QDQ
  (QuantizeLinear/DequantizeLinear pairs around float ops, per-channel int8 weights) or the
  QOperator format (QLinearConv, ...), and quantize_dynamic for transformers (MatMulInteger +
  DynamicQuantizeLinear). Calibration uses a few seeded random batches: the numbers are not
  meaningful, the graph structure is what real quantized files look like.
"""
from __future__ import annotations

from common import Feed, Recipe, describe_inputs, random_feeds


def paddle_build(base: str):
    def build(out: str, ctx: dict) -> None:
        import onnx
        model = onnx.load(ctx["path"](base))
        for vi in list(model.graph.input) + list(model.graph.output):
            d0 = vi.type.tensor_type.shape.dim[0]
            d0.Clear()
            d0.dim_value = -1                 # what paddle2onnx writes for an unknown batch
        del model.graph.value_info[:]         # paddle2onnx leaves intermediate shapes out
        model.producer_name, model.producer_version = "PaddlePaddle", "2.6.0"
        onnx.save(model, out)
    return build


def _quiet() -> None:
    """onnxruntime.quantization logs a WARNING per non-initializer bias on the root logger."""
    import logging
    logging.getLogger().setLevel(logging.ERROR)


class _Reader:
    """A CalibrationDataReader over a few seeded random batches of the base model's feeds."""
    def __init__(self, inputs, n=4):
        self.batches = iter([random_feeds(inputs, seed=i) for i in range(n)])

    def get_next(self):
        return next(self.batches, None)


def quant_static_build(base: str, fmt: str):
    def build(out: str, ctx: dict) -> None:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
        _quiet()
        src = ctx["path"](base)
        inputs, _ = describe_inputs(src, ctx["recipes"][base].feeds)
        quantize_static(src, out, _Reader(inputs),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return build


def quant_dynamic_build(base: str, reduce_range: bool = False):
    def build(out: str, ctx: dict) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        _quiet()
        quantize_dynamic(ctx["path"](base), out, weight_type=QuantType.QInt8, reduce_range=reduce_range)
    return build


def recipes(by_name: dict[str, Recipe]) -> list[Recipe]:
    def derived(name, base, family, exporter, build, params, subset=("all",), feeds=None):
        b = by_name[base]
        return Recipe(name=name, family=family, exporter=exporter, build=build,
                      feeds=feeds if feeds is not None else b.feeds, params=dict(params, base=base),
                      pretrained=b.pretrained, subset=tuple(subset), deps=(base,),
                      needs=("onnx",) if params["kind"] == "paddle" else ("onnx", "onnxruntime"))

    mnv3 = "ts_tf_mobilenetv3_small_minimal_100_op13"
    return [
        derived("paddle_neg1_tf_mobilenetv3_small_minimal_100", mnv3, "vision",
                "onnx edit: paddle2onnx-style dim_value -1 batch, no value_info",
                paddle_build(mnv3), {"kind": "paddle", "v": 1}, subset=("ci", "all")),
        derived("paddle_neg1_resnet18", "ts_resnet18_op17_dynbatch", "vision",
                "onnx edit: paddle2onnx-style dim_value -1 batch, no value_info",
                paddle_build("ts_resnet18_op17_dynbatch"), {"kind": "paddle", "v": 1},
                feeds={"input": Feed([2, 3, 224, 224], -1.0, 1.0)}),
        derived("qdq_tf_mobilenetv3_small_minimal_100", mnv3, "vision",
                "onnxruntime quantize_static QDQ per_channel (u8 act, s8 weights)",
                quant_static_build(mnv3, "qdq"), {"kind": "qdq", "v": 1}, subset=("ci", "all")),
        derived("qdq_resnet18", "ts_resnet18_op13", "vision",
                "onnxruntime quantize_static QDQ per_channel (u8 act, s8 weights)",
                quant_static_build("ts_resnet18_op13", "qdq"), {"kind": "qdq", "v": 1}),
        derived("qop_tf_efficientnet_lite0", "ts_tf_efficientnet_lite0_op13", "vision",
                "onnxruntime quantize_static QOperator per_channel (QLinearConv)",
                quant_static_build("ts_tf_efficientnet_lite0_op13", "qop"), {"kind": "qop", "v": 1}),
        derived("qdyn_bert_tiny", "ts_bert_tiny_op14_dynseq", "text",
                "onnxruntime quantize_dynamic QOperator (MatMulInteger)",
                quant_dynamic_build("ts_bert_tiny_op14_dynseq"), {"kind": "qdyn", "v": 1}),
        derived("qdyn_distilbert_tiny", "ts_distilbert_tiny_op17_dynseq", "text",
                "onnxruntime quantize_dynamic QOperator (MatMulInteger)",
                quant_dynamic_build("ts_distilbert_tiny_op17_dynseq"), {"kind": "qdyn", "v": 1}),
    ]
