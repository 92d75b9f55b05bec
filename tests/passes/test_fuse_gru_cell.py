"""fuse_gru_cell: a GRU cell spelled out in a Loop body (an attention decoder's) becomes one ONNX GRU
step, for the forms exporters write (onnxscript's (1 - z) * n + z * h, paddle's (h - n) * z + n,
torch's n + z * (h - n)), gates in any chunk order, MatMul + Add or Gemm, opset 11 and 17; and
stays as it is where an intermediate is read elsewhere or a weight is not a constant.  Every model
is checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.tolerance import describe_mismatch, within
from tests.passes.test_compile_bodies import _compiled_body

H, K, TRIPS = 5, 7, 4


def _dense(nodes: list, inits: list, x: str, w: np.ndarray, b: np.ndarray, out: str, gemm: bool) -> None:
    """out = x @ w + b, as MatMul + Add or as Gemm with transB = 1."""
    wname, bname = f"{out}_W", f"{out}_b"
    if gemm:
        inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), wname), numpy_helper.from_array(b, bname)]
        nodes.append(helper.make_node("Gemm", [x, wname, bname], [out], transB=1))
    else:
        inits += [numpy_helper.from_array(w, wname), numpy_helper.from_array(b, bname)]
        nodes += [helper.make_node("MatMul", [x, wname], [f"{out}_mm"]),
                  helper.make_node("Add", [f"{out}_mm", bname], [out])]


def _split(nodes: list, inits: list, src: str, outs: list[str], opset: int) -> None:
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([H, H, H], np.int64), f"{src}_sizes"))
        nodes.append(helper.make_node("Split", [src, f"{src}_sizes"], outs, axis=1))
    else:
        nodes.append(helper.make_node("Split", [src], outs, axis=1, split=[H, H, H]))


def _decoder(form: str, x_order: str = "rzn", h_order: str = "rzn", gemm: bool = False, opset: int = 17,
             leak: bool = False, outer_weight: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A Loop of TRIPS steps: x_t = tanh(h @ A) (a decoder feeding its state back), then the GRU
    cell on (x_t, h); h carried and each step's h a scan output (``leak``: r as well)."""
    rng = np.random.default_rng(seed)
    nodes: list = []
    inits: list = []
    a = (rng.standard_normal((H, K)) * 0.5).astype(np.float32)
    inits.append(numpy_helper.from_array(a, "A"))
    nodes += [helper.make_node("MatMul", ["h_in", "A"], ["xa"]), helper.make_node("Tanh", ["xa"], ["x_t"])]
    wx = (rng.standard_normal((K, 3 * H)) * 0.5).astype(np.float32)
    wh = (rng.standard_normal((H, 3 * H)) * 0.5).astype(np.float32)
    bx, bh = ((rng.standard_normal(3 * H) * 0.5).astype(np.float32) for _ in range(2))
    _dense(nodes, inits, "x_t", wx, bx, "gx", gemm)
    if outer_weight:  # the recurrent weight an input of the model: not a constant
        nodes += [helper.make_node("MatMul", ["h_in", "Wh_in"], ["gh_mm"]),
                  helper.make_node("Add", ["gh_mm", "gh_b"], ["gh"])]
        inits.append(numpy_helper.from_array(bh, "gh_b"))
    else:
        _dense(nodes, inits, "h_in", wh, bh, "gh", gemm)
    _split(nodes, inits, "gx", [f"x{g}" for g in x_order], opset)
    _split(nodes, inits, "gh", [f"h{g}" for g in h_order], opset)
    inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    nodes += [helper.make_node("Add", ["xr", "hr"], ["r_pre"]), helper.make_node("Sigmoid", ["r_pre"], ["r"]),
              helper.make_node("Add", ["hz", "xz"], ["z_pre"]), helper.make_node("Sigmoid", ["z_pre"], ["z"]),
              helper.make_node("Mul", ["hn", "r"], ["rh"]), helper.make_node("Add", ["xn", "rh"], ["n_pre"]),
              helper.make_node("Tanh", ["n_pre"], ["n"])]
    if form == "onnxscript":
        nodes += [helper.make_node("Sub", ["one", "z"], ["omz"]), helper.make_node("Mul", ["omz", "n"], ["a1"]),
                  helper.make_node("Mul", ["z", "h_in"], ["a2"]), helper.make_node("Add", ["a1", "a2"], ["h_out"])]
    elif form == "flipped":  # (1 - z) * h + z * n: another cell, not ONNX's GRU
        nodes += [helper.make_node("Sub", ["one", "z"], ["omz"]), helper.make_node("Mul", ["omz", "h_in"], ["a1"]),
                  helper.make_node("Mul", ["z", "n"], ["a2"]), helper.make_node("Add", ["a1", "a2"], ["h_out"])]
    elif form == "paddle":
        nodes += [helper.make_node("Sub", ["h_in", "n"], ["d"]), helper.make_node("Mul", ["d", "z"], ["dz"]),
                  helper.make_node("Add", ["dz", "n"], ["h_out"])]
    else:  # torch
        nodes += [helper.make_node("Sub", ["h_in", "n"], ["d"]), helper.make_node("Mul", ["z", "d"], ["dz"]),
                  helper.make_node("Add", ["n", "dz"], ["h_out"])]
    nodes += [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
              helper.make_node("Identity", ["r" if leak else "h_out"], ["scan"])]
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, H])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, H]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, H])],
        inits)
    inputs = [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, H])]
    if outer_weight:
        inputs.append(helper.make_tensor_value_info("Wh_in", TensorProto.FLOAT, [H, 3 * H]))
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "h0"], ["h_final", "hs"], body=body)], "decoder", inputs,
        [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("hs", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(TRIPS, np.int64), "trips")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, seed: int = 1) -> list[str]:
    """The compiled body's op types, after checking the model's outputs against onnxruntime."""
    rng = np.random.default_rng(seed)
    feeds = {"h0": rng.standard_normal((1, H)).astype(np.float32)}
    if len(model.graph.input) > 1:
        feeds["Wh_in"] = (rng.standard_normal((H, 3 * H)) * 0.5).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    data = optcli.optimize(model=model, valid_targets="arm").data
    got = list(optcli.load(data).run(feeds).values())
    for g, e in zip(got, expected):
        assert g.shape == e.shape and within(g, e), describe_mismatch(g, e)
    return [n.op_type for n in _compiled_body(data).node]


@pytest.mark.parametrize("form", ["onnxscript", "paddle", "torch"])
@pytest.mark.parametrize("orders", [("rzn", "rzn"), ("zrn", "zrn"), ("nzr", "rnz")])
def test_a_gru_cell_becomes_one_gru_step(form, orders):
    ops = _run(_decoder(form, *orders, seed=len(form)))
    assert ops.count("GRU") == 1
    assert not {"Split", "Sigmoid", "Sub", "Add", "Mul"} & set(ops)


@pytest.mark.parametrize("opset", [11, 17])
def test_gemm_layers_and_opset_11(opset):
    assert _run(_decoder("onnxscript", gemm=True, opset=opset)).count("GRU") == 1


@pytest.mark.parametrize("kind", ["leak", "outer_weight", "flipped"])
def test_a_cell_it_cannot_fold_stays(kind):
    """r read by a scan output, the recurrent weight an input, or z blending the other way round
    (not ONNX's GRU): the cell is left as written."""
    form = "flipped" if kind == "flipped" else "torch"
    ops = _run(_decoder(form, leak=kind == "leak", outer_weight=kind == "outer_weight"))
    assert "GRU" not in ops and "Split" in ops
