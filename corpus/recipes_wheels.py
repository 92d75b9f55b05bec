"""Pretrained models that ship inside PyPI wheels: nudenet's YOLOv8n detector and mediapipe's
.tflite models converted to ONNX.

Why: these are real trained weights in real exporter output. nudenet's `320n.onnx` was written
by torch.onnx (pytorch 2.3, opset 17) with symbolic batch/height/width and the huge symbolic
output dims that Ultralytics exports carry. mediapipe's models come from TFLite; the two
converters write them differently: tflite2onnx rewrites the graph to NCHW (and supports fewer
ops: no HARD_SWISH, DENSIFY, CUSTOM), tf2onnx keeps the NHWC input and puts Transposes at the
edges, as keras/tflite-derived ONNX files in the wild look.

mediapipe >= 1.0 no longer ships its .tflite files (they moved to downloadable .task bundles),
and mediapipe 0.10.21 pins numpy < 2, so it is not installed: its wheel is fetched with
`pip download mediapipe==0.10.21 --no-deps` into the cache and the .tflite files are read from
the zip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

from common import Feed, Recipe

MEDIAPIPE = "mediapipe==0.10.21"


def nudenet_build(out: str, ctx: dict) -> None:
    import importlib.util
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nudenet is not installed")
    src = os.path.join(list(spec.submodule_search_locations)[0], "320n.onnx")
    shutil.copyfile(src, out)


def _mediapipe_wheel(cache: str) -> str:
    wheels = os.path.join(cache, "_wheels")
    os.makedirs(wheels, exist_ok=True)
    found = [f for f in os.listdir(wheels) if f.startswith("mediapipe-0.10.21-") and f.endswith(".whl")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", MEDIAPIPE, "--no-deps",
                        "--only-binary=:all:", "-d", wheels], check=True)
        found = [f for f in os.listdir(wheels) if f.startswith("mediapipe-0.10.21-")]
    return os.path.join(wheels, found[0])


def _extract_tflite(cache: str, member: str, dest_dir: str) -> str:
    with zipfile.ZipFile(_mediapipe_wheel(cache)) as z:
        path = os.path.join(dest_dir, os.path.basename(member))
        with z.open("mediapipe/modules/" + member) as f, open(path, "wb") as g:
            shutil.copyfileobj(f, g)
    return path


def _run(cmd: list[str], cwd: str) -> None:
    """Run a converter in `cwd` with relative paths and a fixed hash seed: tf2onnx writes the
    input path into the model, and both converters iterate over sets (node order)."""
    env = dict(os.environ, PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if p.returncode != 0:
        lines = [line for line in (p.stderr + p.stdout).strip().splitlines() if line.strip()]
        raise RuntimeError(" | ".join(lines[-2:]) if lines else f"exit {p.returncode}")


def _sort_initializers(path: str) -> None:
    """tflite2onnx writes initializers and value_info in set order (varies run to run): sort."""
    import onnx
    m = onnx.load(path)
    for field in (m.graph.initializer, m.graph.value_info):
        items = sorted(field, key=lambda t: t.name)
        del field[:]
        field.extend(items)
    onnx.save(m, path)


def tflite_build(member: str, converter: str, opset: int):
    def build(out: str, ctx: dict) -> None:
        where = os.path.dirname(out)
        tfl = os.path.basename(_extract_tflite(ctx["cache"], member, where))
        try:
            if converter == "tflite2onnx":
                _run([sys.executable, "-c", "import sys, tflite2onnx; tflite2onnx.convert(sys.argv[1], sys.argv[2])",
                      tfl, os.path.basename(out)], where)
                _sort_initializers(out)
            else:
                _run([sys.executable, "-m", "tf2onnx.convert", "--tflite", tfl, "--output",
                      os.path.basename(out), "--opset", str(opset)], where)
        finally:
            os.remove(os.path.join(where, tfl))
    return build


def tflite_recipe(member: str, converter: str, family: str, shape: list[int], opset: int = 17,
                  subset=("all",)) -> Recipe:
    base = os.path.splitext(os.path.basename(member))[0]
    tag = "t2o" if converter == "tflite2onnx" else "tf2onnx"
    label = "tflite2onnx 0.4.1 (NCHW rewrite)" if converter == "tflite2onnx" else \
        f"tf2onnx --tflite opset {opset} (NHWC, Transposes at the edges)"
    return Recipe(name=f"mediapipe_{base}_{tag}", family=family, exporter=label,
                  build=tflite_build(member, converter, opset),
                  feeds={"*": Feed(shape, 0.0, 1.0)},   # the one image input, whatever its name
                  params={"src": MEDIAPIPE, "member": member, "converter": converter, "opset": opset, "v": 2},
                  pretrained=True, subset=tuple(subset),
                  needs=("tflite2onnx",) if converter == "tflite2onnx" else ("tf2onnx", "tensorflow"))


def nchw(size: int) -> list[int]:
    return [1, 3, size, size]


def nhwc(size: int) -> list[int]:
    return [1, size, size, 3]


def recipes() -> list[Recipe]:
    return [
        Recipe(name="nudenet_320n", family="detection", exporter="nudenet wheel (torch.onnx opset 17, YOLOv8n)",
               build=nudenet_build, feeds={"images": Feed([1, 3, 320, 320], 0.0, 1.0)},
               params={"src": "nudenet==3.4.2", "file": "320n.onnx"}, pretrained=True,
               subset=("ci", "all"), needs=("nudenet",)),
        # tflite2onnx: the ones it can convert (it rewrites layouts to NCHW).
        tflite_recipe("face_detection/face_detection_short_range.tflite", "tflite2onnx", "detection", nchw(128)),
        tflite_recipe("hand_landmark/hand_landmark_lite.tflite", "tflite2onnx", "landmark", nchw(224)),
        tflite_recipe("iris_landmark/iris_landmark.tflite", "tflite2onnx", "landmark", nchw(64)),
        # Kept on purpose, fails: tflite2onnx has no HARD_SWISH (hence tf2onnx below).
        tflite_recipe("selfie_segmentation/selfie_segmentation.tflite", "tflite2onnx", "segmentation", nchw(256)),
        # tf2onnx: NHWC in, Transposes at the edges (keras/tflite style).
        tflite_recipe("selfie_segmentation/selfie_segmentation.tflite", "tf2onnx", "segmentation", nhwc(256)),
        tflite_recipe("hand_landmark/hand_landmark_lite.tflite", "tf2onnx", "landmark", nhwc(224)),
        tflite_recipe("pose_landmark/pose_landmark_full.tflite", "tf2onnx", "landmark", nhwc(256)),
        tflite_recipe("face_landmark/face_landmark.tflite", "tf2onnx", "landmark", nhwc(192)),
        tflite_recipe("face_detection/face_detection_short_range.tflite", "tf2onnx", "detection", nhwc(128)),
        tflite_recipe("palm_detection/palm_detection_lite.tflite", "tf2onnx", "detection", nhwc(192)),
    ]
