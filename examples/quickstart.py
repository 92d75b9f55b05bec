"""Quickstart: build a MobileNetV2-like ONNX model, optimize it with `opt`, run the .nb and
compare with onnxruntime.

    python examples/quickstart.py [--out DIR]

It writes DIR/mobilenet_v2.onnx, runs the real `opt` command on it (as a user would), loads
the resulting DIR/mobilenet_v2.nb with optcli's runtime and prints the largest difference from
onnxruntime's output.  Exit code 0 when they agree within the fp32 tolerance.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx

import optcli
from optcli.tolerance import RELATIVE, max_error
from optcli.zoo import build, sample_inputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="quickstart_out", help="folder for the .onnx, .nb and report")
    parser.add_argument("--resolution", type=int, default=224)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = build("mobilenet_v2", full=True, resolution=args.resolution)
    onnx.save(model, out / "mobilenet_v2.onnx")
    print(f"built {out / 'mobilenet_v2.onnx'}")

    # Prefer the `opt` installed beside this Python: LLVM ships an unrelated `opt` on many machines.
    opt = shutil.which("opt", path=str(Path(sys.executable).parent)) or shutil.which("opt")
    cmd = [opt, f"--model_file={out / 'mobilenet_v2.onnx'}", "--valid_targets=arm",
           f"--optimize_out={out / 'mobilenet_v2'}", f"--report={out / 'report.json'}"]
    print("$", " ".join(cmd))
    subprocess.run(cmd, check=True)

    predictor = optcli.load(out / "mobilenet_v2.nb")
    feeds = sample_inputs(model)
    start = time.perf_counter()
    ours = predictor.run(feeds)["output"]
    elapsed = time.perf_counter() - start

    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = sess.run(None, feeds)[0]
    err, scale = max_error(ours, reference)
    ok = err <= RELATIVE["fp32"] * scale
    print(f"optcli output {ours.shape}, first run {elapsed * 1e3:.1f} ms; max |optcli - onnxruntime| = "
          f"{err:.2e} (scale {scale:.2f}): {'OK' if ok else 'MISMATCH'}")
    print(f"top-1 class: optcli {int(ours.argmax())}, onnxruntime {int(reference.argmax())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
