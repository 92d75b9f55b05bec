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


def _unfused(a, b, b_scale, b_zp, bias):
    """The chain op by op, as the general path of the kernel runs it: the uint8 tensor made, the
    integer product, the scales, the bias."""
    from optcli.ops import quant

    a_scale, a_zp = quant.dynamic_quant_params(a)
    acc = quant.int_matmul(quant.quantize(a, a_scale, a_zp, np.dtype(np.uint8)), a_zp, b, b_zp)
    y = acc.astype(np.float32) * (a_scale * np.asarray(b_scale, np.float32))
    return (y if bias is None else y + bias).astype(np.float32)


@pytest.mark.parametrize("case", range(40))
def test_the_float32_kernel_is_the_chain_to_the_bit(case):
    """The step's float32 path (A's centred values without the uint8 tensor, leading dims folded, B
    centred once in the step's memo) gives the chain's results bit for bit: odd shapes, all-positive
    and all-negative A (zero point 0 and 255), tiny and huge ranges, int8 and uint8 B with and without
    zero points, per-tensor and per-column scales, a bias or none; run twice (the memo's B)."""
    from optcli.ops import quant
    from optcli.ops.registry import StepAttrs

    rng = np.random.default_rng(case)
    shape = [(1, 100, 64), (3, 7), (5,), (2, 3, 4, 9), (1, 1), (2, 1, 257)][case % 6]
    n = int(rng.integers(1, 40))
    a = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 6)).astype(np.float32)
    a = np.abs(a) if case % 7 == 1 else -np.abs(a) if case % 7 == 2 else a
    dt = np.int8 if case % 2 else np.uint8
    b = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, (shape[-1], n)).astype(dt)
    b_scale = (rng.random(n if case % 4 < 2 else 1) * 0.1 + 1e-4).astype(np.float32).reshape(-1 if case % 4 < 2 else ())
    b_zp = None if case % 3 == 0 else rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, b_scale.shape).astype(dt)
    bias = None if case % 5 == 0 else rng.standard_normal(n).astype(np.float32)
    attrs = StepAttrs({})
    want = _unfused(a, b, b_scale, b_zp, bias)
    for run in ("first", "memo"):
        got = quant.dynamic_quantize_matmul([a, b, b_scale, b_zp, bias], attrs)[0]
        assert got.dtype == np.float32 and got.shape == shape[:-1] + (n,), run
        np.testing.assert_array_equal(got, want, err_msg=run)
    assert attrs.memo["centred weight"][0] is b
    from optcli import native
    from optcli.native import qgemm

    if native.available() and qgemm.variant() == 4 and dt is np.int8 and b_zp is None:
        # int8 B with no zero point fits the int8 panels: this run took vpdpbusd, to the same bits
        assert attrs.memo["dot weight"][2] is not None


def test_a_non_finite_input_takes_the_general_path():
    from optcli.ops import quant

    a = np.array([[1.0, np.inf, -2.0]], np.float32)
    b = np.arange(6, dtype=np.int8).reshape(3, 2)
    assert quant._dynamic_quantize_matmul_f32(a, b, np.float32(0.5), None, None, {}) is None
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(quant.dynamic_quantize_matmul([a, b, np.float32(0.5)], {})[0],
                                      _unfused(a, b, np.float32(0.5), None, None))
