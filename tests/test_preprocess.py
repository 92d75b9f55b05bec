"""optcli/preprocess.py: the one image spec behind `opt --calib_preprocess`, `--verify` and
`optcli run --preprocess`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optcli.errors import UsageError
from optcli.preprocess import load_image, parse

Image = pytest.importorskip("PIL.Image")


def _photo(path, w=60, h=40):
    """Left to right: red ramps up; top to bottom: green ramps up; blue constant."""
    x = np.linspace(0, 255, w)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h)[:, None].repeat(w, 1)
    rgb = np.stack([x, y, np.full((h, w), 40.0)], -1).round().astype(np.uint8)
    Image.fromarray(rgb).save(path)
    return path


def _expected(path, size_wh, box, scale=255.0, mean=0.0, std=1.0):
    img = Image.open(path).convert("RGB").resize(size_wh, Image.BILINEAR).crop(box)
    return (np.asarray(img, np.float32) / np.float32(scale) - np.float32(mean)) / np.float32(std)


def test_default_resizes_the_shorter_side_and_center_crops(tmp_path):
    photo = _photo(tmp_path / "p.png")  # 60 x 40: covering 20 x 20 means 30 x 20, then columns 5..25
    x = load_image(photo, (1, 3, 20, 20), "float32", parse(None))
    assert x.shape == (1, 3, 20, 20) and x.dtype == np.float32
    np.testing.assert_array_equal(x[0].transpose(1, 2, 0), _expected(photo, (30, 20), (5, 0, 25, 20)))


def test_size_and_crop_keys(tmp_path):
    photo = _photo(tmp_path / "p.png", w=100, h=50)  # shorter side 50 -> 30: 60 x 30, center 24 x 20
    x = load_image(photo, (1, 3, 20, 24), "float32", parse("size=30,crop=20x24"))
    np.testing.assert_array_equal(x[0].transpose(1, 2, 0), _expected(photo, (60, 30), (18, 5, 42, 25)))
    stretched = load_image(photo, (1, 3, 20, 24), "float32", parse("resize=20x24"))
    np.testing.assert_array_equal(stretched[0].transpose(1, 2, 0), _expected(photo, (24, 20), (0, 0, 24, 20)))


@pytest.mark.parametrize("spec, scale, mean, std", [
    (None, 255.0, 0.0, 1.0),
    ("unit", 255.0, 0.0, 1.0),
    ("signed", 127.5, 1.0, 1.0),
    ("imagenet", 255.0, np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)),
    ("mean=0.5,0.25,0,std=0.5,scale=100", 100.0, np.array([0.5, 0.25, 0.0], np.float32), 0.5),
])
def test_presets_and_normalisation(tmp_path, spec, scale, mean, std):
    photo = _photo(tmp_path / "p.png", w=20, h=20)
    x = load_image(photo, (1, 3, 20, 20), "float32", parse(spec))
    np.testing.assert_allclose(x[0].transpose(1, 2, 0), _expected(photo, (20, 20), (0, 0, 20, 20), scale, mean, std),
                               rtol=1e-6, atol=1e-6)
    if spec == "signed":
        assert x.min() == -1.0 and x.max() == 1.0


def test_layout_from_the_input_shape_and_bgr(tmp_path):
    photo = _photo(tmp_path / "p.png", w=20, h=20)
    nchw = load_image(photo, (1, 3, 20, 20), "float32", parse(None))
    nhwc = load_image(photo, (1, 20, 20, 3), "float32", parse(None))
    np.testing.assert_array_equal(nhwc, nchw.transpose(0, 2, 3, 1))
    no_batch = load_image(photo, (20, 20, 3), "float32", parse(None))
    np.testing.assert_array_equal(no_batch, nhwc[0])
    bgr = load_image(photo, (1, 3, 20, 20), "float32", parse("bgr"))
    np.testing.assert_array_equal(bgr, nchw[:, ::-1])
    forced = load_image(photo, (1, 3, 20, 3), "float32", parse("layout=NHWC"))  # NCHW by default: 20 x 3
    wide = load_image(photo, (1, 3, 3, 20), "float32", parse(None))
    np.testing.assert_array_equal(forced, wide.transpose(0, 2, 3, 1))


def test_dynamic_height_and_width_keep_the_image_size_unless_told(tmp_path):
    photo = _photo(tmp_path / "p.png", w=60, h=40)
    assert load_image(photo, (1, 3, "h", "w"), "float32", parse(None)).shape == (1, 3, 40, 60)
    assert load_image(photo, (1, 3, "h", "w"), "float32", parse("size=20")).shape == (1, 3, 20, 30)
    assert load_image(photo, (1, 3, "h", "w"), "float32", parse("crop=16")).shape == (1, 3, 16, 16)


@pytest.mark.parametrize("spec", ["imagenet,colour=2", "size=0", "crop=0x4", "layout=NCWH", "std=0", "mean=a"])
def test_bad_specs_say_what_is_understood(spec):
    with pytest.raises(UsageError, match="--calib_preprocess"):
        parse(spec, "--calib_preprocess")


def test_a_crop_larger_than_the_image_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="larger than the resized image"):
        load_image(_photo(tmp_path / "p.png"), (1, 3, 20, 20), "float32", parse("size=10"))


def _doubler(shape) -> onnx.ModelProto:
    node = helper.make_node("Mul", ["x", "two"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape", [[1, 3, 24, 32], [1, 24, 32, 3]], ids=["nchw", "nhwc"])
def test_calibration_verify_and_run_see_the_same_tensor(shape, tmp_path, capsys, monkeypatch):
    """One image, one spec, three ways in: `opt --calib_preprocess` (calibration), `opt --verify`
    (--verify_data) and `optcli run --preprocess` all feed the model the same array."""
    from optcli import verify as verify_module
    from optcli.cli import opt_main, optcli_main
    from optcli.passes import quantize_int8
    from tests.helpers import run_cli

    images = tmp_path / "images"
    images.mkdir()
    _photo(images / "p.png", w=70, h=45)
    onnx.save(_doubler(shape), tmp_path / "m.onnx")
    spec = "imagenet,size=36,bgr"
    seen: dict[str, np.ndarray] = {}

    real_calibrate, real_compare = quantize_int8.calibrate, verify_module.compare

    def calibrate(graph, samples, *args):
        seen["calibration"] = samples[0]["x"]
        return real_calibrate(graph, samples, *args)

    def compare(samples, *args, **kwargs):
        seen["verify"] = samples[0]["x"]
        return real_compare(samples, *args, **kwargs)

    monkeypatch.setattr(quantize_int8, "calibrate", calibrate)
    monkeypatch.setattr(verify_module, "compare", compare)
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={tmp_path}/m.onnx", "--quant_type=INT8",
                                             f"--calib_data={images}", f"--calib_preprocess={spec}",
                                             f"--optimize_out={tmp_path}/q"], capsys)
    assert code == 0, err
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={tmp_path}/m.onnx", "--verify", f"--verify_data={images}",
                                             f"--calib_preprocess={spec}", f"--optimize_out={tmp_path}/m"], capsys)
    assert code == 0, err
    code, _, err = run_cli(optcli_main, "optcli", ["run", f"{tmp_path}/m.nb", f"--input={images}/p.png",
                                                   f"--preprocess={spec}", f"--output_dir={tmp_path}/out"], capsys)
    assert code == 0, err
    seen["run"] = np.load(tmp_path / "out" / "y.npy") / 2
    assert seen["calibration"].shape == tuple(shape)
    np.testing.assert_array_equal(seen["calibration"], seen["verify"])
    np.testing.assert_array_equal(seen["calibration"], seen["run"])
