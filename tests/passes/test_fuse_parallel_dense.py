"""fuse_parallel_dense: FullyConnected layers reading one input -> one FullyConnected and a Split,
on host-only plans; the IR checked against onnxruntime on the original model (run_pass), and the
optimized plan run end to end."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.passes import fuse_conv_bias_activation, fuse_matmul_add, fuse_parallel_dense
from optcli.passes.base import PassContext
from optcli.targets import get_target
from tests.helpers import assert_close, run_ort
from tests.passes.ir_build import check_same, model, node, ops, to_graph

RNG = np.random.default_rng(11)


def _fc(x: str, w: str, y: str, b: str = "", act: str = "") -> list:
    """A dense layer as exporters write it: MatMul, then Add of the bias, then the activation."""
    out = f"{y}_pre" if act else y
    nodes = [node("MatMul", [x, w], [f"{y}_mm" if b else out])]
    if b:
        nodes.append(node("Add", [f"{y}_mm", b], [out]))
    if act:
        nodes.append(node(act, [out], [y]))
    return nodes


def run_pass(m, pass_module, ctx, feeds=None):
    """The dense layers made FullyConnected (with their epilogues) first, then the pass; the IR
    against onnxruntime on the original model."""
    graph = to_graph(m)
    fuse_matmul_add.run(graph, ctx)
    fuse_conv_bias_activation.run(graph, ctx)
    counts = pass_module.run(graph, ctx)
    check_same(m, graph, feeds)
    return graph, counts


def _host() -> PassContext:
    return PassContext(targets=[get_target("arm")])


def _weights(**shapes) -> dict[str, np.ndarray]:
    return {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _layers_model(opset: int = 17):
    """q, k, v (k without a bias) and a sigmoid layer of x; a layer of another input; y = sum."""
    inits = _weights(wq=(8, 5), wk=(8, 3), wv=(8, 5), ws=(8, 4), wo=(5, 4), bq=(5,), bv=(1, 5), bs=(4,))
    nodes = [*_fc("x", "wq", "q", "bq"), *_fc("x", "wk", "k"), *_fc("x", "wv", "v", "bv"),
             *_fc("x", "ws", "s", "bs", act="Sigmoid"), *_fc("q", "wo", "o"),
             node("ReduceSum", ["k"], ["ks"], keepdims=1, axes=[-1]) if opset < 13 else
             node("ReduceSum", ["k", "ax"], ["ks"], keepdims=1),
             node("Add", ["o", "s"], ["os"]), node("Add", ["os", "ks"], ["osk"]), node("Add", ["v", "v"], ["vv"]),
             node("Concat", ["osk", "vv"], ["y"], axis=-1)]
    if opset >= 13:
        inits["ax"] = np.array([-1], np.int64)
    return model(nodes, {"x": [2, 7, 8]}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 17])
def test_layers_of_one_input_and_one_epilogue_fuse(opset):
    graph, counts = run_pass(_layers_model(opset), fuse_parallel_dense, _host(),
                             feeds={"x": RNG.standard_normal((2, 7, 8)).astype(np.float32)})
    assert counts == {"groups": 1, "layers": 3}
    fcs = [n for n in graph.nodes if n.op_type == "FullyConnected"]
    assert len(fcs) == 3  # q+k+v fused, the sigmoid one (another epilogue), the one reading q
    split = next(n for n in graph.nodes if n.op_type == "Split")
    assert split.outputs == ["q", "k", "v"]
    assert (len(split.inputs) == 2) == (opset >= 13) and (("split" in split.attrs) == (opset < 13))
    fused = graph.const(fcs[0].inputs[1])
    assert fused.shape == (8, 13)
    assert ops(graph).index("Split") < ops(graph).index("ReduceSum")


def test_a_plan_with_a_gpu_target_keeps_its_layers():
    ctx = PassContext(targets=[get_target("opencl"), get_target("arm")])
    graph, counts = run_pass(_layers_model(), fuse_parallel_dense, ctx)
    assert counts == {"groups": 0, "layers": 0} and "Split" not in ops(graph)


def test_layers_that_differ_stay_apart():
    inits = _weights(wa=(8, 5), wb=(6, 5), wc=(8, 5))
    nodes = [*_fc("x", "wa", "a", act="Relu"), *_fc("x", "wc", "c"),  # another epilogue
             node("Slice", ["x", "st", "en", "axs"], ["x6"]), *_fc("x6", "wb", "b"),  # another input
             node("Add", ["a", "c"], ["ac"]), node("Concat", ["ac", "b"], ["y"], axis=-1)]
    inits.update(st=np.array([0], np.int64), en=np.array([6], np.int64), axs=np.array([-1], np.int64))
    graph, counts = run_pass(model(nodes, {"x": [3, 8]}, initializers=inits), fuse_parallel_dense, _host())
    assert counts["groups"] == 0 and "Split" not in ops(graph)


def test_attention_projections_fuse_end_to_end():
    """x -> q, k, v projections (MatMul + Add, as torch exports them) -> scores -> softmax -> context:
    the optimized host plan has one FullyConnected for the three and matches onnxruntime."""
    d = 16
    w = {f"w{c}": (RNG.standard_normal((d, d)) / 4).astype(np.float32) for c in "qkv"}
    b = {f"b{c}": RNG.standard_normal(d).astype(np.float32) for c in "qkv"}
    nodes = []
    for c in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"m{c}"]),
                  helper.make_node("Add", [f"m{c}", f"b{c}"], [c])]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "t", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "t", d])],
                              [numpy_helper.from_array(v, k) for k, v in {**w, **b}.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = optcli.optimize(model=m, valid_targets="arm").data
    steps = optcli.load(data).plan.steps
    assert sum(s.op_type == "FullyConnected" for s in steps) == 1 and any(s.op_type == "Split" for s in steps)
    for t in (5, 32):
        x = RNG.standard_normal((2, t, d)).astype(np.float32)
        want = run_ort(m, {"x": x})[0]
        for threads in (1, 2):
            assert_close(optcli.load(data, threads=threads).run({"x": x})["y"], want, what=f"t={t}, {threads} threads")
