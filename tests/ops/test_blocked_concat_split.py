"""Channel Concat, channel Split and nearest whole-factor Resize in the blocked layout (ops/blocked.py):
the kernels on every block width against the plain result (pad lanes of the inputs holding
garbage), their rules (``applies_*``) on the shapes they take and refuse, a YOLO-like C2f block with
an SPPF Concat and a neck upsample planned blocked end to end against onnxruntime, and a crafted
file whose blocked Concat would put pad lanes among real channels refused at load."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, NbFormatError
from optcli.ops import blocked, get_kernel
from optcli.ops.registry import StepAttrs
from tests.helpers import assert_close, run_ort
from tests.reliability.nbfuzz import parts, rebuild

RNG = np.random.default_rng(29)


def _blocked_with_garbage(x: np.ndarray, block: int) -> np.ndarray:
    xb = blocked.to_blocked(x, block)
    c = x.shape[1]
    if c % block:
        xb[:, -1, :, :, c % block:] = 1e30  # pad lanes: finite, never mixed into a real channel
    return xb


@pytest.mark.parametrize("block", [1, 4, 8, 16])
@pytest.mark.parametrize("channels", [[16, 32, 5], [32, 16], [16], [48, 16, 16, 1]])
def test_blocked_concat_joins_whole_blocks(block, channels):
    xs = [RNG.standard_normal((2, c, 5, 3)).astype(np.float32) for c in channels]
    y = get_kernel("onnx.Concat.nchwc").fn([_blocked_with_garbage(x, block) for x in xs], StepAttrs({"axis": 1}))[0]
    np.testing.assert_array_equal(blocked.from_blocked(y, sum(channels)), np.concatenate(xs, axis=1))


@pytest.mark.parametrize("block", [1, 4, 8, 16])
@pytest.mark.parametrize("sizes", [[16, 16], [32, 16, 7], [16, 48], [64]])
@pytest.mark.parametrize("as_input", [True, False], ids=["split input", "split attribute"])
def test_blocked_split_cuts_whole_blocks(block, sizes, as_input):
    x = RNG.standard_normal((1, sum(sizes), 4, 6)).astype(np.float32)
    split = np.array(sizes, np.int64)
    inputs, attrs = ([_blocked_with_garbage(x, block), split], {"axis": 1}) if as_input else \
        ([_blocked_with_garbage(x, block)], {"axis": 1, "split": sizes})
    outs = get_kernel("onnx.Split.nchwc").fn(inputs, StepAttrs(attrs))
    want = np.split(x, np.cumsum(sizes)[:-1], axis=1)
    assert len(outs) == len(sizes)
    for got, w, c in zip(outs, want, sizes):
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(blocked.from_blocked(got, c), w)


@pytest.mark.parametrize("block", [1, 8, 16])
@pytest.mark.parametrize("scales, mode", [([1, 1, 2, 2], "asymmetric"), ([1, 1, 3, 2], "asymmetric"),
                                          ([1, 1, 2, 2], "half_pixel")])
def test_blocked_resize_copies_whole_pixels(block, scales, mode):
    from optcli.ops.resize import resize

    x = RNG.standard_normal((1, 19, 5, 7)).astype(np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": mode,
             "nearest_mode": "floor" if mode == "asymmetric" else "round_prefer_floor"}
    s = np.array(scales, np.float32)
    want = resize([x, None, s], dict(attrs))[0]
    step = StepAttrs(dict(attrs))
    for _ in range(2):  # the second call from the memo
        y = blocked.resize_blocked([_blocked_with_garbage(x, block), None, s], step)[0]
        np.testing.assert_array_equal(blocked.from_blocked(y, 19), want)


def test_the_kernels_refuse_what_they_would_join_or_cut_wrongly():
    a = np.ones((1, 2, 4, 4, 8), np.float32)
    with pytest.raises(InputError, match="do not join along channels"):
        blocked.concat_blocked([a, np.ones((1, 2, 4, 5, 8), np.float32)], {})
    with pytest.raises(InputError, match="blocked Split got sizes"):
        blocked.split_blocked([a, np.array([4, 12], np.int64)], {})  # 4 channels: not a whole block of 8
    with pytest.raises(InputError, match="blocked Split got sizes"):
        blocked.split_blocked([a, np.array([8, 40], np.int64)], {})  # more channels than the blocks hold


@pytest.mark.parametrize("block", [1, 8])
def test_a_blocked_resize_that_does_not_copy_whole_pixels_takes_the_general_path(block):
    """Scales of 1.5 (a file's, or a dynamic size the rule's probes did not cover): every lane through
    the plain kernel, the same answer."""
    from optcli.ops.resize import resize

    x = RNG.standard_normal((1, 11, 4, 6)).astype(np.float32)
    s = np.array([1, 1, 1.5, 1.5], np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    y = blocked.resize_blocked([_blocked_with_garbage(x, block), None, s], StepAttrs(dict(attrs)))[0]
    np.testing.assert_array_equal(blocked.from_blocked(y, 11), resize([x, None, s], dict(attrs))[0])


def _c2f_model(c: int = 32, tail: int = 7, dims: tuple = (16, 16)) -> tuple:
    """x -> conv -> Split(c/2, c/2) -> conv on the second half -> Concat(3 parts) -> conv -> MaxPool x2 ->
    Concat (SPPF) -> Resize 2x -> Concat with an early map -> conv to ``tail`` channels -> Concat with a
    tail-channel conv (the last input of any width)."""
    h = c // 2
    rng = np.random.default_rng(3)
    inits = {}

    def w(name, m, k, ksize=3):
        inits[name] = (rng.standard_normal((m, k, ksize, ksize)) / np.sqrt(k * ksize * ksize)).astype(np.float32)
        return name

    nodes = [helper.make_node("Conv", ["x", w("w0", c, 3)], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["a1"]),
             helper.make_node("Split", ["a1", "sizes"], ["s0", "s1"], axis=1),
             helper.make_node("Conv", ["s1", w("w1", h, h)], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["s0", "s1", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", w("w2", c, c + h, 1)], ["d"]),
             helper.make_node("MaxPool", ["d"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["d", "p1", "p2"], ["sppf"], axis=1),
             helper.make_node("Conv", ["sppf", w("w3", c, 3 * c, 1)], ["e"], strides=[2, 2]),
             helper.make_node("Resize", ["e", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Concat", ["up", "d"], ["neck"], axis=1),
             helper.make_node("Conv", ["neck", w("w4", c, 2 * c)], ["f"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["f", w("w5", tail, c, 1)], ["g"]),
             helper.make_node("Concat", ["f", "g"], ["y"], axis=1)]
    tensors = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    tensors += [numpy_helper.from_array(np.array([h, h], np.int64), "sizes"),
                numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *dims])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c + tail, *dims])], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dims, sizes", [((16, 16), [(16, 16)]), (("h", "w"), [(16, 16), (12, 20), (8, 6)])],
                         ids=["static", "dynamic H and W"])
def test_a_yolo_like_block_runs_blocked_end_to_end(dims, sizes):
    model = _c2f_model(dims=dims)
    data = optcli.optimize(model=model, valid_targets="arm").data
    steps = optcli.load(data).plan.steps
    kinds = {(s.op_type, s.kernel.rsplit(".", 1)[-1]) for s in steps}
    assert {("Concat", "nchwc"), ("Split", "nchwc"), ("Resize", "nchwc")} <= kinds, kinds
    assert sum(s.op_type == "FromBlocked" for s in steps) == 1, [s.op_type for s in steps]  # the output only
    for h, w in sizes:
        x = RNG.standard_normal((1, 3, h, w)).astype(np.float32)
        want = run_ort(model, {"x": x})[0]
        for threads in (1, 2):
            got = optcli.load(data, threads=threads).run({"x": x})["y"]
            assert_close(got, want, what=f"{h}x{w}, {threads} threads")


def test_a_blocked_concat_of_a_partial_block_is_refused_at_load():
    """The C2f plan's last Concat (f: 32 channels, then g: 7) with its inputs swapped, as a crafted
    file would: the shapes still add up (39 channels), but joined as blocks g's pad lanes would sit
    among real channels.  The load holds the rule for the derived shapes and refuses the file."""
    data = optcli.optimize(model=_c2f_model(), valid_targets="arm").data
    body, blob = parts(data)
    [cat] = [s for s in body["steps"] if s.get("inputs") and any(str(n).startswith("g") for n in s["inputs"])
             and "Concat" in str(s.get("kernel", ""))]
    cat["inputs"] = cat["inputs"][::-1]
    with pytest.raises(NbFormatError, match="rule does not hold"):
        optcli.load(rebuild(body, blob))


def test_a_split_along_the_batch_axis_is_not_a_channel_split():
    """Split's axis defaults to 0 (ONNX): a Split with no axis attribute cuts images, not channels,
    and keeps its plain kernel; Concat along the batch likewise."""
    from types import SimpleNamespace

    shapes = {"x": (32, 32, 4, 4), "a": (16, 32, 4, 4), "b": (16, 32, 4, 4)}
    graph = SimpleNamespace(initializers={}, dtype_of=lambda n: "float32", shape_of=lambda n: shapes.get(n),
                            const=lambda n: np.array([16, 16], np.int64) if n == "sizes" else None)
    split = SimpleNamespace(op_type="Split", inputs=["x", "sizes"], outputs=["a", "b"], attrs={},
                            input=lambda i: ["x", "sizes"][i])
    assert not blocked.applies_split(split, graph)
    split.attrs["axis"] = 1
    assert blocked.applies_split(split, graph)
    concat = SimpleNamespace(op_type="Concat", inputs=["a", "b"], outputs=["x"], attrs={"axis": 0},
                             input=lambda i: ["a", "b"][i])
    assert not blocked.applies_concat(concat, graph)
