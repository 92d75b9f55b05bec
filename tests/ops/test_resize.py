"""Resize / Upsample against onnxruntime: every mode, nearest_mode and coordinate transformation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import assert_close, run_ort, run_variants, single_node_model

RNG = np.random.default_rng(4)
X = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)


def check(attrs: dict, scales=None, sizes=None, roi=None, x: np.ndarray = X, opset: int = 19) -> None:
    inits = {"roi": np.asarray(roi if roi is not None else [], np.float32)}
    names = ["x", "roi" if roi is not None else "", "", ""]
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
        names[2] = "scales"
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
        names[3] = "sizes"
    names = names[:3] if sizes is None else names
    if roi is None:
        del inits["roi"]
    model = single_node_model("Resize", {"x": x}, attrs=attrs, initializers=inits, opset=opset,
                              input_names=names)
    for o in model.graph.output:
        o.ClearField("type")  # ORT rejects the UNDEFINED element type
    expected = run_ort(model, {"x": x})[0]
    args = [x] + [inits.get(n) if n else None for n in names[1:]]
    x.setflags(write=False)
    for variant, out in run_variants("Resize", args, {**attrs, "_opset": opset}).items():
        assert out[0].dtype == expected.dtype
        assert_close(out[0], expected, what=f"Resize[{variant}] {attrs} scales={scales} sizes={sizes}")


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
SCALES = [[1, 1, 2, 3], [1, 1, 0.6, 0.5], [1, 1, 1.7, 0.8]]


def _scales_for(coord: str, nearest: str = "") -> list:
    """Scale sets on which onnxruntime and the ONNX spec agree for ``coord``.

    With a non-integral output length (1.7 * 5) align_corners divides by the real-valued
    resized length in the ONNX reference (which we follow) but by the integer one in
    onnxruntime.  half_pixel_symmetric at 0.6 lands within 1 ulp of an integer, where ``floor``
    depends on float rounding order.
    """
    if coord == "align_corners":
        return SCALES[:2]
    if coord == "half_pixel_symmetric" and nearest == "floor":
        return [SCALES[0], SCALES[2]]
    return SCALES


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest(coord, nearest):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    for scales in _scales_for(coord, nearest):
        check(attrs, scales=scales)
    check(attrs, sizes=[1, 2, 7, 4])


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_linear_cubic(coord, mode):
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    for scales in _scales_for(coord):
        check(attrs, scales=scales)
    check(attrs, sizes=[1, 2, 9, 4])


@pytest.mark.parametrize("exclude", [0, 1])
def test_cubic_params(exclude):
    check({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": exclude}, scales=[1, 1, 1.5, 0.7])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_crop_and_resize(mode):
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.5}
    check(attrs, sizes=[1, 2, 4, 5], roi=[0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3])
    check(attrs, sizes=[1, 2, 3, 3], roi=[0, 0, 0.4, 0.6, 1, 1, 0.6, 0.7])


def test_axes_and_aspect_ratio():
    check({"mode": "linear", "axes": [3, 2]}, scales=[0.5, 2.0])
    for policy in ["not_larger", "not_smaller"]:
        check({"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": policy}, sizes=[8, 9])


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias(mode):
    x = RNG.standard_normal((1, 1, 16, 12)).astype(np.float32)
    check({"mode": mode, "antialias": 1}, scales=[1, 1, 0.4, 0.7], x=x)


def test_batch_and_integer_input():
    check({"mode": "linear"}, scales=[1, 1, 2, 2], x=RNG.standard_normal((3, 4, 3, 5)).astype(np.float32))
    x = RNG.integers(0, 255, (1, 3, 4, 4)).astype(np.uint8)
    out = run_variants("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "nearest"})
    for o in out.values():
        assert o[0].dtype == np.uint8
        np.testing.assert_array_equal(o[0], x.repeat(2, axis=2).repeat(2, axis=3))


def _legacy(op: str, opset: int, attrs: dict, scales: list, x: np.ndarray = X) -> None:
    s = np.asarray(scales, np.float32)
    as_attr = opset < 9
    inits = {} if as_attr else {"scales": s}
    a = {**attrs, "scales": [float(v) for v in scales]} if as_attr else attrs
    model = single_node_model(op, {"x": x}, attrs=a, initializers=inits, opset=opset)
    for o in model.graph.output:
        o.ClearField("type")
    expected = run_ort(model, {"x": x})[0]
    out = run_variants(op, [x] + ([] if as_attr else [s]), {**a, "_opset": opset})
    for variant, o in out.items():
        assert_close(o[0], expected, what=f"{op}-{opset}[{variant}] {attrs} {scales}")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_and_resize10(mode):
    _legacy("Upsample", 9, {"mode": mode}, [1, 1, 2, 3])
    _legacy("Upsample", 9, {"mode": mode}, [1, 1, 1.5, 2.5])
    _legacy("Upsample", 7, {"mode": mode}, [1, 1, 2, 2])
    _legacy("Resize", 10, {"mode": mode}, [1, 1, 2, 1.5])
    _legacy("Resize", 10, {"mode": mode}, [1, 1, 0.6, 0.5])


NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners",
                                   "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 4, 8], [1, 2, 3, 1], [2, 1, 1, 2]])
def test_nearest_integer_upscales(coord, nearest, scales):
    """Integer upscales take one broadcast copy where every output index copies input i // k
    (ops/resize.py _nearest_by_repeats), the per-axis gathers where a mode picks otherwise
    (align_corners, ceil): both against onnxruntime."""
    check({"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}, scales=scales)


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 1, 1, 1), (1, 16, 40, 40), (1, 2, 3, 17)])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 4, 8], [1, 1, 1, 3], [1, 1, 5, 1]])
def test_float_image_upscales_take_the_native_kernel(monkeypatch, shape, scales):
    """A float32 image repeated along its rows and columns runs kernels/host/upsample.c (counted),
    with onnxruntime's result and numpy's path's bits; a repeat along the channels keeps numpy's."""
    from optcli import native

    if not native.available():
        pytest.skip(native.status())
    calls, real = [], native.upsample_nearest
    monkeypatch.setattr(native, "upsample_nearest", lambda x, kh, kw: calls.append((kh, kw)) or real(x, kh, kw))
    x = RNG.standard_normal(shape).astype(np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    check(attrs, scales=scales, x=x, opset=13)
    assert calls and calls[-1] == (scales[2], scales[3])
    from optcli.ops.resize import _nearest_by_repeats

    got = _nearest_by_repeats(x, {2: scales[2], 3: scales[3]})
    with monkeypatch.context() as m:
        m.setattr(native, "available", lambda: False)
        assert np.array_equal(got, _nearest_by_repeats(x, {2: scales[2], 3: scales[3]}))
    calls.clear()
    check(attrs, scales=[1, 2, 2, 2], x=x, opset=13)
    assert not calls


def test_the_repeat_check_sees_which_modes_repeat():
    from optcli.ops import resize

    floor_like = resize._nearest_source(5, 10, 2.0, None, {"mode": "nearest",
                                                            "coordinate_transformation_mode": "asymmetric",
                                                            "nearest_mode": "floor"}, False)
    assert resize._repeat_factor(floor_like, 5) == 2
    ceil = resize._nearest_source(5, 10, 2.0, None, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                                      "nearest_mode": "ceil"}, False)
    assert list(ceil[:4]) == [0, 1, 1, 2] and resize._repeat_factor(ceil, 5) == 0
    assert resize._repeat_factor(np.array([0, 0, 1, 2, 2, 2]), 3) == 0
    y = resize._nearest_by_repeats(np.arange(6, dtype=np.float32).reshape(1, 2, 3), {1: 2, 2: 3})
    assert y.shape == (1, 4, 9) and np.array_equal(y, np.repeat(np.repeat(np.arange(6).reshape(1, 2, 3), 2, 1), 3, 2))


def test_a_plan_step_remembers_its_repeats_per_input_shape():
    """The step memo (StepAttrs) keys the repeats on the input shape and the scales: a second call
    with another shape, or other scales, works them out again."""
    from optcli.ops.registry import StepAttrs
    from optcli.ops.resize import resize

    attrs = StepAttrs({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
                       "_opset": 13})
    roi = np.array([], np.float32)
    for shape, scales in [((1, 2, 3, 4), [1, 1, 2, 2]), ((1, 2, 5, 2), [1, 1, 2, 2]), ((1, 2, 5, 2), [1, 1, 3, 1]),
                          ((1, 2, 5, 2), [1, 1, 1.5, 1])]:
        x = RNG.standard_normal(shape).astype(np.float32)
        s = np.array(scales, np.float32)
        got = resize([x, roi, s], attrs)[0]
        model_check = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        check(model_check, scales=scales, x=x, opset=13)
        want = resize([x, roi, s], {**attrs, "_opset": 13})[0]  # a plain dict: no memo
        assert got.shape == want.shape and np.array_equal(got, want)
