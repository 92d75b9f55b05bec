"""Recurrent and control-flow models: LSTM / GRU exports, an `If` around the whole net, a `Loop`
decoder, onnxruntime's DynamicQuantizeLSTM, and a file whose declared output shape is wrong.

Why: speech, denoising, voice-activity and OCR models are where ONNX files carry LSTM / GRU
nodes (with the gate reordering the TorchScript exporter writes around them), control flow
(`If` from a scripted branch, as silero VAD ships; `Loop` from paddle2onnx's table-structure
decoders) and shapes the exporter got wrong (PyTorch 1.9's CRNN recognisers). All weights are
seeded random ones; the sizes are small so the whole file builds in seconds.

- `ts_lstm_speech_*`: mel features [1, T, 40] -> bidirectional LSTM -> LSTM -> Linear, TorchScript
  exporter opset 14, T dynamic or fixed at 100.
- `ts_gru_denoiser_*`: Conv1d front end over [1, T, 64] features -> 2 GRUs -> Linear -> Sigmoid mask.
- `ts_script_vad_if_op16`: a torch.jit.script module `if sr == 16000: net16 else: net8`, each net
  Conv1d + 2-layer LSTM with (h, c) state in and out; the exporter writes the two nets as the
  branches of one top-level `If` (Equal -> Cast -> If), like silero VAD.
- `qdyn_lstm_speech`: onnxruntime quantize_dynamic of the dynamic-T speech model: the LSTMs
  become `com.microsoft.DynamicQuantizeLSTM` (checked at build), the Linear MatMulInteger.
  `reduce_range=True` (7-bit weights): with 8-bit ones onnxruntime's x86 AVX2 / AVX-512 uint8 x
  int8 kernel saturates pairs of products in int16 (its ARM and VNNI kernels do not), so its
  reference would depend on the host it runs on (docs/quantization.md, DynamicQuantizeLSTM).
- `oscript_table_decoder_loop40`: a paddle2onnx-style table-structure decoder written with
  onnxscript (not paddle2onnx: paddle is a separate, large stack): a `Loop` of 40 steps around
  an attention GRU cell built of MatMul/Add/Split/Sigmoid/Tanh, `OneHot` with a rank-1 depth
  inside the body, `ArgMax` fed back as the next step's token, per-step results written into
  carried [1, 40, K] tensors with ScatterND (paddle's `preds[:, i, :] = step`).
- `ts_crnn_bilstm_op14_badshape`: CNN + bidirectional LSTM recogniser, output [W/8, 1, 37]; the
  file is then edited so the graph output declares `[1, 'seqlen']`, imitating what PyTorch 1.9's
  exporter wrote for such recognisers (torch 2.13 writes the right shape, so the lie is put back
  by hand). A runtime must trust the computed shape, not the declared one.
"""
from __future__ import annotations

from common import Feed, Recipe, seed_everything, seeded_eval

MEL, SPEECH_CLASSES, SPEECH_T = 40, 29, 100
DENOISE_BINS = 64
VAD_STATE = [2, 1, 64]
TABLE_C, TABLE_HW, TABLE_H, TABLE_K, TABLE_LOC, TABLE_STEPS = 96, 8, 96, 30, 8, 40
CRNN_CLASSES, CRNN_H, CRNN_W = 37, 32, 128


# ------------------------------------------------------------------------- torch models
def _speech_model():
    import torch
    from torch import nn

    class SpeechLSTM(nn.Module):
        """Acoustic model: [1, T, 40] log-mel -> BiLSTM(64) -> LSTM(64) -> per-frame logits."""
        def __init__(self):
            super().__init__()
            self.rnn1 = nn.LSTM(MEL, 64, batch_first=True, bidirectional=True)
            self.rnn2 = nn.LSTM(128, 64, batch_first=True)
            self.fc = nn.Linear(64, SPEECH_CLASSES)

        def forward(self, x):
            y, _ = self.rnn1(x)
            y, _ = self.rnn2(y)
            return self.fc(y)

    seed_everything()
    return SpeechLSTM().eval(), torch.randn(1, SPEECH_T, MEL, generator=torch.Generator().manual_seed(0))


def _denoiser_model():
    import torch
    from torch import nn

    class GRUDenoiser(nn.Module):
        """[1, T, 64] noisy features -> Conv1d x2 -> GRU -> GRU -> Linear -> Sigmoid gain mask."""
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(DENOISE_BINS, 96, 3, padding=1)
            self.conv2 = nn.Conv1d(96, 96, 3, padding=1)
            self.gru1 = nn.GRU(96, 96, batch_first=True)
            self.gru2 = nn.GRU(96, 96, batch_first=True)
            self.fc = nn.Linear(96, DENOISE_BINS)

        def forward(self, x):
            y = torch.relu(self.conv1(x.transpose(1, 2)))
            y = torch.relu(self.conv2(y)).transpose(1, 2)
            y, _ = self.gru1(y)
            y, _ = self.gru2(y)
            return torch.sigmoid(self.fc(y))

    seed_everything()
    return GRUDenoiser().eval(), torch.rand(1, SPEECH_T, DENOISE_BINS, generator=torch.Generator().manual_seed(0))


def rnn_build(kind: str, dynamic_time: bool):
    def build(out: str, ctx: dict) -> None:
        import torch
        model, x = _speech_model() if kind == "speech" else _denoiser_model()
        inp, outp = ("mel", "logits") if kind == "speech" else ("noisy", "mask")
        axes = {inp: {1: "time"}, outp: {1: "time"}} if dynamic_time else None
        with torch.no_grad():
            torch.onnx.export(model, (x,), out, dynamo=False, opset_version=14,
                              input_names=[inp], output_names=[outp], dynamic_axes=axes)
    return build


def vad_build(out: str, ctx: dict) -> None:
    """silero-VAD-like: the whole net inside an `If` on the sample rate, scripted so the
    TorchScript exporter writes the branch (tracing would keep only the branch taken)."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, win: int):
            super().__init__()
            self.feat = nn.Conv1d(1, 32, win, stride=win // 2, padding=win // 4)
            self.enc = nn.Conv1d(32, 64, 3, padding=1)
            self.lstm = nn.LSTM(64, 64, num_layers=2, batch_first=True)
            self.dec = nn.Conv1d(64, 1, 1)

        def forward(self, x, h, c):
            y = torch.relu(self.feat(x.unsqueeze(1)))
            y = torch.relu(self.enc(y)).permute(0, 2, 1)
            y, (hn, cn) = self.lstm(y, (h, c))
            out = torch.sigmoid(self.dec(y.permute(0, 2, 1))).mean(2)
            return out, hn, cn

    class VAD(nn.Module):
        def __init__(self):
            super().__init__()
            self.net16 = Net(64)
            self.net8 = Net(32)

        def forward(self, x, sr, h, c):
            if bool(sr == 16000):
                return self.net16(x, h, c)
            else:
                return self.net8(x, h, c)

    seed_everything()
    model = torch.jit.script(VAD().eval())
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 512, generator=g), torch.tensor(16000), torch.zeros(VAD_STATE), torch.zeros(VAD_STATE))
    with torch.no_grad():
        torch.onnx.export(model, args, out, dynamo=False, opset_version=16,
                          input_names=["input", "sr", "h", "c"], output_names=["output", "hn", "cn"],
                          dynamic_axes={"input": {1: "samples"}})


def crnn_build(out: str, ctx: dict) -> None:
    import onnx
    import torch
    from torch import nn

    def block(cin, cout, pool):
        return [nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(pool)]

    class CRNN(nn.Module):
        """[1, 1, 32, W] -> CNN (H/8 -> 1, W/8) -> BiLSTM(64) -> Linear: [W/8, 1, 37] (T, N, C)."""
        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(*block(1, 32, 2), *block(32, 64, 2), *block(64, 128, 2),
                                     nn.Conv2d(128, 128, (CRNN_H // 8, 1)), nn.ReLU())
            self.rnn = nn.LSTM(128, 64, bidirectional=True)
            self.fc = nn.Linear(128, CRNN_CLASSES)

        def forward(self, x):
            y = self.cnn(x).squeeze(2).permute(2, 0, 1)      # T, N, C
            y, _ = self.rnn(y)
            return self.fc(y)

    model = seeded_eval(CRNN)                      # non-trivial BN stats so folding matters
    x = torch.rand(1, 1, CRNN_H, CRNN_W, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=False, opset_version=14, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {3: "width"}, "output": {0: "seqlen"}})
    # PyTorch 1.9 declared such outputs with the wrong rank and dims; torch 2.13 gets it right,
    # so the lie is written back: output declared [1, 'seqlen'] while it computes [W/8, 1, 37].
    m = onnx.load(out)
    shape = m.graph.output[0].type.tensor_type.shape
    del shape.dim[:]
    shape.dim.add().dim_value = 1
    shape.dim.add().dim_param = "seqlen"
    onnx.save(m, out)


# ------------------------------------------------------------------------- Loop decoder
def table_decoder_build(out: str, ctx: dict) -> None:
    import os
    import subprocess
    import sys

    import onnx
    import onnx_ir as ir
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    # In a child with a fixed hash seed: onnxscript orders the Loop's carried values by a set.
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oscript_table_decoder.py")
    subprocess.run([sys.executable, script, out], check=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    model = ir.from_proto(onnx.load(out))
    for value, name in zip(model.graph.outputs, ("structure_probs", "loc_preds")):
        value.name = name                                      # onnxscript numbers them (probs_46)
    LiftConstantsToInitializersPass()(model)                  # weights as initializers, like paddle2onnx
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto)
    onnx.save(proto, out)


# ------------------------------------------------------------------------- quantization
def qdyn_lstm_build(base: str):
    def build(out: str, ctx: dict) -> None:
        import onnx
        from recipes_derived import quant_dynamic_build
        quant_dynamic_build(base, reduce_range=True)(out, ctx)
        ops = {(n.domain, n.op_type) for n in onnx.load(out).graph.node}
        if ("com.microsoft", "DynamicQuantizeLSTM") not in ops:
            raise RuntimeError(f"quantize_dynamic wrote no com.microsoft.DynamicQuantizeLSTM: {sorted(ops)}")
    return build


def recipes() -> list[Recipe]:
    speech_label = "torch.onnx TorchScript opset 14 (batch_first LSTMs: one bidirectional, one not)"
    denoise_label = "torch.onnx TorchScript opset 14 (Conv1d front end, 2 GRUs, Sigmoid mask)"
    dyn_speech = "ts_lstm_speech_op14_dyntime"
    return [
        Recipe(name=dyn_speech, family="audio", exporter=speech_label + ", dynamic time",
               build=rnn_build("speech", True), feeds={"mel": Feed([1, SPEECH_T, MEL], -1.0, 1.0)},
               params={"src": "torch", "model": "SpeechLSTM", "dynamic_time": True, "v": 1},
               subset=("ci", "all"), needs=("torch",)),
        Recipe(name="ts_lstm_speech_op14", family="audio", exporter=speech_label + ", T fixed at 100",
               build=rnn_build("speech", False), feeds={"mel": Feed([1, SPEECH_T, MEL], -1.0, 1.0)},
               params={"src": "torch", "model": "SpeechLSTM", "dynamic_time": False, "v": 1},
               needs=("torch",)),
        Recipe(name="ts_gru_denoiser_op14_dyntime", family="audio", exporter=denoise_label + ", dynamic time",
               build=rnn_build("denoiser", True), feeds={"noisy": Feed([1, SPEECH_T, DENOISE_BINS], 0.0, 1.0)},
               params={"src": "torch", "model": "GRUDenoiser", "dynamic_time": True, "v": 1},
               subset=("ci", "all"), needs=("torch",)),
        Recipe(name="ts_script_vad_if_op16", family="audio",
               exporter="torch.onnx TorchScript opset 16 of a torch.jit.script module (If on sr; "
                        "Conv1d + 2-layer LSTM with state in each branch)",
               build=vad_build,
               feeds={"input": Feed([1, 512], -1.0, 1.0), "sr": Feed([], 16000, 16001),
                      "h": Feed(VAD_STATE, -0.5, 0.5), "c": Feed(VAD_STATE, -0.5, 0.5)},
               params={"src": "torch", "model": "ScriptedVAD", "v": 1}, subset=("ci", "all"), needs=("torch",)),
        Recipe(name="qdyn_lstm_speech", family="audio",
               exporter="onnxruntime quantize_dynamic QOperator (com.microsoft.DynamicQuantizeLSTM, MatMulInteger)",
               build=qdyn_lstm_build(dyn_speech), feeds={"mel": Feed([1, SPEECH_T, MEL], -1.0, 1.0)},
               params={"kind": "qdyn", "base": dyn_speech, "reduce_range": True, "v": 2}, subset=("ci", "all"),
               deps=(dyn_speech,),
               needs=("onnx", "onnxruntime")),
        Recipe(name="oscript_table_decoder_loop40", family="text",
               exporter="onnxscript @script opset 17, paddle2onnx-style Loop decoder (40 steps, attention "
                        "GRU cell, OneHot, ArgMax fed back; not paddle2onnx), constants lifted to "
                        "initializers by onnx_ir",
               build=table_decoder_build,
               feeds={"x": Feed([1, TABLE_C, TABLE_HW, TABLE_HW], 0.0, 1.0)},
               params={"src": "onnxscript", "model": "TableDecoder", "steps": TABLE_STEPS, "v": 3},
               subset=("ci", "all"), needs=("onnxscript", "onnx_ir", "numpy")),
        Recipe(name="ts_crnn_bilstm_op14_badshape", family="text",
               exporter="torch.onnx TorchScript opset 14 (CNN + BiLSTM), output declared [1, 'seqlen'] "
                        "by an onnx edit imitating torch 1.9 (computes [W/8, 1, 37])",
               build=crnn_build, feeds={"input": Feed([1, 1, CRNN_H, CRNN_W], 0.0, 1.0)},
               params={"src": "torch", "model": "CRNN", "v": 1}, subset=("ci", "all"), needs=("torch", "onnx")),
    ]
