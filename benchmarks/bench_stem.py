"""Per-layer timings of the stem convolutions (dense convs with few input channels) on the host
target: optcli's native stem conv (kernels/host/stem.c) against the implicit GEMM it replaced for them
(numpy zero-padding, then kernels/host/gemm.c) and against onnxruntime running the one Conv (+ Relu) node.

The shapes are the first convs of MobileNetV2 / V3, EfficientNet-Lite0 and ResNet-18 at 224x224,
of the mediapipe face / hand / selfie models at their resolutions, and a few 3x3 convs of up to
64 channels, which the stem conv also takes (``native.stem_fits``).  Timing as in
bench_gemm.py: blocks of calls, forth and back, each block warmed up, minimum of ``--runs``.
Not a test: timings belong to a quiet machine.

    python benchmarks/bench_stem.py --threads 2 --runs 40
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: benchmarks/ is a package of the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_gemm import best_of, layer_data, ort_layer, setup  # noqa: E402
from optcli import native  # noqa: E402
from optcli.ops import conv  # noqa: E402

S2P1 = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
# (label, x shape, w shape, attrs)
LAYERS = [
    ("3x3/2 3->16 @224 MNv3", (1, 3, 224, 224), (16, 3, 3, 3), S2P1),
    ("3x3/2 3->32 @224 MNv2", (1, 3, 224, 224), (32, 3, 3, 3), S2P1),
    ("7x7/2 3->64 @224 RN18", (1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ("5x5/2 3->24 @128 face", (1, 3, 128, 128), (24, 3, 5, 5), {"strides": [2, 2], "pads": [1, 1, 2, 2]}),
    ("3x3/2 3->16 @192 mesh", (1, 3, 192, 192), (16, 3, 3, 3), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("3x3/2 3->32 @192 palm", (1, 3, 192, 192), (32, 3, 3, 3), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("3x3/2 3->16 @256 selfie", (1, 3, 256, 256), (16, 3, 3, 3), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("3x3 1->32 @28", (1, 1, 28, 28), (32, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3 4->32 @112", (1, 4, 112, 112), (32, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    # beyond the stems (native.stem_fits): ResNet-18's first stage, a YOLO-like neck, an FPN level
    ("3x3 64->64 @56 RN18", (1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3/2 32->64 @160", (1, 32, 160, 160), (64, 32, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("3x3 16->16 @112", (1, 16, 112, 112), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3 64->64 @14", (1, 64, 14, 14), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
]


def main() -> None:
    args = setup(__doc__)
    rng = np.random.default_rng(0)
    totals = np.zeros(3)
    print(f"{'layer':24s} {'stem':>9s} {'GEMM':>9s} {'ort':>9s}  stem/GEMM  stem/ort   (us, min of {args.runs})")
    with threadpoolctl.threadpool_limits(args.threads, user_api="blas"):
        for label, xs, ws, attrs in LAYERS:
            x, w, b = layer_data(rng, xs, ws)
            full = {"kernel_shape": list(ws[2:]), "activation": "relu", **attrs}

            def gemm(x=x, w=w, b=b, full=full):
                with mock.patch.object(native, "stem_fits", lambda *a: False):
                    return conv.conv_im2col([x, w, b], dict(full))

            calls = [lambda x=x, w=w, b=b, full=full: conv.conv_im2col([x, w, b], dict(full)), gemm,
                     ort_layer(x, w, b, attrs, args.threads)]
            assert np.allclose(calls[0]()[0], calls[1]()[0], rtol=1e-4, atol=1e-4)
            us = best_of(calls, args.runs)
            totals += us
            print(f"{label:24s} {us[0]:9.1f} {us[1]:9.1f} {us[2]:9.1f}  {us[0] / us[1]:8.2f}x {us[0] / us[2]:8.2f}x")
    print(f"{'total':24s} {totals[0]:9.0f} {totals[1]:9.0f} {totals[2]:9.0f}  {totals[0] / totals[1]:8.2f}x "
          f"{totals[0] / totals[2]:8.2f}x")


if __name__ == "__main__":
    main()
