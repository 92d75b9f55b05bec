"""choose_host_layout: the host plan's conv regions run channel-blocked (NCHWc), converted only at
their borders; results equal the plain plan's and onnxruntime's, whatever the block width."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import optcli
from optcli.errors import NbFormatError
from optcli.nb.writer import to_bytes
from optcli.ops import blocked
from optcli.passes import choose_host_layout
from tests.helpers import assert_close, run_ort
from tests.passes.ir_build import feeds_for, model, node

F = np.float32
RNG = np.random.default_rng(5)
LAYOUT_PASS = "choose_host_layout"


def _w(*shape) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(F)


def _net(channels: int = 13, mid: str | None = None, size: int = 9) -> tuple:
    """stem 3x3 s2 -> depthwise 3x3 -> [mid op] -> 1x1 -> Add (residual) -> MaxPool -> GAP -> Flatten.
    13 and 5 channels leave pad lanes at every block width."""
    c = channels
    inits = {"w0": _w(c, 3, 3, 3), "b0": _w(c), "wd": _w(c, 1, 3, 3), "bd": _w(c), "w1": _w(c, c, 1, 1),
             "b1": _w(c), "slope": np.abs(_w(c, 1, 1))}
    nodes = [node("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Relu", ["s"], ["r"]),
             node("Conv", ["r", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=c),
             node("PRelu", ["d", "slope"], ["p"])]
    last = "p"
    if mid == "transpose":  # a plain op inside: two regions, a border each way
        nodes += [node("Transpose", ["p"], ["t"], perm=[0, 1, 3, 2]),  # square planes: same shape
                  node("Add", ["t", "p"], ["u"])]  # reads the plain op's result: a ToBlocked
        last = "u"
    nodes += [node("Conv", [last, "w1", "b1"], ["e"]),
              node("Add", ["e", "r"], ["a"]),
              node("MaxPool", ["a"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              node("GlobalAveragePool", ["m"], ["g"]),
              node("Mul", ["m", "g"], ["q"]),  # a per-channel scale, as squeeze-excitation has
              node("Flatten", ["q"], ["y"])]
    return model(nodes, {"x": [1, 3, size, size]}, initializers=inits)


def _plan(m, layout: bool = True):
    res = optcli.optimize(model=m, valid_targets="arm", disabled_passes=() if layout else (LAYOUT_PASS,))
    return res


def _kernels(pred) -> collections.Counter:
    return collections.Counter(s.kernel for s in pred.plan.steps)


@pytest.fixture(autouse=True)
def small_regions(monkeypatch):
    """These graphs are small: their regions run blocked whatever their borders cost (the cost
    rule has its own test)."""
    monkeypatch.setattr(choose_host_layout, "CONVS_PER_BORDER", 0)


@pytest.fixture(params=[1, 4, 8, 16])
def block(request, monkeypatch):
    """Every block width, through the numpy kernels (the native library's own widths are tested
    in tests/native): B = 1 is what runs where the library is absent."""
    monkeypatch.setattr(blocked, "_native_blocked", lambda: None)
    monkeypatch.setattr(blocked, "block_width", lambda: request.param)
    return request.param


def test_region_runs_blocked_and_matches(block):
    m = _net()
    res = _plan(m)
    pred = optcli.load(res.data)
    kinds = _kernels(pred)
    assert kinds["optcli.ToBlocked.default"] == 0  # the stem conv reads the plain image itself
    assert kinds["onnx.Conv.nchwc_from_nchw"] == 1 and kinds["onnx.Conv.nchwc"] == 2
    assert kinds["optcli.FromBlocked.default"] == 1  # before Flatten, the only plain reader
    for op in ("Add", "MaxPool", "GlobalAveragePool", "Mul", "PRelu"):  # the Relu went into the stem conv
        assert kinds[f"onnx.{op}.nchwc"] == 1, op
    feeds = feeds_for(m)
    got = pred.run(feeds)["y"]
    assert_close(got, run_ort(m, feeds)[0], what="blocked plan vs onnxruntime")
    plain = optcli.load(_plan(m, layout=False).data).run(feeds)["y"]
    assert_close(got, plain, what="blocked plan vs plain plan")


def test_border_inside_a_region(block):
    m = _net(mid="transpose")
    pred = optcli.load(_plan(m).data)
    kinds = _kernels(pred)
    assert kinds["optcli.FromBlocked.default"] == 2 and kinds["optcli.ToBlocked.default"] == 1
    feeds = feeds_for(m, seed=3)
    assert_close(pred.run(feeds)["y"], run_ort(m, feeds)[0], what="two regions vs onnxruntime")


def test_grouped_convs_of_whole_blocks_join_the_region(block):
    """RegNetX's block: 1x1 -> 3x3 grouped (8 channels a group) -> 1x1 -> residual Add.  Grouped convs
    whose groups are multiples of 8 channels are blocked candidates, so the block is one region (before,
    each grouped conv cut the plan, and RegNet stayed NCHW); 4 channels a group stay plain."""
    for width, joins in ((8, True), (4, False)):
        c = 3 * width
        inits = {"w0": _w(c, 5, 1, 1), "wg": _w(c, width, 3, 3), "bg": _w(c), "w1": _w(c, c, 1, 1),
                 "w2": _w(c, 5, 1, 1)}
        m = model([node("Conv", ["x", "w0"], ["a"]), node("Relu", ["a"], ["r"]),
                   node("Conv", ["r", "wg", "bg"], ["g"], pads=[1, 1, 1, 1], group=3),
                   node("Relu", ["g"], ["h"]), node("Conv", ["h", "w1"], ["e"]),
                   node("Conv", ["x", "w2"], ["sc"]), node("Add", ["e", "sc"], ["y"])],
                  {"x": [1, 5, 7, 9]}, initializers=inits)
        pred = optcli.load(_plan(m).data)
        kinds = _kernels(pred)
        grouped = next(s.kernel for s in pred.plan.steps if s.op_type == "Conv" and s.attrs.get("group") == 3)
        assert (grouped == "onnx.Conv.nchwc") == joins, (width, grouped)
        if joins:  # one region: the stems read the plain image, one conversion out
            assert kinds["optcli.ToBlocked.default"] == 0 and kinds["optcli.FromBlocked.default"] == 1, kinds
        feeds = feeds_for(m, seed=width)
        assert_close(pred.run(feeds)["y"], run_ort(m, feeds)[0], what=f"{width} a group vs onnxruntime")


def test_one_conv_stays_plain():
    m = model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["y"])],
              {"x": [1, 3, 8, 8]}, initializers={"w": _w(4, 3, 3, 3)})
    res = _plan(m)
    record = next(r for r in res.report["passes"] if r["name"] == LAYOUT_PASS)
    assert record["changed"]["blocked_steps"] == 0
    assert not any("nchwc" in s.kernel for s in optcli.load(res.data).plan.steps)


def test_regions_whose_borders_cost_more_stay_plain(monkeypatch):
    """Three convs with two borders (the image in, the result out): kept at one conv a border,
    plain at two (the pipeline's rule is CONVS_PER_BORDER)."""
    m = _net()
    for per_border, expect in ((1, True), (2, False)):
        monkeypatch.setattr(choose_host_layout, "CONVS_PER_BORDER", per_border)
        steps = _plan(m).plan.steps
        assert any(".nchwc" in s.kernel for s in steps) == expect, per_border


def test_pad_lanes_stay_out_of_real_channels(block):
    """Garbage in a blocked value's pad lanes never reaches a real channel."""
    if block == 1:
        pytest.skip("B = 1 has no pad lanes")
    x = RNG.standard_normal((1, 5, 6, 6)).astype(F)
    xb = blocked.to_blocked(x, block)
    xb.reshape(-1, block)[:, 5:] = 1e30
    np.testing.assert_array_equal(blocked.from_blocked(xb, 5), x)
    w = _w(7, 5, 3, 3)
    attrs = {"pads": [1, 1, 1, 1], "activation": "sigmoid"}
    y = blocked.conv_blocked([xb, w, None], attrs)[0]
    ref = blocked.conv_blocked([x, w, None], attrs)[0]  # the plain input of a stem
    np.testing.assert_array_equal(blocked.from_blocked(y, 7), blocked.from_blocked(ref, 7))
    assert np.isfinite(ref).all() and np.isfinite(y).all()  # the pad lanes too: act(0), never garbage


def test_crafted_layouts_are_refused():
    plan = _plan(_net()).plan
    steps = plan.steps
    # A plain kernel reading a blocked value: the Flatten reads the region's value directly.
    frm = next(s for s in steps if s.op_type == "FromBlocked")
    flat = next(s for s in steps if s.op_type == "Flatten")
    flat.inputs = [frm.inputs[0]]
    with pytest.raises(NbFormatError, match="reads value .* as plain, but it is blocked"):
        optcli.load(to_bytes(plan))
    flat.inputs = list(frm.outputs)
    frm.attrs = {**frm.attrs, "channels": 12}
    with pytest.raises(NbFormatError, match="FromBlocked names 12 channels"):
        optcli.load(to_bytes(plan))
