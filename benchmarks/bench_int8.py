"""Time optcli's integer plan of a QDQ model (onnxruntime's quantize_static) against optcli's fp32 plan and
onnxruntime on the same QDQ model, interleaved in one process (issue 26).

Each zoo model (224x224) is first pre-processed as onnxruntime recommends (``quant_pre_process``: BN
folded into the convs), then quantized with ``quantize_static`` (QDQ, per channel, u8 activations, s8
weights, calibrated on a few random images).  Rows: optcli ``arm`` on the fp32 model, optcli ``arm`` on the
QDQ model (its quantized convs as ``optcli.QConv`` integer steps), onnxruntime (all graph optimizations:
its QLinearConv fusions) on the fp32 and the QDQ model.  All at the same thread count, runs interleaved
round by round so a busy neighbour slows every row alike; minimum and median; the plans' peak activation
memory (the memory planner's figure).  Outputs of the two QDQ runs are compared in steps of the output's
quantization, and with onnxruntime running the QDQ graph as written (no fusions: DequantizeLinear, float
Conv, QuantizeLinear), whose results its fused integer kernels leave where their saturating int16 pair
sums (AVX2 without VNNI) overflow.

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

MODELS = {"MobileNetV2": "mobilenet_v2", "EfficientNet-Lite0": "efficientnet_lite0", "MobileNetV3": "mobilenet_v3",
          "ResNet-18": "resnet18"}
# the corpus's real conv nets (corpus/README.md; OPTCLI_CORPUS_DIR), run where the corpus is built
CORPUS_MODELS = {"RegNetX-200MF (corpus)": "dynamo_regnetx_002_op18_dynbatch",
                 "YOLOv8n detector (corpus)": "nudenet_320n"}


def load_model(label: str) -> tuple[onnx.ModelProto, list[int], str]:
    """(the fp32 model with its input's dims pinned, the input's shape, its name)."""
    if label in MODELS:
        model = build(MODELS[label], resolution=224)
        inp = model.graph.input[0]
        return model, [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim], inp.name
    from corpus.evaluate import corpus_dir, load_manifest
    folder = corpus_dir()
    entry = next((e for e in load_manifest(folder) if e["name"] == CORPUS_MODELS[label]), None)
    if entry is None:
        raise SystemExit(f"{CORPUS_MODELS[label]} is not in the corpus at {folder}: build it (corpus/README.md)")
    model = onnx.load(str(folder / entry["file"]))
    spec = entry["inputs"][0]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d, n in zip(dims, spec["shape"]):
        d.Clear()
        d.dim_value = n  # pinned: onnxruntime's quantizer and optcli see one static shape
    return model, list(spec["shape"]), spec["name"]


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


def calibration_folder(folder: Path, shape: list[int]) -> Path:
    """The images onnxruntime's quantizer calibrated on (the same seed), as .npy files for optcli's PTQ."""
    out = folder / "calib"
    out.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        np.save(out / f"{i}.npy", rng.standard_normal(shape).astype(np.float32))
    return out


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


def kind_of(step) -> str:
    """A step's kind for the per-step table: convs by shape (1x1, depthwise and its stride, dense), integer
    and float steps of one op under one name."""
    op = {"QConv": "Conv", "QAdd": "Add"}.get(step.op_type, step.op_type)
    if op != "Conv":
        return op
    if int(step.attrs.get("group", 1)) > 1:
        return f"Conv depthwise, stride {step.attrs.get('strides', [1])[0]}"
    return "Conv 1x1" if tuple(step.attrs.get("kernel_shape", ())) == (1, 1) else "Conv dense (the stem)"


def step_kinds(predictor, feeds: dict, repeats: int) -> dict[str, float]:
    """Each step of the plan run ``repeats`` times on its own inputs (the plan run once in order to make
    them), its minimum kept, summed by kind (ms): which kinds of step the int8 plan gains or loses on,
    steadier than whole runs on a busy machine (warm caches flatter the large layers alike in both plans)."""
    ex = predictor._executor
    env = dict(ex.plan.weights)
    env.update(feeds)
    out: dict[str, float] = collections.defaultdict(float)
    with predictor._limiter:
        for step, fn in zip(ex.plan.steps, ex.fns):
            args = [env[n] if n else None for n in step.inputs]
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                outs = fn(args)
                best = min(best, time.perf_counter() - t)
            env.update({n: a for n, a in zip(step.outputs, outs) if n})
            out[kind_of(step)] += best * 1e3
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated; the zoo's {', '.join(MODELS)} and, where the corpus is built, "
                         f"{', '.join(CORPUS_MODELS)}")
    ap.add_argument("--steps", type=int, default=0, metavar="N",
                    help="also time each step of both optcli plans N times and print their minimums by kind")
    ap.add_argument("--write-docs", action="store_true",
                    help="also write the summary table into docs/benchmarks-int8.md (its block for this thread count)")
    args = ap.parse_args(argv)
    summary = []
    for label in args.models.split(","):
        model, shape, input_name = load_model(label)
        with tempfile.TemporaryDirectory() as tmp:
            fp32, qdq = quantize(model, Path(tmp), shape, input_name)
            plan_fp32 = optcli.optimize(model_file=str(fp32), valid_targets="arm")
            plan_int8 = optcli.optimize(model_file=str(qdq), valid_targets="arm")
            plan_ptq = optcli.optimize(model_file=str(fp32), valid_targets="arm", quant_type="INT8",
                                       calib_data=str(calibration_folder(Path(tmp), shape)))
            steps = collections.Counter(f"{s.op_type}" for s in plan_int8.plan.steps)
            ptq_steps = collections.Counter(f"{s.op_type}" for s in plan_ptq.plan.steps)
            predictors = [optcli.load(p.data, threads=args.threads) for p in (plan_fp32, plan_int8, plan_ptq)]
            runners = {"optcli arm fp32": predictors[0].run, "optcli arm int8 (QDQ model)": predictors[1].run,
                       "optcli arm int8 (own PTQ)": predictors[2].run}
            sessions = {"onnxruntime fp32": ort_session(fp32, args.threads),
                        "onnxruntime QDQ model": ort_session(qdq, args.threads)}
            for key, session in sessions.items():
                runners[key] = functools.partial(session.run, None)
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            feeds = {input_name: x}
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
        print(f"\n## {label} ({'x'.join(map(str, shape[2:]))}, {args.threads} threads, {args.runs} interleaved runs)")
        print(f"int8 plan: {dict(steps.most_common())}")
        print(f"own PTQ plan: {dict(ptq_steps.most_common())}")
        peak = [r.report["memory"]["peak_activation_bytes"] for r in (plan_fp32, plan_int8, plan_ptq)]
        print(f"peak activation memory: fp32 plan {peak[0] / 1e6:.2f} MB, int8 plan {peak[1] / 1e6:.2f} MB "
              f"({peak[1] / peak[0]:.2f}x), own PTQ plan {peak[2] / 1e6:.2f} MB ({peak[2] / peak[0]:.2f}x)")
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
        vs_ort = [i / o for i, o in zip(times["optcli arm int8 (QDQ model)"], times["onnxruntime QDQ model"])]
        ptq = [i / f for i, f in zip(times["optcli arm int8 (own PTQ)"], times["optcli arm fp32"])]
        print(f"optcli own PTQ / fp32, median of per-round ratios: {statistics.median(ptq):.2f}")
        summary.append((label, {k: min(v) for k, v in times.items()}, statistics.median(ratios),
                        statistics.median(vs_ort), peak[1] / peak[0], statistics.median(ptq), peak[2] / peak[0]))
        if args.steps:
            kinds = [step_kinds(p, feeds, args.steps) for p in predictors[:2]]
            print(f"\nper-step minimums of {args.steps} runs, summed by kind (ms)")
            print("| kind | fp32 plan | int8 plan |\n|---|---|---|")
            by_size = sorted(set(kinds[0]) | set(kinds[1]), key=lambda k: -max(kinds[0].get(k, 0), kinds[1].get(k, 0)))
            for kind in by_size:
                print(f"| {kind} | {kinds[0].get(kind, 0):.3f} | {kinds[1].get(kind, 0):.3f} |")
            print(f"| all | {sum(kinds[0].values()):.2f} | {sum(kinds[1].values()):.2f} |")
    if args.write_docs:
        write_docs(summary, args)


def write_docs(summary: list, args) -> None:
    """The summary table (minimums, per-round ratio medians, peak memory) into docs/benchmarks-int8.md, between
    the markers for this thread count (added at the top of the figures if absent)."""
    import platform
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    head = ("| model | optcli fp32 | optcli int8 (QDQ) | optcli int8 (own PTQ) | onnxruntime fp32 | onnxruntime QDQ | "
            "int8 / fp32 | int8 / onnxruntime QDQ | own PTQ / fp32 | peak memory int8 / fp32 | own PTQ |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = [f"| {label} | {t['optcli arm fp32']:.2f} | {t['optcli arm int8 (QDQ model)']:.2f} | "
            f"{t['optcli arm int8 (own PTQ)']:.2f} | {t['onnxruntime fp32']:.2f} | {t['onnxruntime QDQ model']:.2f} | "
            f"{r:.2f} | {o:.2f} | {p:.2f} | {m:.2f} | {pm:.2f} |" for label, t, r, o, m, p, pm in summary]
    marker = f"<!-- bench_int8 threads={args.threads}"
    begin, end = f"{marker}: begin -->", f"{marker}: end -->"
    block = "\n".join([begin, f"{args.threads} thread{'s' * (args.threads > 1)}, {args.runs} interleaved rounds, "
                        f"ms minimums; ratios are medians of per-round ratios ({cpu}, "
                        f"`bench_int8.py --threads {args.threads} --runs {args.runs} --write-docs`):", "",
                        head, *rows, end])
    path = ROOT / "docs" / "benchmarks-int8.md"
    text = path.read_text()
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        anchor = "\n## "
        at = text.index(anchor) if anchor in text else len(text)
        text = text[:at] + "\n" + block + "\n" + text[at:]
    path.write_text(text)


if __name__ == "__main__":
    main()
