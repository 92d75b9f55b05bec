"""`optcli bench MODEL.nb`: latency (min, median, p90 over timed runs after warm-up), cold and warm
initialisation, a per-op profile (OpenCL profiling events for GPU steps, timers for host steps),
peak host memory, and optionally onnxruntime on the same inputs in the same process."""

from __future__ import annotations

import csv
import io
import json
import resource
import sys
import time

import click
import numpy as np

from optcli.commands.common import (
    CONTEXT,
    clip,
    load_npy,
    load_options,
    load_predictor,
    parse_inputs,
    random_inputs,
    table,
)
from optcli.errors import OptError, UsageError
from optcli.progress import progress
from optcli.verify import onnxruntime_session

CSV_FIELDS = ["model", "device", "runs", "min_ms", "median_ms", "p90_ms", "init_cold_s", "init_warm_s",
              "peak_host_mb", "ort_median_ms", "ratio_vs_ort", "max_abs_diff"]


class CheckFailed(OptError):
    """--max_diff exceeded (exit code 3, so CI can tell a numeric regression from a usage error)."""

    exit_code = 3


def _peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS, kB on Linux


def _timed_runs(run, warmup: int, runs: int, max_secs: float, desc: str) -> list[float]:
    for _ in progress(range(warmup), f"{desc} warm-up", total=warmup):
        run()
    times: list[float] = []
    budget_start = time.perf_counter()
    for _ in progress(range(runs), desc, total=runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        if time.perf_counter() - budget_start > max_secs:
            break
    return times


def _latency(times: list[float]) -> dict:
    ms = np.asarray(times) * 1e3
    return {"runs": len(times), "min_ms": round(float(ms.min()), 3), "median_ms": round(float(np.median(ms)), 3),
            "p90_ms": round(float(np.percentile(ms, 90)), 3), "mean_ms": round(float(ms.mean()), 3)}


def profile(predictor, feeds: dict, runs: int) -> list[dict]:
    """Median time per step over ``runs`` runs: device time from OpenCL profiling events for GPU
    steps, wall time for host steps; aggregated per (op, target, kernel), costliest first."""
    plan = predictor.plan
    executor = predictor._executor  # host steps: time each bound kernel function
    host_ns: dict[int, float] = {}

    def timed(i, fn):
        def call(args):
            start = time.perf_counter_ns()
            try:
                return fn(args)
            finally:
                host_ns[i] = host_ns.get(i, 0) + time.perf_counter_ns() - start
        return call

    original = list(executor.fns)
    executor.fns = [timed(i, fn) if fn is not None else None for i, fn in enumerate(original)]
    gpu = predictor.gpu
    if gpu is not None:
        gpu.enable_profiling()
    per_run: list[dict[int, float]] = []
    try:
        for _ in range(runs):
            host_ns.clear()
            predictor.run(feeds)
            times = dict(host_ns)
            if gpu is not None:
                for i, event in gpu.events:
                    times[i] = times.get(i, 0) + event.profile.end - event.profile.start
                gpu.events.clear()
            per_run.append(times)
    finally:
        executor.fns = original
    steps = sorted({i for t in per_run for i in t})
    median = {i: float(np.median([t.get(i, 0) for t in per_run])) / 1e6 for i in steps}
    groups: dict[tuple, dict] = {}
    for i, ms in median.items():
        s = plan.steps[i]
        g = groups.setdefault((s.op_type, s.target, s.kernel), {"op": s.op_type, "target": s.target,
                                                               "kernel": s.kernel, "steps": 0, "ms": 0.0})
        g["steps"] += 1
        g["ms"] += ms
    total = sum(g["ms"] for g in groups.values()) or 1e-9
    rows = sorted(groups.values(), key=lambda g: -g["ms"])
    for g in rows:
        g["ms"] = round(g["ms"], 4)
        g["share"] = round(g["ms"] / total, 4)
    return rows


def run_onnxruntime(onnx_path: str, feeds: dict, ours: dict, warmup: int, runs: int, max_secs: float,
                 threads: int | None) -> dict:
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("--compare_onnx needs onnxruntime: pip install onnxruntime") from None
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        sess = onnxruntime_session(onnx_path, options)
    except Exception as exc:
        raise UsageError(f"--compare_onnx: onnxruntime cannot load {onnx_path}: {str(exc).splitlines()[0]}") from None
    names = [i.name for i in sess.get_inputs()]
    if set(names) != set(feeds):
        raise UsageError(f"--compare_onnx: {onnx_path} has inputs {names}, the .nb has {sorted(feeds)}")
    ort_feeds = {k: feeds[k] for k in names}
    reference = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, ort_feeds)))
    times = _timed_runs(lambda: sess.run(None, ort_feeds), warmup, runs, max_secs, "onnxruntime")
    diffs = {}
    for k, (name, y) in enumerate(ours.items()):
        ref = reference.get(name, list(reference.values())[k] if k < len(reference) else None)
        if ref is None or np.shape(ref) != np.shape(y):
            raise UsageError(f"--compare_onnx: output '{name}' has no match of the same shape in {onnx_path}")
        a, b = np.asarray(y, np.float64), np.asarray(ref, np.float64)
        diffs[name] = float(np.max(np.abs(a - b))) if a.size else 0.0
    return {"model": onnx_path, **_latency(times), "max_abs_diff": max(diffs.values(), default=0.0),
            "max_abs_diff_per_output": diffs}


def _feeds(predictor, inputs: tuple[str, ...], input_shapes: str | None) -> dict:
    from optcli.frontend.input_shapes import parse_input_shapes

    files = parse_inputs(inputs, [s.name for s in predictor.inputs])
    given = {name: load_npy(path) for name, path in files.items()}
    if len(given) == len(predictor.inputs):
        return given
    shapes = parse_input_shapes(input_shapes)
    return {**random_inputs(predictor, shapes), **given}


@click.command(name="bench", context_settings=CONTEXT)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--runs", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs (at most).")
@click.option("--max_secs", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Stop the timed runs after this many seconds (at least one run is timed).")
@click.option("--profile_runs", type=click.IntRange(min=0), default=3, show_default=True,
              help="Extra runs for the per-op profile (device times from OpenCL profiling events, wall time on "
                   "the host); 0 skips it.")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="Input data (repeatable); inputs not given are seeded random data.")
@click.option("--input_shapes", metavar="SPEC", help='Sizes for dynamic dims of random inputs: "x:1,3,224,224".')
@click.option("--compare_onnx", metavar="MODEL.onnx", help="Also run this ONNX model with onnxruntime (CPU) on "
              "the same inputs in this process: latency ratio and largest output difference.")
@click.option("--max_diff", type=float, default=None, metavar="TOL", help="With --compare_onnx: exit with code 3 "
              "when the largest absolute output difference exceeds TOL (a CI gate).")
@click.option("--top", type=click.IntRange(min=1), default=12, show_default=True, help="Profile rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object.")
@click.option("--csv", "as_csv", is_flag=True, help="Print one CSV header and row (append to a history file).")
@load_options
def bench_command(model, warmup, runs, max_secs, profile_runs, inputs, input_shapes, compare_onnx, max_diff, top,
                  as_json, as_csv, targets, precision, device, threads):
    """Benchmark a .nb model: min/median/p90 latency after warm-up, cold and warm initialisation
    (load + first run), a per-op profile sorted by cost, peak host memory, and optionally the
    same inputs through onnxruntime.

    \b
    Examples:
      optcli bench model.nb --runs 50
      optcli bench model.nb --compare_onnx model.onnx --max_diff 1e-4 --json
    """
    if as_json and as_csv:
        raise UsageError("--json and --csv: choose one")
    if max_diff is not None and not compare_onnx:
        raise UsageError("--max_diff compares with onnxruntime: give --compare_onnx=MODEL.onnx too")
    start = time.perf_counter()
    cold = load_predictor(model, targets, precision, device, threads)
    cold_load = time.perf_counter() - start
    feeds = _feeds(cold, inputs, input_shapes)
    start = time.perf_counter()
    cold.run(feeds)
    cold_first = time.perf_counter() - start
    del cold
    start = time.perf_counter()  # warm: programs built, kernels compiled, files in the page cache
    predictor = load_predictor(model, targets, precision, device, threads)
    warm_load = time.perf_counter() - start
    start = time.perf_counter()
    outputs = predictor.run(feeds)
    warm_first = time.perf_counter() - start
    times = _timed_runs(lambda: predictor.run(feeds), warmup, runs, max_secs, "optcli")
    gpu = predictor.gpu
    result = {"model": model, "device": gpu.dev.name if gpu is not None else "cpu",
              "device_kind": getattr(gpu.dev, "kind", "GPU") if gpu is not None else "CPU",  # PoCL: OpenCL on the CPU
              "threads": threads, **_latency(times),
              "init": {"cold_s": round(cold_load + cold_first, 4), "cold_load_s": round(cold_load, 4),
                       "cold_first_run_s": round(cold_first, 4), "warm_s": round(warm_load + warm_first, 4),
                       "warm_load_s": round(warm_load, 4), "warm_first_run_s": round(warm_first, 4)}}
    result["profile"] = profile(predictor, feeds, profile_runs) if profile_runs else []
    if compare_onnx:
        ort = run_onnxruntime(compare_onnx, feeds, outputs, warmup, runs, max_secs, threads)
        # By minimum: the least disturbed run of each (medians on a busy machine gave 0.62x for 1.84x).
        ort["ratio"] = round(result["min_ms"] / ort["min_ms"], 3) if ort["min_ms"] else None
        ort["ratio_median"] = round(result["median_ms"] / ort["median_ms"], 3) if ort["median_ms"] else None
        result["onnxruntime"] = ort
    result["peak_host_mb"] = round(_peak_rss_mb(), 1)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif as_csv:
        click.echo(_csv(result), nl=False)
    else:
        click.echo(format_text(result, top))
    if max_diff is not None and result["onnxruntime"]["max_abs_diff"] > max_diff:
        raise CheckFailed(f"largest output difference from onnxruntime {result['onnxruntime']['max_abs_diff']:.3g} "
                          f"exceeds --max_diff={max_diff:g}")



def _csv(r: dict) -> str:
    ort = r.get("onnxruntime", {})
    row = [r["model"], r["device"], r["runs"], r["min_ms"], r["median_ms"], r["p90_ms"], r["init"]["cold_s"],
           r["init"]["warm_s"], r["peak_host_mb"], ort.get("median_ms", ""), ort.get("ratio", ""),
           ort.get("max_abs_diff", "")]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([CSV_FIELDS, row])
    return buf.getvalue()


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def format_text(r: dict, top: int) -> str:
    init = r["init"]
    where = "the CPU" if r["device"] == "cpu" else f"{r['device']} ({r['device_kind']})"
    out = [f"{r['model']} on {where}: {r['runs']} timed runs",
           f"latency: min {r['min_ms']:.2f} ms, median {r['median_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms",
           f"cold start: {_s(init['cold_s'])} (load {_s(init['cold_load_s'])} + first run "
           f"{_s(init['cold_first_run_s'])})",
           f"warm start: {_s(init['warm_s'])} (load {_s(init['warm_load_s'])} + first run "
           f"{_s(init['warm_first_run_s'])})",
           f"peak host memory: {r['peak_host_mb']:.0f} MB (process maximum resident set)"]
    if "onnxruntime" in r:
        o = r["onnxruntime"]
        out.append(f"onnxruntime: median {o['median_ms']:.2f} ms (min {o['min_ms']:.2f} ms); optcli takes "
                   f"{o['ratio']:.2f}x its time by minimum ({o['ratio_median']:.2f}x by median)")
        out.append(f"max |optcli - onnxruntime| = {o['max_abs_diff']:.3g}")
    if r["profile"]:
        rows = [[clip(g["op"], 18), g["target"], clip(g["kernel"].rsplit(".", 1)[-1], 16), str(g["steps"]),
                 f"{g['ms']:.3f}", f"{g['share']:.1%}"] for g in r["profile"][:top]]
        more = len(r["profile"]) - len(rows)
        out += ["", "per-op profile (median ms per run; GPU: profiling events, host: timers):",
                table(["op", "target", "variant", "steps", "ms", "share"], rows, right={3, 4, 5})]
        if more > 0:
            out.append(f"... {more} more (--top, or --json for all)")
    return "\n".join(out)
