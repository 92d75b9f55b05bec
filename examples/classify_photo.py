"""Classify the bundled photo on `opencl,arm`: build a small classifier in ONNX, optimize it with
`opt`, and run it on examples/data/sunset.png with `optcli run --top_k`.

    python examples/classify_photo.py [--out DIR] [--photo FILE.png]

The classifier is built here with hand-set weights, so its answer means something without any
training: a 3x3 blur, a ReLU, global average pooling (the photo's mean colour) and a fully
connected layer scoring "warm", "green", "blue" and "neutral" colour casts.  It needs Pillow to
read the photo: pip install 'optcli[images]'.  With no OpenCL device the GPU steps run on the
CPU (with a warning).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
LABELS = ["warm (red, orange)", "green (foliage)", "blue (sky, sea)", "neutral (grey)"]


def colour_classifier(size: tuple[int, int] = (64, 96)) -> onnx.ModelProto:
    blur = np.zeros((8, 3, 3, 3), np.float32)  # 8 output channels: a multiple of 4 suits the GPU layout
    for c in range(3):
        blur[c, c] = 1 / 9
    fc = np.zeros((8, 4), np.float32)  # [features, classes]: each colour against the mean of the others
    for c in range(3):
        fc[c, c] = 12.0
        fc[[k for k in range(3) if k != c], c] = -6.0
    bias = np.array([0, 0, 0, 1.0], np.float32)  # "neutral" wins when no channel stands out
    nodes = [
        helper.make_node("Conv", ["image", "blur"], ["blurred"], pads=[1, 1, 1, 1], name="blur"),
        helper.make_node("Relu", ["blurred"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["pooled"], name="mean_colour"),
        helper.make_node("Flatten", ["pooled"], ["features"], name="flatten"),
        helper.make_node("Gemm", ["features", "fc", "bias"], ["logits"], name="classify"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "colour_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, *size])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(blur, "blur"), numpy_helper.from_array(fc, "fc"),
         numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tool(name: str) -> str:
    # Prefer the command installed beside this Python: LLVM ships an unrelated `opt` on many machines.
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name) or name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="classify_out", help="folder for the .onnx, .nb and outputs")
    parser.add_argument("--photo", default=str(HERE / "data" / "sunset.png"), help="the image to classify")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(colour_classifier(), out / "classifier.onnx")
    (out / "labels.txt").write_text("\n".join(LABELS) + "\n")

    # The model is tiny: left alone, opt would keep it on the CPU because copying the photo to the
    # GPU costs more than the GPU saves. Disabling that pass shows the GPU path end to end.
    steps = [
        [tool("opt"), f"--model_file={out / 'classifier.onnx'}", "--valid_targets=opencl,arm",
         f"--optimize_out={out / 'classifier'}", "--disable_pass=keep_small_islands_on_host", "--advise"],
        [tool("optcli"), "run", str(out / "classifier.nb"), f"--input=image={args.photo}", "--top_k=2",
         f"--labels={out / 'labels.txt'}", f"--output_dir={out / 'outputs'}"],
    ]
    for cmd in steps:
        print("$", " ".join(cmd), flush=True)
        result = subprocess.run(cmd)
        if result.returncode != 0:
            return result.returncode
    probs = np.load(out / "outputs" / "probs.npy")
    print(f"the photo looks {LABELS[int(probs.argmax())]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
