"""quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scales) (-> Add bias)
chains become one optcli.DynamicQuantizeMatMul, onnxruntime's results to the bit."""

from __future__ import annotations

import numpy as np
import pytest

import optcli
from optcli.passes import fuse_dynamic_quant_matmul
from optcli.passes.base import PassContext
from tests.passes.ir_build import run_ir
from tests.quant.quantized_models import dense_net, feeds, ort_extended_nodes, ort_run, quantized


@pytest.fixture(scope="module", params=[False, True], ids=["per-tensor", "per-channel"])
def dynamic(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dyn")
    return quantized(dense_net(), "dynamic", folder, per_channel=request.param), folder


def test_every_chain_is_one_step_and_matches_onnxruntime_to_the_bit(dynamic):
    model, folder = dynamic
    result = optcli.optimize(model=model, valid_targets="arm")
    ops = result.report["ops_after"]
    # three products (two sharing one quantized input), two with a bias; the Relu is the Mul's epilogue
    assert ops == {"DynamicQuantizeMatMul": 3, "Mul": 1}
    assert len(result.report["steps"]) <= ort_extended_nodes(model, folder)
    predictor = optcli.load(result.data)
    for seed in range(4):
        x = feeds(model, seed)
        x["x"] *= np.float32(1 + 3 * seed)  # other ranges, other scales
        assert np.array_equal(predictor.run(x)["y"], ort_run(model, x)[0])


def test_the_pass_alone(dynamic):
    model, _ = dynamic
    graph = optcli.frontend.onnx_reader.read_model(model=model)
    x = feeds(model, 7)
    before = run_ir(graph, x)[0]
    counts = fuse_dynamic_quant_matmul.run(graph, PassContext())
    assert counts == {"fused": 3}
    ops = [n.op_type for n in graph.nodes]
    assert "MatMulInteger" not in ops and "Cast" not in ops and ops.count("DynamicQuantizeMatMul") == 3
    fused = [n for n in graph.nodes if n.op_type == "DynamicQuantizeMatMul"]
    assert sorted(len(n.inputs) for n in fused) == [4, 5, 5]  # (x, w, w_scale, w_zp[, bias])
    assert np.array_equal(run_ir(graph, x)[0], before)


def test_a_chain_with_another_reader_is_left_alone(dynamic):
    """The integer product read twice: fusing would have to keep it anyway."""
    model, _ = dynamic
    graph = optcli.frontend.onnx_reader.read_model(model=model)
    mm = next(n for n in graph.nodes if n.op_type == "MatMulInteger")
    graph.nodes.append(optcli.ir.Node("Identity", [mm.outputs[0]], ["extra"], {}, "extra"))
    graph.outputs.append(optcli.ir.Value("extra", "int32", None))
    assert fuse_dynamic_quant_matmul.run(graph, PassContext()) == {"fused": 2}
