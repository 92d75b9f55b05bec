"""Time optcli's integer plan of a QDQ model (onnxruntime's quantize_static) against optcli's fp32 plan and
onnxruntime on the same QDQ model, interleaved in one process (issue 26).

Each zoo model (224x224) is first pre-processed as onnxruntime recommends (``quant_pre_process``: BN
folded into the convs), then quantized with ``quantize_static`` (QDQ, per channel, u8 activations, s8
weights, calibrated on a few random images).  Rows: optcli ``arm`` on the fp32 model, optcli ``arm`` on the
QDQ model (its quantized convs as ``optcli.QConv`` integer steps), onnxruntime (all graph optimizations:
its QLinearConv fusions) on the fp32 and the QDQ model.  All at the same thread count, runs interleaved
round by round so a busy neighbour slows every row alike; minimum and median.  Outputs of the two QDQ
runs are compared in steps of the output's quantization, and with onnxruntime running the QDQ graph as
written (no fusions: DequantizeLinear, float Conv, QuantizeLinear), whose results its fused integer kernels
leave where their saturating int16 pair sums (AVX2 without VNNI) overflow.

    .venv/bin/python benchmarks/bench_int8.py --threads 2 --runs 40
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optcli  # noqa: E402
from optcli.zoo import build  # noqa: E402

MODELS = {"MobileNetV2": "mobilenet_v2", "EfficientNet-Lite0": "efficientnet_lite0"}


def quantize(model: onnx.ModelProto, folder: Path, shape: list[int], name: str) -> tuple[Path, Path]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    raw, fp32, qdq = folder / "raw.onnx", folder / "fp32.onnx", folder / "qdq.onnx"
    onnx.save(model, raw)
    quant_pre_process(str(raw), str(fp32), skip_symbolic_shape=True)
    rng = np.random.default_rng(0)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(fp32), str(qdq), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return fp32, qdq


def ort_session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def output_step(path: Path) -> float | None:
    """The quantization step of the QDQ model's output (its last DequantizeLinear's scale), if any."""
    model = onnx.load(str(path))
    producers = {o: n for n in model.graph.node for o in n.output}
    dq = producers.get(model.graph.output[0].name)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(inits[dq.input[1]]) if dq is not None and dq.op_type == "DequantizeLinear" else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    for label in args.models.split(","):
        model = build(MODELS[label], resolution=224)
        inp = model.graph.input[0]
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        with tempfile.TemporaryDirectory() as tmp:
            fp32, qdq = quantize(model, Path(tmp), shape, inp.name)
            plan_fp32 = optcli.optimize(model_file=str(fp32), valid_targets="arm")
            plan_int8 = optcli.optimize(model_file=str(qdq), valid_targets="arm")
            steps = collections.Counter(f"{s.op_type}" for s in plan_int8.plan.steps)
            runners = {
                "optcli arm fp32": optcli.load(plan_fp32.data, threads=args.threads).run,
                "optcli arm int8 (QDQ model)": optcli.load(plan_int8.data, threads=args.threads).run,
            }
            sessions = {"onnxruntime fp32": ort_session(fp32, args.threads),
                        "onnxruntime QDQ model": ort_session(qdq, args.threads)}
            for key, session in sessions.items():
                runners[key] = functools.partial(session.run, None)
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            feeds = {inp.name: x}
            ours = list(runners["optcli arm int8 (QDQ model)"](feeds).values())[0]
            theirs = runners["onnxruntime QDQ model"](feeds)[0]
            plain = ort.SessionOptions()
            plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            as_written = ort.InferenceSession(str(qdq), plain, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            step = output_step(qdq)
            times: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(3):  # warm-up
                for run in runners.values():
                    run(feeds)
            for _ in range(args.runs):
                for key, run in runners.items():
                    t = time.perf_counter()
                    run(feeds)
                    times[key].append((time.perf_counter() - t) * 1e3)
        print(f"\n## {label} (224x224, {args.threads} threads, {args.runs} interleaved runs)")
        print(f"int8 plan: {dict(steps.most_common())}")
        if step:
            diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) / step
            print(f"output vs onnxruntime QDQ: max {diff.max():.1f} steps, {np.mean(diff > 0.5) * 100:.1f}% differ")
            diff = np.abs(ours.astype(np.float64) - as_written.astype(np.float64)) / step
            print(f"output vs onnxruntime running the QDQ graph as written (no fusions): max {diff.max():.1f} steps, "
                  f"{np.mean(diff > 0.5) * 100:.1f}% differ")
        print("| runtime | min ms | median ms |\n|---|---|---|")
        for key, ts in times.items():
            print(f"| {key} | {min(ts):.2f} | {statistics.median(ts):.2f} |")
        # a busy neighbour slows a whole round alike: the ratio within each round is steadier than either time
        ratios = [i / f for i, f in zip(times["optcli arm int8 (QDQ model)"], times["optcli arm fp32"])]
        print(f"optcli int8 / fp32, median of per-round ratios: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
