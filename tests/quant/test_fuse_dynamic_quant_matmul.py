"""quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scales) (-> Add bias)
chains become one optcli.DynamicQuantizeMatMul, the ONNX reference's results to the bit, and
onnxruntime's where its integer product is exact.

onnxruntime multiplies u8 x s8 with AVX2's vpmaddubsw where the CPU has no VNNI: pairs of products
saturate at int16, so its MatMulInteger is not exact there (on a 2-core AMD EPYC with AVX2 only,
per-channel results differed from the ONNX reference by up to 10% of the output's range, optcli by
nothing).  With VNNI (vpdpbusd) its products are exact and the two must agree to the bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import optcli
from optcli.passes import fuse_dynamic_quant_matmul
from optcli.passes.base import PassContext
from tests.passes.ir_build import run_ir
from tests.quant.quantized_models import dense_net, feeds, ort_extended_nodes, ort_run, quantized


@pytest.fixture(scope="module", params=[False, True], ids=["per-tensor", "per-channel"])
def dynamic(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dyn")
    return quantized(dense_net(), "dynamic", folder, per_channel=request.param), folder


def _onnxruntime_is_exact() -> bool:
    """Whether this CPU has VNNI, where onnxruntime's u8 x s8 products do not saturate (x86 Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return bool({"avx512_vnni", "avx_vnni"} & flags) or not ({"avx2", "avx512f"} & flags)


def test_every_chain_is_one_step_and_matches_onnxruntime_to_the_bit(dynamic):
    model, folder = dynamic
    result = optcli.optimize(model=model, valid_targets="arm")
    ops = result.report["ops_after"]
    # three products (two sharing one quantized input), two with a bias; the Relu is the Mul's epilogue
    assert ops == {"DynamicQuantizeMatMul": 3, "Mul": 1}
    assert len(result.report["steps"]) <= ort_extended_nodes(model, folder)
    predictor = optcli.load(result.data)
    reference = ReferenceEvaluator(model)
    for seed in range(4):
        x = feeds(model, seed)
        x["x"] *= np.float32(1 + 3 * seed)  # other ranges, other scales
        got = predictor.run(x)["y"]
        assert np.array_equal(got, reference.run(None, x)[0])
        if _onnxruntime_is_exact():
            assert np.array_equal(got, ort_run(model, x)[0])


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
