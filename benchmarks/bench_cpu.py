"""Time the `arm` target (the host CPU: numpy kernels, and the native C kernels of optcli.native
where they are built) against onnxruntime's CPU EP.

Both run with the same thread count: onnxruntime with ``intra_op_num_threads=N`` and
``inter_op_num_threads=1``, optcli with ``optcli.load(..., threads=N)``.  Models are the full-size
zoo builds (224x224, batch 1, 1000 classes) and, with ``--corpus``, real exporters' models from the
corpus cache (corpus/README.md).  Outputs are compared (max abs error) before timing.

    .venv/bin/python benchmarks/bench_cpu.py --threads 2 --runs 20 --corpus default --write-docs
    OPTCLI_NATIVE=0 .venv/bin/python benchmarks/bench_cpu.py ...   # the numpy kernels only

``--write-docs`` writes docs/benchmarks.md: the command, date, machine, the table and the
per-op breakdown of the slowest optcli model.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optcli  # noqa: E402
from benchmarks import contention, step_overhead  # noqa: E402
from optcli import native  # noqa: E402
from optcli.tolerance import describe_mismatch, max_error, within  # noqa: E402
from optcli.zoo.models import FULL_SIZE, build, sample_inputs  # noqa: E402

MODELS = {  # label -> zoo name
    "MobileNetV2": "mobilenet_v2",
    "ResNet-18": "resnet18",
    "EfficientNet-Lite0": "efficientnet_lite0",
}
AIM = 2.0  # optcli should be within this factor of onnxruntime
# Real models with a fixed 1x3xHxW image input from the corpus (corpus/build.py), mostly the
# depthwise-conv family the host target was slowest on, plus a dense one.
DEFAULT_CORPUS = [
    "ts_tf_mobilenetv3_small_minimal_100_op13",
    "ts_tf_efficientnet_lite0_op13",
    "ts_mixnet_s_op13_dynbatch",
    "ts_convnext_atto_op17",
    "ts_regnetx_002_op13",
    "ts_resnet18_op13",
    "mediapipe_face_detection_short_range_t2o",
    "mediapipe_hand_landmark_lite_t2o",
    "mediapipe_iris_landmark_t2o",
    # small on-device nets, where the time per op decides (issue 25; corpus/recipes_small.py)
    "ts_mtcnn_rnet_op11",
    "ts_mtcnn_pnet_op11_dynhw",
    "ts_mel_frontend_op17",
    "ts_fpn_text_detector_op13",
    # a YOLOv8n detector (C2f blocks: channel Split/Concat, nearest upsampling) and a transformer
    # (torch's shape arithmetic around 2 encoder layers, dynamic sequence)
    "nudenet_320n",
    "ts_bert_tiny_op14_dynseq",
]


# --------------------------------------------------------------------------- model facts
def count_params(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer)


def count_macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of Conv, ConvTranspose, Gemm and MatMul (from inferred shapes)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 0 for d in dims]
    for t in inferred.graph.initializer:
        shapes[t.name] = list(t.dims)
    macs = 0
    for n in inferred.graph.node:
        out = shapes.get(n.output[0]) if n.output else None
        if not out:
            continue
        if n.op_type == "Conv" and n.input[1] in shapes:
            w = shapes[n.input[1]]  # [M, C/group, kh, kw]
            macs += int(np.prod(out)) * int(np.prod(w[1:]))
        elif n.op_type == "ConvTranspose" and n.input[0] in shapes and n.input[1] in shapes:
            w = shapes[n.input[1]]  # [C, M/group, kh, kw]
            macs += int(np.prod(shapes[n.input[0]])) * int(np.prod(w[1:]))
        elif n.op_type in ("Gemm", "MatMul") and n.input[0] in shapes:
            a = shapes[n.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            k = a[-2] if trans_a and len(a) >= 2 else a[-1]
            macs += int(np.prod(out)) * int(k)
    return macs


def count_plan_macs(plan) -> int:
    """MACs of the compiled plan's conv and matrix steps, from its static shapes: for exports whose
    conv shapes onnx's inference cannot derive (TF 'same' padding computed at run time)."""
    def shape(name):
        if name in plan.weights:
            return list(plan.weights[name].shape)
        v = plan.values.get(name)
        dims = list(v.shape) if v is not None and v.shape is not None else []
        return dims if dims and all(isinstance(d, int) for d in dims) else None

    macs = 0
    for s in plan.steps:
        out = shape(s.outputs[0]) if s.outputs else None
        w = shape(s.inputs[1]) if len(s.inputs) > 1 and s.inputs[1] else None
        if not out or not w:
            continue
        if s.op_type == "Conv":
            macs += int(np.prod(out)) * int(np.prod(w[1:]))
        elif s.op_type in ("Gemm", "MatMul", "FullyConnected"):
            macs += int(np.prod(out)) * (int(np.prod(w)) // max(1, out[-1]))  # K = weight size / N, any layout
    return macs


# ------------------------------------------------------------------------------- timing
def time_blocks(fns: list, warmup: int, runs: int, blocks: int = 2) -> list[list[float]]:
    """Times each of ``fns`` ``runs`` times in ms, in ``blocks`` alternating blocks per function.

    Each block starts with ``warmup`` untimed runs and a short pause, so one runtime's idle-spinning
    worker threads (OpenBLAS's, onnxruntime's) have gone to sleep before the other's block starts:
    interleaving single runs would let them steal a core from each other.  Alternating blocks
    (A B B A ...) spreads slow drifts in background load over both runtimes.
    """
    times: list[list[float]] = [[] for _ in fns]
    per_block = [runs // blocks + (1 if b < runs % blocks else 0) for b in range(blocks)]
    for b, n in enumerate(per_block):
        order = list(range(len(fns))) if b % 2 == 0 else list(reversed(range(len(fns))))
        for j in order:
            time.sleep(0.3)
            for _ in range(warmup):
                fns[j]()
            for _ in range(n):
                t0 = time.perf_counter()
                fns[j]()
                times[j].append((time.perf_counter() - t0) * 1e3)
    return times


def ort_session(model: onnx.ModelProto, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def step_breakdown(predictor, feeds: dict[str, np.ndarray], runs: int) -> tuple[list[dict], list[dict]]:
    """Per-step times of optcli's CPU executor: a copy of CpuExecutor.run with a clock around each kernel.

    Returns (one row per (op, kernel) summed over its steps, one row per step), times being the
    median over ``runs`` runs, both sorted slowest first.
    """
    ex = predictor._executor
    plan = ex.plan
    per_run: list[list[float]] = []
    shapes: dict[int, str] = {}
    for _ in range(runs):
        times = [0.0] * len(plan.steps)
        env: dict[str, np.ndarray] = dict(plan.weights)
        env.update(feeds)
        with predictor._limiter:
            for i, (step, fn) in enumerate(zip(plan.steps, ex.fns)):
                args = [env[n] if n else None for n in step.inputs]
                t0 = time.perf_counter()
                outs = fn(args)
                times[i] = (time.perf_counter() - t0) * 1e3
                if i not in shapes and args and args[0] is not None and len(outs):
                    shapes[i] = f"{list(np.shape(args[0]))} -> {list(np.shape(outs[0]))}"
                for name, arr in zip(step.outputs, outs):
                    if name:
                        env[name] = arr
                for name in ex.free_after[i]:
                    env.pop(name, None)
        per_run.append(times)
    med = [statistics.median(col) for col in zip(*per_run)]
    rows: dict[tuple[str, str], dict] = {}
    for step, t in zip(plan.steps, med):
        row = rows.setdefault((step.op_type, step.kernel), {"op": step.op_type, "kernel": step.kernel,
                                                             "count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += t
    total = sum(med)
    out = sorted(rows.values(), key=lambda r: -r["ms"])
    for r in out:
        r["pct"] = 100.0 * r["ms"] / total if total else 0.0
    steps = []
    for i, (step, t) in enumerate(zip(plan.steps, med)):
        attrs = {k: step.attrs[k] for k in ("kernel_shape", "strides", "group") if k in step.attrs}
        detail = ", ".join(f"{k}={v}" for k, v in attrs.items())
        steps.append({"index": i, "name": step.name, "op": step.op_type, "kernel": step.kernel, "ms": t,
                      "pct": 100.0 * t / total if total else 0.0, "shapes": shapes.get(i, ""), "attrs": detail})
    steps.sort(key=lambda r: -r["ms"])
    return out, steps


def pin_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy whose graph inputs have the feeds' shapes (so dynamic-batch models count their MACs)."""
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    for vi in pinned.graph.input:
        if vi.name in feeds:
            dims = vi.type.tensor_type.shape.dim
            for d, n in zip(dims, feeds[vi.name].shape):
                d.Clear()
                d.dim_value = int(n)
    return pinned


def bench_model(label: str, zoo_name: str, threads: int, warmup: int, runs: int, numpy_too: bool = False,
                plain_too: bool = False) -> dict:
    model = build(zoo_name, full=True)
    return bench(label, zoo_name, model, sample_inputs(model, seed=0), threads, warmup, runs, numpy_too=numpy_too,
                 plain_too=plain_too)


def bench_corpus(entry: dict, folder: Path, threads: int, warmup: int, runs: int, numpy_too: bool = False,
                 plain_too: bool = False) -> dict:
    from corpus.evaluate import feeds_for, pinned_shapes

    path = folder / entry["file"]
    model = onnx.load(str(path))  # external data too: ResNet-18 from the dynamo exporter has it
    return bench(entry["name"], "corpus", model, feeds_for(entry, seed=0), threads, warmup, runs,
                 source=str(path), input_shapes=pinned_shapes(entry), numpy_too=numpy_too, plain_too=plain_too)


def numpy_only(fn):
    """``fn`` run with the native host kernels out of the way (as where they are not built)."""
    def run():
        saved, native.library._lib = native.library._lib, None
        try:
            return fn()
        finally:
            native.library._lib = saved
    return run


PLAIN_LAYOUT = ("choose_host_layout",)  # disabled: the whole plan in NCHW, as before the blocked layout


def bench(label: str, kind: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int,
          warmup: int, runs: int, source: str | None = None, input_shapes=None, numpy_too: bool = False,
          plain_too: bool = False) -> dict:
    def compile_plan(disabled: tuple[str, ...] = ()):
        if source is not None:
            return optcli.optimize(model_file=source, valid_targets="arm", input_shapes=input_shapes,
                                   disabled_passes=disabled)
        return optcli.optimize(model=model, valid_targets="arm", disabled_passes=disabled)

    t0 = time.perf_counter()
    result = compile_plan()
    compile_s = time.perf_counter() - t0
    predictor = optcli.load(result.data, threads=threads)
    session = ort_session(model, threads)

    ref = session.run(None, feeds)
    got = predictor.run(feeds)
    errs, ok, misses = [], True, []
    for vi, r in zip(session.get_outputs(), ref):
        a = got[vi.name]
        errs.append(max_error(a, r)[0])
        if not within(a, r, "fp32"):
            ok = False
            misses.append(f"{vi.name}: {describe_mismatch(a, r, 'fp32')}")

    fns = [lambda: session.run(None, feeds), lambda: predictor.run(feeds)]
    if plain_too:  # the plan without the blocked layout, in the same interleaved blocks
        plain = optcli.load(compile_plan(PLAIN_LAYOUT).data, threads=threads)
        fns.append(lambda: plain.run(feeds))
    if numpy_too and native.available():  # the same plan on the numpy kernels, in the same interleaved blocks
        fns.append(numpy_only(lambda: predictor.run(feeds)))
    ort_ms, opt_ms, *more = time_blocks(fns, warmup, runs)
    extra = {}
    if plain_too:
        plain_ms = more.pop(0)
        extra.update(plain_median=statistics.median(plain_ms), plain_min=min(plain_ms))
    if more:
        extra.update(np_median=statistics.median(more[0]), np_min=min(more[0]))
    return {
        **extra,
        "label": label, "zoo": kind, "params": count_params(model),
        "macs": count_macs(pin_inputs(model, feeds)) or count_plan_macs(result.plan),
        "nodes_before": result.report.get("nodes_before"), "steps": len(result.plan.steps),
        "fallback_ops": result.report.get("fallback_ops", {}), "compile_s": compile_s,
        "ort_median": statistics.median(ort_ms), "ort_min": min(ort_ms),
        "opt_median": statistics.median(opt_ms), "opt_min": min(opt_ms),
        "max_abs_err": max(errs), "within_fp32": ok, "misses": misses,
        "predictor": predictor, "feeds": feeds,
    }


# ------------------------------------------------------------------------------ reporting
def background_cpu(seconds: float = 1.0) -> float | None:
    """Percent of all cores busy over ``seconds`` while this process sleeps (Linux /proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # total, idle + iowait

    try:
        t1, i1 = sample()
        time.sleep(seconds)
        t2, i2 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 100.0 * (1 - (i2 - i1) / max(t2 - t1, 1))


def machine_info() -> dict[str, str]:
    import onnxruntime as ort
    from threadpoolctl import threadpool_info

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')}, "
            f"{i.get('threading_layer', '?')} threads)" for i in threadpool_info() if i.get("user_api") == "blas"]
    env = ", ".join(f"{k}={os.environ[k]}" if k in os.environ else f"{k} unset"
                    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"))
    busy = background_cpu()
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "numpy BLAS": "; ".join(blas) or "none found",
        "OpenBLAS env": env,
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "optcli": optcli.__version__,
        "optcli native host kernels": (f"{native.library_path().name} ({platform.machine()})"
                                       if native.available() else native.status().split(": ", 1)[1]),
        "host block width": _block_width_line(),
        "CPU busy with other processes just before the run": f"{busy:.0f}%" if busy is not None else "unknown",
    }


def _block_width_line() -> str:
    """The B the blocked regions run with here (ops/blocked.py): the library's vector width, or 1
    (the plain kernels on views) where that width's blocked kernels do not pay."""
    from optcli.ops.blocked import block_width

    b, width = block_width(), native.vector_width() if native.available() else 0
    if b > 1:
        return f"{b} (the native blocked kernels)"
    why = f"the library's width {width} is slower blocked" if width else "no native library"
    return f"1: blocked steps run the plain NCHW kernels on views ({why}; OPTCLI_HOST_BLOCKED=1 forces it)"


def results_table(rows: list[dict]) -> list[str]:
    numpy_too = any("np_min" in r for r in rows)
    plain_too = any("plain_min" in r for r in rows)
    lines = ["| model | params (M) | MMACs | ort median ms | ort min ms | optcli median ms | optcli min ms "
             "| optcli/ort (median) | optcli/ort (min) | max abs err |"
             + (" NCHW plan (no blocked layout): min ms | /ort (min) |" if plain_too else "")
             + (" numpy kernels only: median ms | min ms | /ort (median) | /ort (min) |" if numpy_too else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
             + (" ---: | ---: |" if plain_too else "")
             + (" ---: | ---: | ---: | ---: |" if numpy_too else "")]
    for r in rows:
        line = (f"| {r['label']} | {r['params'] / 1e6:.2f} | {r['macs'] / 1e6:.0f} | {r['ort_median']:.1f} "
                f"| {r['ort_min']:.1f} | {r['opt_median']:.1f} | {r['opt_min']:.1f} "
                f"| {r['opt_median'] / r['ort_median']:.2f}x | {r['opt_min'] / r['ort_min']:.2f}x "
                f"| {r['max_abs_err']:.2e} |")
        if plain_too:
            line += (f" {r['plain_min']:.1f} | {r['plain_min'] / r['ort_min']:.2f}x |" if "plain_min" in r else " | |")
        if numpy_too:
            line += (f" {r['np_median']:.1f} | {r['np_min']:.1f} | {r['np_median'] / r['ort_median']:.2f}x "
                     f"| {r['np_min'] / r['ort_min']:.2f}x |" if "np_min" in r else " | | | |")
        lines.append(line)
    return lines


def breakdown_table(rows: list[dict], top: int) -> list[str]:
    lines = ["| op | kernel | steps | ms (median) | % of kernel time |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows[:top]:
        lines.append(f"| {r['op']} | `{r['kernel']}` | {r['count']} | {r['ms']:.1f} | {r['pct']:.1f}% |")
    return lines


def steps_table(steps: list[dict], top: int) -> list[str]:
    lines = ["| step | op | kernel | attributes | input -> output shape | ms | % |",
             "| --- | --- | --- | --- | --- | ---: | ---: |"]
    for r in steps[:top]:
        lines.append(f"| {r['index']} | {r['op']} | `{r['kernel']}` | {r['attrs']} | {r['shapes']} "
                     f"| {r['ms']:.2f} | {r['pct']:.1f}% |")
    return lines


def print_table(rows: list[dict]) -> None:
    head = f"{'model':<20}{'params M':>9}{'MMACs':>7}{'ort med':>9}{'ort min':>9}{'opt med':>9}{'opt min':>9}" \
           f"{'ratio':>8}{'ratio@min':>10}{'max err':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['label']:<20}{r['params'] / 1e6:>9.2f}{r['macs'] / 1e6:>7.0f}{r['ort_median']:>9.1f}"
              f"{r['ort_min']:>9.1f}{r['opt_median']:>9.1f}{r['opt_min']:>9.1f}"
              f"{r['opt_median'] / r['ort_median']:>7.2f}x{r['opt_min'] / r['ort_min']:>9.2f}x"
              f"{r['max_abs_err']:>10.2e}"
              + (f"   NCHW plan: {r['plain_min']:.1f} ms min, {r['plain_min'] / r['ort_min']:.2f}x"
                 if "plain_min" in r else "")
              + (f"   numpy only: {r['np_min']:.1f} ms min, {r['np_min'] / r['ort_min']:.2f}x"
                 if "np_min" in r else ""))
    print("(times in ms, batch 1; ratio = optcli/onnxruntime of medians, ratio@min of minimums)")
    for line in geomean_lines(rows):
        print(line)


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def geomean_lines(rows: list[dict]) -> list[str]:
    """Geometric means of the ratios, over the zoo builds and over the corpus's real models."""
    lines = []
    for what, sel in (("zoo builds", [r for r in rows if r["zoo"] != "corpus" and "plain_min" in r]),
                      ("real models (corpus)", [r for r in rows if r["zoo"] == "corpus" and "plain_min" in r])):
        if sel:
            lines.append(f"The same models with the whole host plan in NCHW (`choose_host_layout` disabled), over the "
                         f"{len(sel)} {what}: {geomean([r['plain_min'] / r['ort_min'] for r in sel]):.2f}x "
                         "onnxruntime by minimum.")
    for what, sel in (("zoo builds", [r for r in rows if r["zoo"] != "corpus" and "np_min" in r]),
                      ("real models (corpus)", [r for r in rows if r["zoo"] == "corpus" and "np_min" in r])):
        if sel:
            lines.append(f"With the numpy kernels only (the same plans, `OPTCLI_NATIVE=0`), over the {len(sel)} "
                         f"{what}: "
                         f"{geomean([r['np_median'] / r['ort_median'] for r in sel]):.2f}x by median, "
                         f"{geomean([r['np_min'] / r['ort_min'] for r in sel]):.2f}x by minimum.")
    for what, sel in (("zoo builds", [r for r in rows if r["zoo"] != "corpus"]),
                      ("real models (corpus)", [r for r in rows if r["zoo"] == "corpus"])):
        if sel:
            med = geomean([r["opt_median"] / r["ort_median"] for r in sel])
            best = geomean([r["opt_min"] / r["ort_min"] for r in sel])
            worst = max(sel, key=lambda r: r["opt_min"] / r["ort_min"])
            lines.append(f"Geomean optcli/ort over the {len(sel)} {what}: {med:.2f}x by median, {best:.2f}x by "
                         f"minimum; furthest behind: {worst['label']} ({worst['opt_min'] / worst['ort_min']:.2f}x "
                         "by minimum).")
    return lines


DEPTHWISE_NOTE = (
    "What runs natively (`optcli/native`, C with vector extensions, built at install; without a C "
    "compiler, or with `OPTCLI_NATIVE=0`, the numpy kernels of the columns above run): the conv "
    "regions of the host plan in the channel-blocked layout NCHWc (the `choose_host_layout` pass; "
    "docs/design.md; where the machine's block width is 1, see Machine above, each blocked step runs "
    "its NCHW kernel on a view instead): direct convs whose register tiles are output-channel vectors times pixels, "
    "depthwise convs and pooling with every lane a channel, no stride-phase copy and no im2col, "
    "converted from and to NCHW only at the regions' borders (channel Concat and Split of whole "
    "16-channel blocks and nearest whole-factor upsampling stay inside a region: YOLO's C2f blocks); "
    "where a region's borders would cost more than it saves (BlazeFace's channel Pads, MixNet's "
    "uneven Split/Concat, RegNet's grouped convs, ConvNeXt's LayerNorms) the NCHW kernels: depthwise "
    "tiles, stem convs, a GEMM whose epilogue "
    "(bias, activation) is applied to each register tile before it is stored, the im2col columns "
    "gathered while packing; classifier heads on the transposed weight; residual Adds with their "
    "activation, GELU, the other activations, LayerNormalization and the spatial means, all on one "
    "pthread pool sized by `threads=` whose workers spin 100 us between jobs (no OpenMP; BLAS stays "
    "out of conv nets). Bound conv steps call the library with their arguments worked out after the "
    "first run. ConvTranspose's product runs in the native GEMM; where its taps never overlap (stride = "
    "kernel) they are laid out with its bias and activation in one native pass (other ConvTransposes "
    "add their taps in numpy, and the nearest Resize's integer upscales are numpy copies); with 2 threads, "
    "2-D MatMul past OpenBLAS's one-thread size runs in the native GEMM on the pool; FullyConnected "
    "natively at every size (a few rows: one C call; 16 rows or more: the GEMM's tiles on a weight "
    "packed once, bias and activation in their epilogue); Softmax along any axis, "
    "LayerNormalization, Add (also of a repeated row) with its activation; shape arithmetic "
    "(Shape -> Gather -> Concat chains) once per input shape. Still numpy: "
    "Resize in the other modes, plain-layout Concat/Split/Slice/Transpose copies, Mul/Sub/Div, the "
    "comparisons, Gather and Cast: each ~0.5-2 us of numpy overhead on the tensors of a small net. "
    "The column \"NCHW plan\" (`--plain-layout-too`) is the same model planned with the "
    "layout pass disabled, timed in the same interleaved blocks."
)


def verdict(rows: list[dict]) -> str:
    """One honest sentence: which models are within the aim (by median and by minimum time)."""
    med = {r["label"]: r["opt_median"] / r["ort_median"] for r in rows}
    best = {r["label"]: r["opt_min"] / r["ort_min"] for r in rows}
    shown = ", ".join(f"{k} {med[k]:.1f}x ({best[k]:.1f}x by minimum)" for k in med)
    outside = [k for k in med if med[k] > AIM and best[k] > AIM]
    unsure = [k for k in med if (med[k] > AIM) != (best[k] > AIM)]
    inside = [k for k in med if med[k] <= AIM and best[k] <= AIM]
    text = f"optcli's `arm` target takes {shown} the time of onnxruntime. "
    if not outside and not unsure:
        return text + f"That is within the {AIM:g}x aim on every model."
    parts = []
    if outside:
        parts.append(f"it misses the {AIM:g}x aim on {', '.join(outside)}")
    if unsure:
        parts.append(f"{', '.join(unsure)} is within it by one measure only")
    if inside:
        parts.append(f"{', '.join(inside)} is within it")
    joined = "; ".join(parts)
    return text + joined[0].upper() + joined[1:] + "."


def breakdown_section(title: str, r: dict, args) -> list[str]:
    ops, steps = r["breakdown"]
    total = sum(x["ms"] for x in ops)
    return [
        f"## Where optcli's time goes: {r['label']} ({title})",
        "",
        f"Median per-step kernel time over {args.breakdown_runs} runs, summed per op and kernel "
        f"({r['steps']} steps, {total:.1f} ms in kernels vs {r['opt_median']:.1f} ms per `run()`; "
        f"onnxruntime: {r['ort_median']:.1f} ms). Top 8 ops:",
        "",
        *breakdown_table(ops, 8),
        "",
        "Slowest single steps:",
        "",
        *steps_table(steps, 8),
        "",
    ]


def write_docs(path: Path, command: str, info: dict, rows: list[dict], focus: list[tuple[str, dict]],
               args, overhead: str) -> None:
    lines = [
        "# CPU benchmark: optcli `arm` vs onnxruntime",
        "",
        "Generated by `benchmarks/bench_cpu.py`; rerun it to refresh this page. The OpenCL target's figures "
        "(latency against `arm` and onnxruntime, copies per run, cold and warm load) are in "
        "[benchmarks-opencl.md](benchmarks-opencl.md). The int8 plans' (optcli's own PTQ and onnxruntime's "
        "QDQ models, beside both fp32 plans, with peak activation memory) are in "
        "[benchmarks-int8.md](benchmarks-int8.md) (`--int8`).",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Threads: {args.threads} (onnxruntime `intra_op_num_threads={args.threads}`, "
        f"`inter_op_num_threads=1`; optcli `load(..., threads={args.threads})`)",
        f"- Runs: {args.runs} timed runs per model and runtime, in two blocks per runtime (ort, optcli, "
        f"optcli, ort{', with the NCHW-only plan' if args.plain_layout_too else ''}"
        f"{', with the numpy-only optcli' if args.numpy_too else ''}), each block "
        f"after {args.warmup} warm-up runs",
        "- Models: full-size zoo builds (`optcli.zoo.models.build(name, full=True)`: 224x224, batch 1, "
        "1000 classes, seeded random weights)"
        + ("; with `--corpus`, real exporters' models from the corpus cache (`corpus/README.md`), named as "
           "in its manifest, fed `corpus/evaluate.py`'s seeded inputs" if any(r["zoo"] == "corpus" for r in rows)
           else ""),
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        "",
        "## Results",
        "",
        *results_table(rows),
        "",
        "optcli/ort is the ratio of median (or minimum) times: lower is better, below 1 means optcli is "
        "faster. "
        "max abs err is between the two runtimes' outputs on the same seeded input; "
        + ("every model's output is within the per-element fp32 tolerance of `optcli/tolerance.py`."
           if all(r["within_fp32"] for r in rows) else
           "every model's output is within the per-element fp32 tolerance of `optcli/tolerance.py` except: "
           + "; ".join(f"{r['label']} ({', '.join(r['misses'])})" for r in rows if not r["within_fp32"])),
        "",
        verdict(rows),
        "",
        *[line + "\n" for line in geomean_lines(rows)],
        overhead,
        "",
    ]
    lines += ["When the runtimes use every core, any other process that wakes up during a run stalls one "
              "of their threads, so single runs can be much slower than the rest: the minimums "
              "are the least disturbed numbers, and a large median/min gap marks a disturbed series.", ""]
    hot = [f"{r['label']}: `{r['breakdown'][0][0]['kernel']}` takes {r['breakdown'][0][0]['pct']:.0f}% of the "
           f"kernel time" for _, r in focus if r.get("breakdown") and r["breakdown"][0]]
    if hot:
        lines += ["Where to speed up first (details below): " + "; ".join(hot) + ".", ""]
    lines += [DEPTHWISE_NOTE, ""]
    for title, r in focus:
        lines += breakdown_section(title, r, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def corpus_entries(spec: str) -> list[tuple[dict, Path]]:
    """Manifest entries named by ``--corpus`` (each with its folder); names not built are reported and skipped."""
    from corpus.evaluate import corpus_dir, load_manifest

    folder = corpus_dir()
    by_name = {e["name"]: e for e in load_manifest(folder)}
    wanted = DEFAULT_CORPUS if spec == "default" else [s.strip() for s in spec.split(",") if s.strip()]
    missing = [n for n in wanted if n not in by_name]
    if missing:
        print(f"corpus models not in {folder} (skipped): {', '.join(missing)}")
    return [(by_name[n], folder) for n in wanted if n in by_name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per model and runtime (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up runs (default 3)")
    ap.add_argument("--breakdown-runs", type=int, default=5, help="runs for the per-op breakdown (default 5)")
    ap.add_argument("--models", default=",".join(MODELS.values()),
                    help=f"comma-separated zoo names (default {','.join(MODELS.values())})")
    ap.add_argument("--corpus", default="",
                    help="comma-separated corpus model names to add, or 'default' for a set of real vision models "
                         "(needs the corpus cache: corpus/build.py)")
    ap.add_argument("--numpy-too", action="store_true",
                    help="also time each plan on the numpy kernels alone (native library set aside), interleaved")
    ap.add_argument("--plain-layout-too", action="store_true",
                    help="also time each model's plan without the channel-blocked host layout (all NCHW), interleaved")
    ap.add_argument("--busy", type=int, default=0,
                    help="time with N other processes spinning on the cores (contention; not with --write-docs)")
    ap.add_argument("--int8", action="store_true",
                    help="also time the int8 plans (benchmarks/bench_int8.py: optcli's own PTQ plan and onnxruntime's "
                         "QDQ model run by optcli and by onnxruntime, beside both fp32 plans, with peak activation "
                         "memory) for the zoo's and, with --corpus, the corpus's conv nets; with --write-docs into "
                         "docs/benchmarks-int8.md")
    ap.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    ap.add_argument("--docs-path", default=str(ROOT / "docs" / "benchmarks.md"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads < 1 or args.runs < 1 or args.warmup < 0:
        ap.error("--threads and --runs must be >= 1, --warmup >= 0")
    if args.busy and args.write_docs:
        ap.error("--busy measures contention: its figures do not belong on docs/benchmarks.md")
    labels = {v: k for k, v in MODELS.items()}
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for n in names:
        if n not in FULL_SIZE:
            ap.error(f"unknown zoo model {n!r}; valid: {', '.join(sorted(FULL_SIZE))}")

    corpus = corpus_entries(args.corpus) if args.corpus else []
    info = machine_info()
    print(f"CPU: {info['CPU']} ({info['cores']} cores); BLAS: {info['numpy BLAS']}; {info['OpenBLAS env']}")
    print(native.status())
    rows = []
    opts = (args.threads, args.warmup, args.runs, args.numpy_too, args.plain_layout_too)
    jobs = [(labels.get(n, n), lambda n=n: bench_model(labels.get(n, n), n, *opts)) for n in names]
    jobs += [(e["name"], lambda e=e, d=d: bench_corpus(e, d, *opts)) for e, d in corpus]
    if args.busy:
        print(f"{args.busy} other process(es) spin on the cores while both runtimes are timed")
    for label, job in jobs:
        print(f"{label}: building, optimizing, checking outputs, timing ...", flush=True)
        with contention.busy_cores(args.busy):
            r = job()
        status = "ok" if r["within_fp32"] else "NOT within fp32 tolerance: " + "; ".join(r["misses"])
        print(f"  compile {r['compile_s']:.1f} s, {r['nodes_before']} nodes -> {r['steps']} steps, "
              f"fallback ops {r['fallback_ops'] or 'none'}; outputs max abs err {r['max_abs_err']:.2e} ({status})")
        rows.append(r)
    print()
    print_table(rows)
    print()
    print(verdict(rows))

    # The slowest model in optcli, and the one furthest behind onnxruntime when that is another one.
    slow = max(rows, key=lambda r: r["opt_median"])
    worst = max(rows, key=lambda r: r["opt_median"] / r["ort_median"])
    focus = [("slowest optcli model", slow)]
    if worst is not slow:
        focus.append(("furthest behind onnxruntime", worst))
    zoo = [r for r in rows if r["zoo"] != "corpus"]
    zoo_worst = max(zoo, key=lambda r: r["opt_median"] / r["ort_median"]) if zoo else None
    if zoo_worst is not None and all(zoo_worst is not r for _, r in focus):
        focus.append(("zoo build furthest behind onnxruntime", zoo_worst))
    for title, r in focus:
        r["breakdown"] = step_breakdown(r["predictor"], r["feeds"], args.breakdown_runs)
        print(f"\nTop 8 ops by time in optcli, {r['label']} ({title}, median of {args.breakdown_runs} runs):")
        for x in r["breakdown"][0][:8]:
            print(f"  {x['op']:<20}{x['kernel']:<36}{x['count']:>4} steps {x['ms']:>8.1f} ms {x['pct']:>5.1f}%")
        print("  slowest steps:")
        for x in r["breakdown"][1][:5]:
            print(f"    #{x['index']:<4}{x['op']:<8}{x['kernel']:<26}{x['attrs']:<50}{x['shapes']:<40}"
                  f"{x['ms']:>7.2f} ms")

    overhead = step_overhead.describe(step_overhead.measure(args.threads))
    print("\n" + overhead)
    if args.int8:
        from benchmarks import bench_int8
        models = [*bench_int8.MODELS, *(bench_int8.CORPUS_MODELS if corpus else [])]
        bench_int8.main(["--threads", str(args.threads), "--runs", str(args.runs), "--models", ",".join(models),
                         *(["--write-docs"] if args.write_docs else [])])
    if args.write_docs:
        command = "python " + " ".join(shlex.quote(a) for a in
                                       ["benchmarks/bench_cpu.py", *(sys.argv[1:] if argv is None else argv)])
        write_docs(Path(args.docs_path), command, info, rows, focus, args, overhead)
        print(f"\nwrote {args.docs_path}")
    return 0 if all(r["within_fp32"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
