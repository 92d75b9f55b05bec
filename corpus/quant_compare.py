"""optcli's int8 against onnxruntime's own quantizer, on the corpus's pretrained models and real
photos.  Shared by the tests (tests/quant/test_real_weights.py) and the table in
docs/quantization.md:

    python corpus/quant_compare.py [--subset ci|all] [--write]     # --write: replace the doc's table

For every pretrained model of the corpus with one image input (nudenet's YOLOv8n detector; with
``--subset all`` MediaPipe's detectors and landmark models too), on scikit-image's sample photos
(``pip install scikit-image``; calibration and evaluation photos kept apart):

* full int8: ``opt --quant_type=INT8 --calib_data=PHOTOS`` (default percentile calibrator) against
  onnxruntime's ``quantize_static`` (QDQ, per-channel weights, its default MinMax calibration) on
  the same calibration photos;
* int8 weights: ``opt --quant_model --quant_type=QUANT_INT8`` against onnxruntime's
  ``quantize_dynamic`` (int8 weights; activations quantized at run time);

each judged by its SNR (dB) against the fp32 model run by onnxruntime on the evaluation photos,
per output and, for detectors whose one output stacks boxes and class scores, per part.  Images
go through optcli's own preprocessing (``optcli/preprocess.py``: shorter side to the input,
center crop, [0, 1] or [-1, 1] as the manifest's input range says), for both quantizers alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CALIB_PHOTOS = ("coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg", "ihc.png",
                "retina.jpg", "brick.png", "coins.png")
EVAL_PHOTOS = ("astronaut.png", "camera.png", "chelsea.png", "motorcycle_right.png", "grass.png", "gravel.png")
VARIANTS = ("optcli INT8", "onnxruntime quantize_static", "optcli QUANT_INT8", "onnxruntime quantize_dynamic")
PAIRS = (("optcli INT8", "onnxruntime quantize_static"), ("optcli QUANT_INT8", "onnxruntime quantize_dynamic"))
# Outputs that stack parts of different scales along axis 1: (part, start, stop).  A whole-output
# SNR is dominated by the largest part (box coordinates up to 320 next to scores below 1).
PARTS = {("nudenet_320n", "output0"): (("boxes", 0, 4), ("class scores", 4, None))}
DOC = Path(__file__).resolve().parent.parent / "docs" / "quantization.md"
BEGIN, END = "<!-- quant_compare: begin -->", "<!-- quant_compare: end -->"


def photo_source() -> Path:
    """scikit-image's bundled sample photos (its wheel carries them; nothing is downloaded)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("the sample photos come with scikit-image: pip install scikit-image")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def photo_folders(dest: Path) -> tuple[Path, Path]:
    """(calibration folder, evaluation folder) of photos under ``dest``."""
    source = photo_source()
    folders = []
    for name, files in (("calib", CALIB_PHOTOS), ("eval", EVAL_PHOTOS)):
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(source / f, folder / f)
        folders.append(folder)
    return folders[0], folders[1]


def image_entries(entries: list[dict]) -> list[dict]:
    """Pretrained models with one float image input (rank 4, 1 or 3 channels)."""
    return [e for e in entries if e.get("pretrained") and len(e["inputs"]) == 1
            and e["inputs"][0]["dtype"] == "float32" and len(e["inputs"][0]["shape"]) == 4
            and 3 in (e["inputs"][0]["shape"][1], e["inputs"][0]["shape"][3])]


def snr_db(expected: np.ndarray, got: np.ndarray) -> float:
    """10 log10(sum expected^2 / sum (got - expected)^2), as `opt --verify` reports it."""
    e, g = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    noise = float(np.sum((g - e) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(max(float(np.sum(e * e)), 1e-300) / noise)


@dataclass
class Row:
    model: str
    output: str  # "name" or "name: part"
    snr: dict[str, float | str]  # variant -> SNR in dB, or why it failed


def compare_model(entry: dict, corpus: Path, calib: Path, evaluation: Path, work: Path) -> list[Row]:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    import optcli
    from optcli.calib import load_samples

    path = corpus / entry["file"]
    spec = entry["inputs"][0]
    shapes = f"{spec['name']}:{','.join(str(d) for d in spec['shape'])}"
    preprocess = "signed" if spec.get("low", 0.0) < 0 else "unit"
    fp32 = optcli.optimize(model_file=path, input_shapes=shapes)
    samples = load_samples(evaluation, fp32.plan.inputs, preprocess, flag="--verify_data")
    calib_samples = load_samples(calib, fp32.plan.inputs, preprocess)

    def session(model_path: Path):
        sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        return lambda feeds: sess.run(None, feeds)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter(calib_samples)

        def get_next(self):
            return next(self.samples, None)

    def ours(**options):
        predictor = optcli.load(optcli.optimize(model_file=path, input_shapes=shapes, **options).data)
        names = [o.name for o in predictor.outputs]
        return lambda feeds: [predictor.run(feeds)[n] for n in names]

    def ort_static():
        out = work / f"{entry['name']}_qdq.onnx"
        quantize_static(str(path), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
        return session(out)

    def ort_dynamic():
        out = work / f"{entry['name']}_dynamic.onnx"
        quantize_dynamic(str(path), str(out))
        return session(out)

    makers = {"optcli INT8": lambda: ours(quant_type="INT8", calib_data=calib, calib_preprocess=preprocess),
              "onnxruntime quantize_static": ort_static,
              "optcli QUANT_INT8": lambda: ours(quant_type="QUANT_INT8"),
              "onnxruntime quantize_dynamic": ort_dynamic}
    reference = session(path)
    expected = [reference(f) for f in samples]
    names = [o.name for o in ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_outputs()]
    rows = {}
    for i, name in enumerate(names):
        for part, start, stop in PARTS.get((entry["name"], name), ((None, 0, None),)):
            rows[(i, start, stop)] = Row(entry["name"], f"{name}: {part}" if part else name, {})
    for variant in VARIANTS:
        try:
            run = makers[variant]()
            got = [run(f) for f in samples]
        except Exception as exc:  # a quantizer that fails on a model is a result too
            for row in rows.values():
                row.snr[variant] = f"fails: {type(exc).__name__}"
            continue
        for (i, start, stop), row in rows.items():
            part = slice(start, stop)
            row.snr[variant] = snr_db(np.concatenate([e[i][:, part] for e in expected]),
                                      np.concatenate([g[i][:, part] for g in got]))
    return list(rows.values())


def markdown(rows: list[Row]) -> str:
    def cell(value) -> str:
        return value if isinstance(value, str) else ("exact" if math.isinf(value) else f"{value:.1f}")

    lines = ["| model | output | " + " | ".join(VARIANTS) + " |", "| --- | --- |" + " ---: |" * len(VARIANTS)]
    for r in rows:
        lines.append(f"| {r.model} | {r.output} | " + " | ".join(cell(r.snr.get(v, "-")) for v in VARIANTS) + " |")
    return "\n".join(lines)


def main() -> None:
    from corpus.evaluate import corpus_dir, load_manifest

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", default="ci", choices=["ci", "all"])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    args = parser.parse_args()
    folder = corpus_dir()
    entries = image_entries([e for e in load_manifest(folder) if args.subset in e.get("subset", [])])
    if not entries:
        sys.exit(f"no pretrained image models in {folder} (subset {args.subset}): build them with corpus/build.py")
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer advises pre-processing on the root logger
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        calib, evaluation = photo_folders(Path(tmp))
        for entry in entries:
            print(f"{entry['name']} ...", file=sys.stderr)
            rows += compare_model(entry, folder, calib, evaluation, Path(tmp))
    table = markdown(rows)
    print(table)
    if args.write:
        text = DOC.read_text()
        head, _, rest = text.partition(BEGIN)
        _, found, tail = rest.partition(END)
        if not found:
            sys.exit(f"{DOC} has no {BEGIN} ... {END} markers")
        DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


if __name__ == "__main__":
    main()
