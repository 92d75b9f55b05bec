"""Time the `arm` target (numpy kernels on the host CPU) against onnxruntime's CPU EP.

Both run with the same thread count: onnxruntime with ``intra_op_num_threads=N`` and
``inter_op_num_threads=1``, optcli with ``optcli.load(..., threads=N)``.  Models are the full-size
zoo builds (224x224, batch 1, 1000 classes).  Outputs are compared (max abs error) before timing.

    .venv/bin/python benchmarks/bench_cpu.py --threads 2 --runs 20 --write-docs

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
from optcli.tolerance import max_error, within  # noqa: E402
from optcli.zoo.models import FULL_SIZE, build, sample_inputs  # noqa: E402

MODELS = {  # label -> zoo name
    "MobileNetV2": "mobilenet_v2",
    "ResNet-18": "resnet18",
    "EfficientNet-Lite0": "efficientnet_lite0",
}
AIM = 2.0  # optcli should be within this factor of onnxruntime


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


# ------------------------------------------------------------------------------- timing
def time_fn(fn, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def ort_session(model: onnx.ModelProto, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def step_breakdown(predictor, feeds: dict[str, np.ndarray], runs: int) -> list[dict]:
    """Per-step times of optcli's CPU executor: a copy of CpuExecutor.run with a clock around each kernel.

    Returns one row per (op, kernel), summed over its steps, as the median over ``runs`` runs.
    """
    ex = predictor._executor
    plan = ex.plan
    per_run: list[list[float]] = []
    for _ in range(runs):
        times = [0.0] * len(plan.steps)
        env: dict[str, np.ndarray] = dict(plan.weights)
        env.update(feeds)
        with predictor._limiter():
            for i, (step, fn) in enumerate(zip(plan.steps, ex.fns)):
                args = [env[n] if n else None for n in step.inputs]
                t0 = time.perf_counter()
                outs = fn(args)
                times[i] = (time.perf_counter() - t0) * 1e3
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
    return out


def bench_model(label: str, zoo_name: str, threads: int, warmup: int, runs: int) -> dict:
    model = build(zoo_name, full=True)
    feeds = sample_inputs(model, seed=0)
    t0 = time.perf_counter()
    result = optcli.optimize(model=model, valid_targets="arm")
    compile_s = time.perf_counter() - t0
    predictor = optcli.load(result.data, threads=threads)
    session = ort_session(model, threads)

    ref = session.run(None, feeds)
    got = predictor.run(feeds)
    errs, ok = [], True
    for vi, r in zip(session.get_outputs(), ref):
        a = got[vi.name]
        errs.append(max_error(a, r)[0])
        ok = ok and within(a, r, "fp32")

    ort_ms = time_fn(lambda: session.run(None, feeds), warmup, runs)
    opt_ms = time_fn(lambda: predictor.run(feeds), warmup, runs)
    return {
        "label": label, "zoo": zoo_name, "params": count_params(model), "macs": count_macs(model),
        "nodes_before": result.report.get("nodes_before"), "steps": len(result.plan.steps),
        "fallback_ops": result.report.get("fallback_ops", {}), "compile_s": compile_s,
        "ort_median": statistics.median(ort_ms), "ort_min": min(ort_ms),
        "opt_median": statistics.median(opt_ms), "opt_min": min(opt_ms),
        "max_abs_err": max(errs), "within_fp32": ok,
        "predictor": predictor, "feeds": feeds,
    }


# ------------------------------------------------------------------------------ reporting
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
    }


def results_table(rows: list[dict]) -> list[str]:
    lines = ["| model | params (M) | MMACs | ort median ms | ort min ms | optcli median ms | optcli min ms "
             "| optcli/ort | max abs err |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['params'] / 1e6:.2f} | {r['macs'] / 1e6:.0f} | {r['ort_median']:.1f} "
                     f"| {r['ort_min']:.1f} | {r['opt_median']:.1f} | {r['opt_min']:.1f} "
                     f"| {r['opt_median'] / r['ort_median']:.2f}x | {r['max_abs_err']:.2e} |")
    return lines


def breakdown_table(rows: list[dict], top: int) -> list[str]:
    lines = ["| op | kernel | steps | ms (median) | % of run |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows[:top]:
        lines.append(f"| {r['op']} | `{r['kernel']}` | {r['count']} | {r['ms']:.1f} | {r['pct']:.1f}% |")
    return lines


def print_table(rows: list[dict]) -> None:
    head = f"{'model':<20}{'params M':>9}{'MMACs':>7}{'ort med':>9}{'ort min':>9}{'opt med':>9}{'opt min':>9}" \
           f"{'ratio':>8}{'max err':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['label']:<20}{r['params'] / 1e6:>9.2f}{r['macs'] / 1e6:>7.0f}{r['ort_median']:>9.1f}"
              f"{r['ort_min']:>9.1f}{r['opt_median']:>9.1f}{r['opt_min']:>9.1f}"
              f"{r['opt_median'] / r['ort_median']:>7.2f}x{r['max_abs_err']:>10.2e}")
    print("(times in ms, batch 1, 224x224)")


def verdict(rows: list[dict]) -> str:
    ratios = {r["label"]: r["opt_median"] / r["ort_median"] for r in rows}
    inside = [k for k, v in ratios.items() if v <= AIM]
    outside = [k for k, v in ratios.items() if v > AIM]
    worst = max(ratios, key=ratios.get)
    if not outside:
        return (f"optcli's `arm` target is within the {AIM:g}x aim of onnxruntime on all three models "
                f"(worst: {worst} at {ratios[worst]:.2f}x).")
    parts = [f"optcli's `arm` target is {', '.join(f'{k} {ratios[k]:.2f}x' for k in outside)} of onnxruntime, "
             f"so it misses the {AIM:g}x aim on {len(outside)} of {len(rows)} models"]
    if inside:
        parts.append(f"({', '.join(inside)} within it)")
    return " ".join(parts) + "; the per-op breakdown below shows where the time goes."


def write_docs(path: Path, command: str, info: dict, rows: list[dict], slow: dict, breakdown: list[dict],
               args) -> None:
    total = sum(r["ms"] for r in breakdown)
    lines = [
        "# CPU benchmark: optcli `arm` vs onnxruntime",
        "",
        "Generated by `benchmarks/bench_cpu.py`; rerun it to refresh this page.",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Threads: {args.threads} (onnxruntime `intra_op_num_threads={args.threads}`, "
        f"`inter_op_num_threads=1`; optcli `load(..., threads={args.threads})`)",
        f"- Runs: {args.warmup} warm-up, then {args.runs} timed runs per model and runtime",
        "- Models: full-size zoo builds (`optcli.zoo.models.build(name, full=True)`: 224x224, batch 1, "
        "1000 classes, seeded random weights)",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        "",
        "## Results",
        "",
        *results_table(rows),
        "",
        "optcli/ort is the ratio of median times (lower is better; below 1 means optcli is faster). "
        "max abs err is between the two runtimes' outputs on the same seeded input; every model's output is "
        + ("within" if all(r["within_fp32"] for r in rows) else "**not** within")
        + " the fp32 tolerance of `optcli/tolerance.py`.",
        "",
        verdict(rows),
        "",
        f"## Where optcli's time goes: {slow['label']} (slowest optcli model)",
        "",
        f"Median per-step kernel time over {args.breakdown_runs} runs, summed per op and kernel "
        f"({slow['steps']} steps, {total:.1f} ms in kernels vs {slow['opt_median']:.1f} ms per `run()`). "
        "Top 8:",
        "",
        *breakdown_table(breakdown, 8),
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per model and runtime (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up runs (default 3)")
    ap.add_argument("--breakdown-runs", type=int, default=5, help="runs for the per-op breakdown (default 5)")
    ap.add_argument("--models", default=",".join(MODELS.values()),
                    help=f"comma-separated zoo names (default {','.join(MODELS.values())})")
    ap.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    ap.add_argument("--docs-path", default=str(ROOT / "docs" / "benchmarks.md"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads < 1 or args.runs < 1 or args.warmup < 0:
        ap.error("--threads and --runs must be >= 1, --warmup >= 0")
    labels = {v: k for k, v in MODELS.items()}
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for n in names:
        if n not in FULL_SIZE:
            ap.error(f"unknown zoo model {n!r}; valid: {', '.join(sorted(FULL_SIZE))}")

    info = machine_info()
    print(f"CPU: {info['CPU']} ({info['cores']} cores); BLAS: {info['numpy BLAS']}; {info['OpenBLAS env']}")
    rows = []
    for n in names:
        label = labels.get(n, n)
        print(f"{label}: building, optimizing, checking outputs, timing ...", flush=True)
        r = bench_model(label, n, args.threads, args.warmup, args.runs)
        status = "ok" if r["within_fp32"] else "NOT within fp32 tolerance"
        print(f"  compile {r['compile_s']:.1f} s, {r['nodes_before']} nodes -> {r['steps']} steps, "
              f"fallback ops {r['fallback_ops'] or 'none'}; outputs max abs err {r['max_abs_err']:.2e} ({status})")
        rows.append(r)
    print()
    print_table(rows)
    print()
    print(verdict(rows))

    slow = max(rows, key=lambda r: r["opt_median"])
    breakdown = step_breakdown(slow["predictor"], slow["feeds"], args.breakdown_runs)
    print(f"\nTop 8 ops by time in optcli, {slow['label']} (median of {args.breakdown_runs} runs):")
    for r in breakdown[:8]:
        print(f"  {r['op']:<22}{r['kernel']:<40}{r['count']:>4} steps {r['ms']:>8.1f} ms {r['pct']:>5.1f}%")

    if args.write_docs:
        command = "python " + " ".join(shlex.quote(a) for a in
                                       ["benchmarks/bench_cpu.py", *(sys.argv[1:] if argv is None else argv)])
        write_docs(Path(args.docs_path), command, info, rows, slow, breakdown, args)
        print(f"\nwrote {args.docs_path}")
    return 0 if all(r["within_fp32"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
