"""transformers encoders built from tiny random-init configs (no hub), exported with torch.onnx.

Why: transformer graphs bring what CNNs do not: Gather embeddings on int64 token ids,
attention (MatMul/Softmax with a mask built from Shape/Expand/Where chains), LayerNorm
(decomposed at opset < 17, LayerNormalization at >= 17), GELU (Erf), and a dynamic sequence
length (`dynamic_axes` on seq) that flows through Reshapes. The configs are tiny so they build
and run in seconds, but keep the real module code of transformers, hence the real graph shape.
"""
from __future__ import annotations

from common import Feed, Recipe, seed_everything

VOCAB = 1000
SEQ = 16


def _wrap(model, names):
    """Module whose forward takes the named int64 inputs positionally and returns a tuple."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(names, args)), return_dict=False)
            return tuple(out)
    return Wrapped().eval()


def _text_model(kind: str):
    import transformers as tf
    seed_everything()
    if kind == "bert":
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=512, max_position_embeddings=128,
                            attn_implementation="eager")
        return tf.BertModel(cfg).eval(), \
            ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"]
    if kind == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=2, n_heads=2, hidden_dim=512,
                                  max_position_embeddings=128, attn_implementation="eager")
        return tf.DistilBertModel(cfg).eval(), \
            ["input_ids", "attention_mask"], ["last_hidden_state"]
    raise ValueError(kind)


def text_build(kind: str, exporter: str, opset: int):
    def build(out: str, ctx: dict) -> None:
        import torch
        model, names, outs = _text_model(kind)
        g = torch.Generator().manual_seed(0)
        args = [torch.randint(0, VOCAB, (1, SEQ), generator=g)]
        args += [torch.ones(1, SEQ, dtype=torch.int64)]
        if "token_type_ids" in names:
            args += [torch.zeros(1, SEQ, dtype=torch.int64)]
        wrapped = _wrap(model, names)
        with torch.no_grad():
            if exporter == "ts":
                axes = {n: {0: "batch", 1: "sequence"} for n in names}
                axes.update({o: {0: "batch", 1: "sequence"} for o in outs if o != "pooler_output"})
                if "pooler_output" in outs:
                    axes["pooler_output"] = {0: "batch"}
                torch.onnx.export(wrapped, tuple(args), out, dynamo=False, opset_version=opset,
                                  input_names=names, output_names=outs, dynamic_axes=axes)
            else:
                batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("sequence", min=2, max=128)
                shapes = tuple({0: batch, 1: seq} for _ in names)
                torch.onnx.export(wrapped, tuple(args), out, dynamo=True, opset_version=opset,
                                  input_names=names, output_names=outs, dynamic_shapes=(shapes,),
                                  external_data=False)
    return build


def text_recipe(kind: str, exporter: str, opset: int, subset=("all",)) -> Recipe:
    tag = "ts" if exporter == "ts" else "dynamo"
    feeds = {"input_ids": Feed([2, SEQ], 0, VOCAB), "attention_mask": Feed([2, SEQ], 0, 2),
             "token_type_ids": Feed([2, SEQ], 0, 2)}
    if kind != "bert":
        feeds.pop("token_type_ids")
    label = ("torch.onnx TorchScript" if exporter == "ts" else "torch.onnx dynamo") + f" opset {opset}"
    return Recipe(name=f"{tag}_{kind}_tiny_op{opset}_dynseq", family="text", exporter=label,
                  build=text_build(kind, exporter, opset), feeds=feeds,
                  params={"src": "transformers", "kind": kind, "exporter": exporter, "opset": opset,
                          "vocab": VOCAB, "v": 1},
                  subset=tuple(subset),
                  needs=("torch", "transformers") + (("onnxscript",) if tag == "dynamo" else ()))


MEL, FRAMES = 80, 200   # whisper's encoder wants exactly 2 * max_source_positions frames


def whisper_build(out: str, ctx: dict) -> None:
    import torch
    import transformers as tf
    seed_everything()
    cfg = tf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=MEL, d_model=64, encoder_layers=2,
                           encoder_attention_heads=2, encoder_ffn_dim=256, decoder_layers=1,
                           decoder_attention_heads=2, decoder_ffn_dim=256,
                           max_source_positions=FRAMES // 2, max_target_positions=64,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                           suppress_tokens=None, begin_suppress_tokens=None,
                           attn_implementation="eager")
    encoder = tf.WhisperModel(cfg).get_encoder().eval()
    wrapped = _wrap(encoder, ["input_features"])
    x = torch.randn(1, MEL, FRAMES, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.onnx.export(wrapped, (x,), out, dynamo=False, opset_version=17,
                          input_names=["input_features"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}})


def recipes() -> list[Recipe]:
    return [
        text_recipe("bert", "ts", 14, subset=("ci", "all")),
        text_recipe("bert", "ts", 17),
        text_recipe("distilbert", "ts", 17),
        text_recipe("bert", "dynamo", 18),
        Recipe(name="ts_whisper_tiny_encoder_op17", family="audio",
               exporter="torch.onnx TorchScript opset 17", build=whisper_build,
               feeds={"input_features": Feed([1, MEL, FRAMES], -1.0, 1.0)},
               params={"src": "transformers", "kind": "whisper_encoder", "mel": MEL, "frames": FRAMES, "v": 1},
               needs=("torch", "transformers")),
    ]
