"""LSTM, GRU and RNN on the host against onnxruntime, every attribute of the spec, both loops.

Each case runs the layer through ``run_recurrent`` twice, with the native time loop and with the
numpy one (where the native library is built), and compares each with onnxruntime's CPU kernel
on the same one-node model.  onnx's reference implementation is not the oracle: it ignores
activations, clip and sequence_lens.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from optcli import native
from optcli.native import library
from optcli.ops.recurrent import CELLS, resolve_activations, run_recurrent
from optcli.ops.shape_functions import ShapeDerivationError
from optcli.tolerance import RELATIVE, VERIFY_NOISE, max_error
from tests.helpers import assert_close, run_ort, single_node_model

RNG = np.random.default_rng(24)

INPUT_NAMES = {"LSTM": ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"],
               "GRU": ["X", "W", "R", "B", "sequence_lens", "initial_h"],
               "RNN": ["X", "W", "R", "B", "sequence_lens", "initial_h"]}


def _case(op: str, seq=5, batch=3, size=6, hidden=8, direction="forward", layout=0, bias=True, lens=None,
          initial=False, peep=False, **attrs):
    """Inputs (by name, None where absent) and attributes of one layer."""
    cell = CELLS[op]
    dirs = 2 if direction == "bidirectional" else 1
    gh = cell.gates * hidden
    x = RNG.standard_normal((batch, seq, size) if layout else (seq, batch, size)).astype(np.float32)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    values = {
        "X": x,
        "W": (RNG.standard_normal((dirs, gh, size)) * 0.4).astype(np.float32),
        # torch's scale (1 / sqrt(hidden)): larger recurrent weights make a chaotic loop, where one
        # rounding difference grows without bound over the steps.
        "R": (RNG.standard_normal((dirs, gh, hidden)) * 0.8 / np.sqrt(hidden)).astype(np.float32),
        "B": (RNG.standard_normal((dirs, 2 * gh)) * 0.3).astype(np.float32) if bias else None,
        "sequence_lens": None if lens is None else np.array(lens, np.int32),
        "initial_h": RNG.standard_normal(state).astype(np.float32) if initial else None,
    }
    if op == "LSTM":
        values["initial_c"] = RNG.standard_normal(state).astype(np.float32) if initial else None
        values["P"] = (RNG.standard_normal((dirs, 3 * hidden)) * 0.5).astype(np.float32) if peep else None
    attrs = {"hidden_size": hidden, "direction": direction, **attrs}
    if layout:
        attrs["layout"] = 1
    return values, attrs


def _ort(op: str, values: dict, attrs: dict) -> list[np.ndarray]:
    """onnxruntime's outputs; it refuses ``layout`` 1, so that runs as layout 0 on transposed data."""
    if attrs.get("layout"):
        swap = {k: None if v is None or k not in ("X", "initial_h", "initial_c") else v.transpose(1, 0, 2)
                for k, v in values.items()}
        outs = _ort(op, {k: swap[k] if swap[k] is not None else v for k, v in values.items()},
                    {k: v for k, v in attrs.items() if k != "layout"})
        return [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    names = INPUT_NAMES[op]
    last = max(k for k, n in enumerate(names) if values.get(n) is not None)
    feeds = {n: values[n] for n in names[:last + 1] if values.get(n) is not None}
    model = single_node_model(op, feeds, n_outputs=3 if op == "LSTM" else 2, attrs=attrs, opset=14,
                              input_names=[n if values.get(n) is not None else "" for n in names[:last + 1]])
    for o in model.graph.output:
        o.ClearField("type")
    return run_ort(model, feeds)


# The loops compared: numpy, and with the native library the sequential native loop and its split
# path (each row's hidden units cut into three uneven slices, one time step at a time, as a big
# layer runs on idle cores), forced on these small layers through optcli_recurrent_split_from.
# Where the CPU has AVX-512 the native product runs 16 lanes wide: the 8-lane one (what AVX2 and
# aarch64 run) is checked here too, through optcli_recurrent_lanes.
LOOPS = ["numpy", "native", "native split"] if native.available() else ["numpy"]
if native.available() and library._lib.optcli_recurrent_lanes(-1) == 16:
    LOOPS += ["native 8 lanes", "native split 8 lanes"]


def _run_loop(op: str, inputs: list, attrs: dict, loop: str) -> list:
    if loop == "numpy":
        return run_recurrent(CELLS[op], inputs, attrs, use_native=False)
    old = library._lib.optcli_recurrent_split_from(0 if "split" in loop else -1)
    library._lib.optcli_recurrent_lanes(8 if "8 lanes" in loop else 0)
    try:
        return run_recurrent(CELLS[op], inputs, attrs)
    finally:
        library._lib.optcli_recurrent_split_from(old)
        library._lib.optcli_recurrent_lanes(0)


def check(op: str, values: dict, attrs: dict) -> None:
    expected = _ort(op, values, attrs)
    inputs = [values.get(n) for n in INPUT_NAMES[op]]
    for loop in LOOPS:
        got = _run_loop(op, inputs, attrs, loop)
        for k, e in enumerate(expected):
            assert_close(got[k], e, what=f"{op} output {k} ({loop} loop) {attrs}")


# Every combination of the structural attributes, for each cell.
STRUCTURE = list(itertools.product(["forward", "reverse", "bidirectional"], [0, 1], [True, False], [False, True]))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction,layout,bias,initial", STRUCTURE)
def test_structure(op, direction, layout, bias, initial):
    values, attrs = _case(op, direction=direction, layout=layout, bias=bias, initial=initial)
    check(op, values, attrs)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_sequence_lengths(op, direction, layout):
    """Rows shorter than the sequence: zeros past their end, their last state in Y_h, the reverse
    direction starting at their last step; a zero length keeps the initial state."""
    values, attrs = _case(op, seq=6, batch=4, direction=direction, layout=layout, lens=[6, 3, 1, 0], initial=True)
    check(op, values, attrs)


@pytest.mark.parametrize("peep,input_forget,clip", list(itertools.product([False, True], [0, 1], [None, 0.7])))
def test_lstm_peepholes_input_forget_clip(peep, input_forget, clip):
    extra = {"input_forget": input_forget}
    if clip is not None:
        extra["clip"] = clip
    values, attrs = _case("LSTM", direction="bidirectional", peep=peep, initial=True, **extra)
    check("LSTM", values, attrs)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_gru_linear_before_reset_and_clip(linear_before_reset, clip):
    extra = {"linear_before_reset": linear_before_reset}
    if clip is not None:
        extra["clip"] = clip
    values, attrs = _case("GRU", direction="bidirectional", initial=True, **extra)
    check("GRU", values, attrs)


ACTIVATION_SETS = {
    "LSTM": [["Sigmoid", "Tanh", "Tanh"], ["HardSigmoid", "Relu", "LeakyRelu"], ["Sigmoid", "Softsign", "Elu"],
             ["Affine", "ScaledTanh", "Softplus"], ["HardSigmoid", "ThresholdedRelu", "Tanh"]],
    "GRU": [["HardSigmoid", "Relu"], ["Sigmoid", "LeakyRelu"], ["Sigmoid", "ScaledTanh"], ["Softsign", "Elu"]],
    "RNN": [["Relu"], ["LeakyRelu"], ["Sigmoid"], ["Affine"], ["Softplus"], ["ThresholdedRelu"]],
}


@pytest.mark.parametrize("op,acts", [(op, a) for op, sets in ACTIVATION_SETS.items() for a in sets])
@pytest.mark.parametrize("with_params", [False, True])
def test_activations(op, acts, with_params):
    """The activation lists, with alpha/beta from the attributes (consumed in order by the
    activations that take them) or their defaults."""
    extra: dict = {"activations": acts * 2}
    if with_params:
        extra["activation_alpha"] = [0.3, 0.6, 0.9, 0.4, 0.7, 0.2]
        extra["activation_beta"] = [0.25, 0.5, 0.75, 0.4]
    values, attrs = _case(op, direction="bidirectional", **extra)
    check(op, values, attrs)


@pytest.mark.parametrize("op,hidden,direction", [("LSTM", 77, "forward"), ("GRU", 129, "bidirectional"),
                                                ("RNN", 70, "reverse")])
def test_batch_of_one_long_sequence_and_wide_hidden(op, hidden, direction):
    """The speech-model shape: batch 1, a long sequence, a hidden size past the 64-wide column block
    (and not a multiple of 8: the scalar tail of the product).  Forty steps feed each one's rounding
    into the next, as forty layers of a deep net do: checked as the end-to-end model tests are,
    the largest error against RELATIVE of the tensor's scale."""
    values, attrs = _case(op, seq=40, batch=1, size=20, hidden=hidden, direction=direction, initial=True)
    expected = _ort(op, values, attrs)
    for loop in LOOPS:
        got = _run_loop(op, [values.get(n) for n in INPUT_NAMES[op]], attrs, loop)
        for k, e in enumerate(expected):
            err, scale = max_error(got[k], e)
            assert err <= RELATIVE["fp32"] * scale, f"{op} output {k}, {loop} loop: {err} at scale {scale}"


def test_float64_and_float16():
    """Other float types: float64 computed in float64, float16 in float32; results in their type."""
    values, attrs = _case("LSTM", direction="reverse", initial=True)
    expected = _ort("LSTM", values, attrs)  # onnxruntime's recurrent ops have no float64: its float32
    wide = {k: None if v is None else v.astype(np.float64) for k, v in values.items()}
    got = run_recurrent(CELLS["LSTM"], [wide.get(n) for n in INPUT_NAMES["LSTM"]], attrs)
    assert got[0].dtype == np.float64
    assert_close(got[0], expected[0], what="LSTM float64")
    half = {k: None if v is None else v.astype(np.float16) for k, v in values.items()}
    got = run_recurrent(CELLS["LSTM"], [half.get(n) for n in INPUT_NAMES["LSTM"]], attrs)
    assert got[0].dtype == np.float16
    assert_close(got[0], expected[0].astype(np.float16), precision="fp16", what="LSTM float16")


def test_bad_sequence_length_is_the_inputs_fault():
    values, attrs = _case("LSTM", seq=4, batch=2, lens=[4, 5])
    with pytest.raises(IndexError, match="sequence_lens holds 4..5, outside 0..4"):
        run_recurrent(CELLS["LSTM"], [values.get(n) for n in INPUT_NAMES["LSTM"]], attrs)


def test_activation_lists_are_checked():
    with pytest.raises(ShapeDerivationError, match="lists 2 activations; 3 are expected"):
        resolve_activations(CELLS["LSTM"], {"activations": ["Sigmoid", "Tanh"]}, 1)
    with pytest.raises(ShapeDerivationError, match="activation 'Gelu' is not one of"):
        resolve_activations(CELLS["RNN"], {"activations": ["Gelu"]}, 1)
    # One direction's list serves both directions of a bidirectional layer.
    assert len(resolve_activations(CELLS["GRU"], {"activations": ["Sigmoid", "Relu"]}, 2)) == 4


def _lstm_model(seq=7, batch=2, size=10, hidden=12, direction="bidirectional"):
    from onnx import TensorProto, helper, numpy_helper

    values, attrs = _case("LSTM", seq=seq, batch=batch, size=size, hidden=hidden, direction=direction)
    inits = [numpy_helper.from_array(values[n], n) for n in ("W", "R", "B")]
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], **attrs)
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, size])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), values["X"]


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm_of_8_bit_weights(tmp_path, per_channel):
    """quantize_dynamic's default (8-bit weights): optcli follows onnxruntime's integer numerics
    (tests/ops/test_recurrent_quant.py checks them to float32 rounding on 7-bit weights), but
    onnxruntime's x86 AVX2 / AVX-512 uint8 x int8 kernel saturates pairs of products to int16 with
    8-bit weights (its ARM and VNNI kernels do not), so the checks here are: optcli within the int8
    budget of the float model, and within --verify's int8 noise rule (20 dB) of onnxruntime's run."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import optcli

    model, x = _lstm_model()
    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8, per_channel=per_channel)
    quantized = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    predictor = optcli.load(optcli.optimize(model=quantized, valid_targets="arm").data)
    got = predictor.run({"X": x})
    quantized_ort = run_ort(quantized, {"X": x})
    float_ort = run_ort(model, {"X": x})
    for k, name in enumerate(("Y", "Y_h", "Y_c")):
        assert_close(got[name], float_ort[k], precision="int8", what=f"{name} against the float model")
        noise = np.sqrt(np.mean((got[name] - quantized_ort[k]) ** 2) / np.mean(quantized_ort[k] ** 2))
        assert noise <= VERIFY_NOISE["int8"], f"{name}: RMS difference {noise:.3f} of onnxruntime's quantized run"


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
@pytest.mark.parametrize("op,direction,peep", [("LSTM", "forward", False), ("LSTM", "bidirectional", True),
                                               ("GRU", "reverse", False), ("RNN", "bidirectional", False)])
def test_bound_step_runs_its_layer_as_one_prepared_call(op, direction, peep):
    """A bound step (StepAttrs) of float32 weights runs its whole layer, projection and time loop, as
    one call prepared per input shape (``_prepared_layer``): the numpy loop's values on every run;
    sequence_lens, layout 1, another input shape or other weights go the general way."""
    from unittest import mock

    from optcli.ops.evaluate import kernel_attrs
    from optcli.ops.recurrent import _prepared_layer

    cell, dirs, hidden, size = CELLS[op], 2 if direction == "bidirectional" else 1, 8, 6
    gh = cell.gates * hidden
    w = (RNG.standard_normal((dirs, gh, size)) * 0.5).astype(np.float32)
    r = (RNG.standard_normal((dirs, gh, hidden)) * 0.5).astype(np.float32)
    b = RNG.standard_normal((dirs, 2 * gh)).astype(np.float32)
    x = RNG.standard_normal((7, 2, size)).astype(np.float32)
    h0 = RNG.standard_normal((dirs, 2, hidden)).astype(np.float32)
    extra = [RNG.standard_normal((dirs, 2, hidden)).astype(np.float32),
             RNG.standard_normal((dirs, 3 * hidden)).astype(np.float32) if peep else None] if op == "LSTM" else []
    inputs = [x, w, r, b, None, h0, *extra]
    attrs = kernel_attrs({"hidden_size": hidden, "direction": direction}, 3 if op == "LSTM" else 2, {"": 14})
    want = run_recurrent(cell, inputs, dict(attrs), use_native=False)
    first = run_recurrent(cell, inputs, attrs)
    kept = attrs.memo.get("recurrent layer")
    assert kept is not None and kept[0] == (x.shape, not peep), "the first run did not prepare the layer"
    calls = []
    layer = kept[2]
    attrs.memo["recurrent layer"] = (kept[0], kept[1], lambda *a: calls.append(1) or layer(*a))
    for got in (first, run_recurrent(cell, inputs, attrs)):
        for g, e in zip(got, want):
            assert g.dtype == np.float32 and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert calls == [1]
    for a, e in zip(run_recurrent(cell, [np.asfortranarray(x), *inputs[1:]], attrs), first):
        np.testing.assert_array_equal(a, e)  # same bits run after run, for a transposed view of x too
    assert len(calls) == 2
    with mock.patch.object(library, "_lib", None):  # the library set aside: the numpy loop
        for g, e in zip(run_recurrent(cell, inputs, attrs), want):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert _prepared_layer(cell, x, w, r, b, extra[1] if peep else None, h0.astype(np.float64), None, attrs) is None
    lens = np.array([7, 4], np.int32)
    plain = dict(attrs)
    for args in ([x, w, r, b, lens, h0, *extra], [x[:5], w, r, b, None, h0, *extra],
                 [x, w, r, b, None, np.asfortranarray(h0), *extra], [x, w.copy(), r, b, None, h0, *extra]):
        for g, e in zip(run_recurrent(cell, args, attrs), run_recurrent(cell, args, plain, use_native=False)):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2, "the prepared layer ran for inputs it was not made for"
    # one prepared layer kept, the last shape's: a dynamic sequence length must not grow the memo
    layers = [k for k in attrs.memo if k == "recurrent layer" or (type(k) is tuple and k[:1] == ("recurrent layer",))]
    assert layers == ["recurrent layer"]
    from optcli.native import recurrent as native_recurrent

    with mock.patch.object(native_recurrent, "_RESIDUAL_MAX", 0):  # a large layer: projection and outputs apart
        big = kernel_attrs({"hidden_size": hidden, "direction": direction}, 3 if op == "LSTM" else 2, {"": 14})
        for _ in range(2):
            for g, e in zip(run_recurrent(cell, inputs, big), want):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
        assert big.memo.get("recurrent layer") is not None


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
@pytest.mark.parametrize("hidden", [1, 5, 8, 13, 64])
@pytest.mark.parametrize("loop", ["native", "native split"])
def test_lstm_default_gates_over_the_whole_float_range(hidden, loop):
    """An LSTM with the default activations runs its gates in one 8-lane pass (sigmoid8, tanh8 of
    simd.h): against the numpy loop on pre-activations from tiny to saturated (|v| from 1e-8 past
    10, where tanh is 1, and 90, where exp underflows), infinities and a NaN, for hidden sizes
    with and without a partial vector, on the sequential loop and the split one."""
    from optcli.native import recurrent as native_recurrent
    from optcli.ops.recurrent import _native_activations, _numpy_loop

    seq, batch, dirs = 6, 3, 2
    cell = CELLS["LSTM"]
    mags = np.array([1e-8, 1e-3, 0.3, 0.6, 0.7, 2.0, 9.0, 11.0, 30.0, 90.0, 1e7], np.float32)
    xp = (RNG.choice(mags, (dirs, seq, batch, 4 * hidden)) * RNG.choice([-1, 1], (dirs, seq, batch, 4 * hidden)))
    xp = xp.astype(np.float32)
    xp[0, 1, 0, :2] = [np.inf, -np.inf]
    xp[1, 2, 2, -1] = np.nan  # the last unit of a row: a partial vector's lane where hidden % 8
    rt = (RNG.standard_normal((dirs, hidden, 4 * hidden)) * 0.8 / np.sqrt(hidden)).astype(np.float32)
    h0 = RNG.standard_normal((dirs, batch, hidden)).astype(np.float32)
    c0 = RNG.standard_normal((dirs, batch, hidden)).astype(np.float32)
    acts = resolve_activations(cell, {}, dirs)
    want = _numpy_loop(cell, xp, rt, None, None, h0, c0, None, "bidirectional", acts, None, 0)
    old = library._lib.optcli_recurrent_split_from(0 if loop == "native split" else -1)
    try:
        got = native_recurrent.recurrent("LSTM", xp, rt, None, None, h0, c0, None, "bidirectional",
                                         *_native_activations(cell, acts, dirs), None, 0)
    finally:
        library._lib.optcli_recurrent_split_from(old)
    with np.errstate(invalid="ignore"):
        for g, e in zip(got, want):
            np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
            np.testing.assert_allclose(g, e, rtol=2e-6, atol=2e-6)
