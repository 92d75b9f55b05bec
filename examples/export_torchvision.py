"""Export a torchvision (or timm) model to ONNX and optimize it for `opencl,arm`.

    python examples/export_torchvision.py [--model resnet18] [--timm] [--out DIR] [--resolution 224]

Needs PyTorch and torchvision (or timm with --timm); it is not an optcli dependency. Without
them the script says what to install and exits with code 2. The weights are random (no
download): the point is the export and optimize path; pass --pretrained to download them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="torchvision (or timm) model name")
    parser.add_argument("--timm", action="store_true", help="take the model from timm instead of torchvision")
    parser.add_argument("--pretrained", action="store_true", help="download the pretrained weights")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--out", default="export_out")
    args = parser.parse_args()
    try:
        import torch

        if args.timm:
            import timm
        else:
            import torchvision
    except ImportError as exc:
        print(f"export_torchvision.py: this example needs PyTorch and {'timm' if args.timm else 'torchvision'} "
              f"({exc.name} is not installed): pip install torch {'timm' if args.timm else 'torchvision'}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.timm:
        model = timm.create_model(args.model, pretrained=args.pretrained)
    else:
        model = torchvision.models.get_model(args.model, weights="DEFAULT" if args.pretrained else None)
    model.eval()
    x = torch.randn(1, 3, args.resolution, args.resolution)
    onnx_path = out / f"{args.model}.onnx"
    torch.onnx.export(model, (x,), str(onnx_path), input_names=["input"], output_names=["output"], opset_version=17)
    print(f"exported {onnx_path}")
    opt = shutil.which("opt", path=str(Path(sys.executable).parent)) or "opt"
    optcli = shutil.which("optcli", path=str(Path(sys.executable).parent)) or "optcli"
    for cmd in ([opt, f"--model_file={onnx_path}", "--valid_targets=opencl,arm", f"--optimize_out={out / args.model}",
                 f"--report={out / 'report.json'}", "--advise"],
                [optcli, "bench", str(out / f"{args.model}.nb"), "--runs=10", f"--compare_onnx={onnx_path}"]):
        print("$", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
