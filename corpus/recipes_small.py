"""Small on-device nets, where the time per op, not per multiply-add, decides (issue 25).

Why: face-detection cascades run their second and third nets once per candidate box, hundreds
of times per frame; a speech front end turns audio into mel features before every model of the
audio family; an OCR pipeline's text detector is an FPN with transposed convs and resizes. Their
layers are tiny (a 24x24 input, [1, 40, 100] features) or shaped unlike the classification
nets: the numpy paths and per-step costs show up here first. Seeded random weights, written by
the TorchScript exporter as such models are shipped.

- `ts_mtcnn_rnet_op11`: MTCNN's R-net (24x24 input): 3x3 convs with PReLU, 3x3/2 max pooling
  with ceil_mode, a 2x2 conv, Linear 576->128 with PReLU, a Softmax face head and a box head.
- `ts_mtcnn_pnet_op11_dynhw`: MTCNN's P-net, fully convolutional, height and width dynamic (it
  runs once per scale of the image pyramid): 3x3 convs with PReLU, a 2x2/2 max pool, 1x1 heads.
- `ts_mel_frontend_op17`: a log-mel front end as speech models export it without STFT support:
  the framed DFT as a strided Conv1d (400-sample window, hop 160) of cos and sin kernels, power,
  a MatMul with 40 mel filters, log(x + 1e-6); input [1, 16000] (one second at 16 kHz).
- `ts_fpn_text_detector_op13`: a DBNet-like text detector: a strided conv backbone (BN, ReLU),
  FPN laterals (1x1 convs) merged top-down with nearest Upsample + Add, the levels upsampled to
  1/4 and concatenated, then a head of Conv + BN + ReLU, two ConvTranspose 2x2/2 and a Sigmoid
  probability map; input [1, 3, 320, 320] with height and width dynamic.
"""
from __future__ import annotations

from common import Feed, Recipe, seed_everything, seeded_eval

MEL_BINS, SAMPLE_RATE, WINDOW, HOP = 40, 16000, 400, 160
FPN_SIZE = 320


# ------------------------------------------------------------------------- MTCNN
def _rnet():
    import torch
    from torch import nn

    class RNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 28, 3), nn.PReLU(28), nn.MaxPool2d(3, 2, ceil_mode=True),
                nn.Conv2d(28, 48, 3), nn.PReLU(48), nn.MaxPool2d(3, 2, ceil_mode=True),
                nn.Conv2d(48, 64, 2), nn.PReLU(64))
            self.fc = nn.Linear(576, 128)
            self.prelu = nn.PReLU(128)
            self.cls = nn.Linear(128, 2)
            self.box = nn.Linear(128, 4)

        def forward(self, x):
            y = self.body(x).permute(0, 3, 2, 1).flatten(1)  # facenet-pytorch's order
            y = self.prelu(self.fc(y))
            return torch.softmax(self.cls(y), dim=1), self.box(y)

    return seeded_eval(RNet)


def _pnet():
    import torch
    from torch import nn

    class PNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 10, 3), nn.PReLU(10), nn.MaxPool2d(2, 2, ceil_mode=True),
                nn.Conv2d(10, 16, 3), nn.PReLU(16), nn.Conv2d(16, 32, 3), nn.PReLU(32))
            self.cls = nn.Conv2d(32, 2, 1)
            self.box = nn.Conv2d(32, 4, 1)

        def forward(self, x):
            y = self.body(x)
            return torch.softmax(self.cls(y), dim=1), self.box(y)

    return seeded_eval(PNet)


def mtcnn_build(net: str):
    def build(out: str, ctx: dict) -> None:
        import torch
        seed_everything()
        model = _rnet() if net == "rnet" else _pnet()
        size = 24 if net == "rnet" else 48
        x = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0))
        axes = None if net == "rnet" else {"image": {2: "height", 3: "width"}}
        with torch.no_grad():
            torch.onnx.export(model, (x,), out, dynamo=False, opset_version=11, input_names=["image"],
                              output_names=["prob", "box"], dynamic_axes=axes)
    return build


# ------------------------------------------------------------------------- mel front end
def mel_build(out: str, ctx: dict) -> None:
    import numpy as np
    import torch
    from torch import nn

    class LogMel(nn.Module):
        """[1, samples] -> [1, 40, frames] log-mel power, the DFT as a Conv1d (no STFT op)."""
        def __init__(self):
            super().__init__()
            bins = WINDOW // 2 + 1
            n = np.arange(WINDOW)
            window = 0.5 - 0.5 * np.cos(2 * np.pi * n / WINDOW)  # Hann
            k = np.arange(bins)[:, None]
            cos = np.cos(2 * np.pi * k * n / WINDOW) * window
            sin = -np.sin(2 * np.pi * k * n / WINDOW) * window
            self.dft = nn.Conv1d(1, 2 * bins, WINDOW, stride=HOP, bias=False)
            self.dft.weight.data = torch.tensor(np.concatenate([cos, sin])[:, None, :], dtype=torch.float32)
            # triangular filters, evenly spaced on the mel scale between 0 and 8 kHz
            mel = np.linspace(0, 2595 * np.log10(1 + (SAMPLE_RATE / 2) / 700), MEL_BINS + 2)
            hz = 700 * (10 ** (mel / 2595) - 1)
            edges = np.floor((WINDOW + 1) * hz / SAMPLE_RATE).astype(int)
            fb = np.zeros((bins, MEL_BINS), dtype=np.float32)
            for m in range(1, MEL_BINS + 1):
                lo, mid, hi = edges[m - 1], edges[m], edges[m + 1]
                fb[lo:mid, m - 1] = (np.arange(lo, mid) - lo) / max(mid - lo, 1)
                fb[mid:hi, m - 1] = (hi - np.arange(mid, hi)) / max(hi - mid, 1)
            self.register_buffer("fb", torch.tensor(fb))
            self.bins = bins

        def forward(self, audio):
            spec = self.dft(audio.unsqueeze(1))                      # [1, 2 * bins, frames]
            re, im = spec[:, :self.bins], spec[:, self.bins:]
            power = (re * re + im * im).transpose(1, 2)              # [1, frames, bins]
            return torch.log(torch.matmul(power, self.fb) + 1e-6).transpose(1, 2)

    seed_everything()
    model = LogMel().eval()
    x = torch.rand(1, SAMPLE_RATE, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=False, opset_version=17, input_names=["audio"],
                          output_names=["logmel"])


# ------------------------------------------------------------------------- FPN text detector
def fpn_build(out: str, ctx: dict) -> None:
    import torch
    from torch import nn
    from torch.nn import functional as F

    def cbr(cin, cout, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(cbr(3, 16, 2), cbr(16, 16))
            self.c2, self.c3, self.c4, self.c5 = cbr(16, 24, 2), cbr(24, 40, 2), cbr(40, 64, 2), cbr(64, 96, 2)
            self.lat = nn.ModuleList(nn.Conv2d(c, 64, 1, bias=False) for c in (24, 40, 64, 96))
            self.smooth = nn.ModuleList(nn.Conv2d(64, 16, 3, padding=1, bias=False) for _ in range(4))
            self.head = nn.Sequential(
                nn.Conv2d(64, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                nn.ConvTranspose2d(16, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
                nn.ConvTranspose2d(16, 1, 2, 2))

        def forward(self, x):
            c2 = self.c2(self.stem(x))
            c3 = self.c3(c2)
            c4 = self.c4(c3)
            c5 = self.c5(c4)
            p5 = self.lat[3](c5)
            p4 = self.lat[2](c4) + F.interpolate(p5, scale_factor=2.0, mode="nearest")
            p3 = self.lat[1](c3) + F.interpolate(p4, scale_factor=2.0, mode="nearest")
            p2 = self.lat[0](c2) + F.interpolate(p3, scale_factor=2.0, mode="nearest")
            levels = [self.smooth[0](p2),
                      F.interpolate(self.smooth[1](p3), scale_factor=2.0, mode="nearest"),
                      F.interpolate(self.smooth[2](p4), scale_factor=4.0, mode="nearest"),
                      F.interpolate(self.smooth[3](p5), scale_factor=8.0, mode="nearest")]
            return torch.sigmoid(self.head(torch.cat(levels, 1)))

    seed_everything()
    model = seeded_eval(Detector)
    x = torch.rand(1, 3, FPN_SIZE, FPN_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.onnx.export(model, (x,), out, dynamo=False, opset_version=13, input_names=["image"],
                          output_names=["prob"], dynamic_axes={"image": {2: "height", 3: "width"},
                                                               "prob": {2: "height", 3: "width"}})


def recipes() -> list[Recipe]:
    return [
        Recipe(name="ts_mtcnn_rnet_op11", family="detection",
               exporter="torch.onnx TorchScript opset 11 (MTCNN R-net: PReLU, ceil_mode MaxPool, Linear heads)",
               build=mtcnn_build("rnet"), feeds={"image": Feed([1, 3, 24, 24], -1.0, 1.0)},
               params={"src": "torch", "model": "RNet", "v": 1}, subset=("ci", "all"), needs=("torch",)),
        Recipe(name="ts_mtcnn_pnet_op11_dynhw", family="detection",
               exporter="torch.onnx TorchScript opset 11 (MTCNN P-net, fully convolutional), height/width dynamic",
               build=mtcnn_build("pnet"), feeds={"image": Feed([1, 3, 120, 160], -1.0, 1.0)},
               params={"src": "torch", "model": "PNet", "v": 1}, subset=("ci", "all"), needs=("torch",)),
        Recipe(name="ts_mel_frontend_op17", family="audio",
               exporter="torch.onnx TorchScript opset 17 (log-mel front end: DFT as a strided Conv1d, "
                        "power, mel MatMul, Log)",
               build=mel_build, feeds={"audio": Feed([1, SAMPLE_RATE], -1.0, 1.0)},
               params={"src": "torch", "model": "LogMel", "v": 1}, subset=("ci", "all"), needs=("torch", "numpy")),
        Recipe(name="ts_fpn_text_detector_op13", family="detection",
               exporter="torch.onnx TorchScript opset 13 (DBNet-like FPN: nearest Resize + Add, Concat, "
                        "ConvTranspose head), height/width dynamic",
               build=fpn_build, feeds={"image": Feed([1, 3, FPN_SIZE, FPN_SIZE], 0.0, 1.0)},
               params={"src": "torch", "model": "FPNTextDetector", "v": 1}, subset=("ci", "all"),
               needs=("torch",)),
    ]
