"""Benchmark the `opencl` target against the `arm` target and onnxruntime, in one run.

    python benchmarks/bench_opencl.py [--models mobilenet_v2,resnet18] [--runs 10] [--write-docs]

Per model (full-size zoo builds, 224x224, batch 1): latency of the plan optimized for
``opencl,arm`` on the OpenCL device, of the ``arm`` plan, and of onnxruntime's CPU EP; the
host<->device copies per run; and cold versus warm ``optcli.load`` time (cold: empty program
binary cache and, on PoCL, an empty PoCL kernel cache; each load in a fresh process).  On a
machine without a GPU the device is PoCL on the CPU: the figures then say how the OpenCL path
behaves, not how fast a GPU is.  ``--write-docs`` writes docs/benchmarks-opencl.md.

    python benchmarks/bench_opencl.py --bounds-overhead [--models mobilenet_v2] [--runs 20]

measures what the kernels' bounds checks cost (every LOAD / STORE compares its index with the
buffer's length): the same plan loaded twice in one process, once as shipped and once with the
checks compiled out (a benchmark-only rendering: the runtime has no way to turn them off), run
alternately so that both see the same machine load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LABELS = {"mobilenet_v2": "MobileNetV2", "resnet18": "ResNet-18", "efficientnet_lite0": "EfficientNet-Lite0"}

_LOAD_SNIPPET = """
import sys, time, json
import optcli
t = time.perf_counter()
p = optcli.load(sys.argv[1], require_gpu=True)
print(json.dumps({"load_s": time.perf_counter() - t, "builds": p.gpu.dev.builds}))
"""


def load_time(nb: Path, cache: Path, pocl_cache: Path) -> dict:
    env = {**os.environ, "OPTCLI_CACHE_DIR": str(cache), "POCL_CACHE_DIR": str(pocl_cache)}
    out = subprocess.run([sys.executable, "-c", _LOAD_SNIPPET, str(nb)], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def median_ms(fn, runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def bench_model(name: str, args) -> dict:
    import onnxruntime as ort

    import optcli
    from optcli.tolerance import max_error
    from optcli.zoo import build, sample_inputs

    model = build(name, full=True)
    feeds = sample_inputs(model)
    gpu_result = optcli.optimize(model=model, valid_targets="opencl,arm", precision=args.precision)
    cpu_result = optcli.optimize(model=model, valid_targets="arm")
    with tempfile.TemporaryDirectory() as tmp:
        nb = Path(tmp) / f"{name}.nb"
        nb.write_bytes(gpu_result.data)
        cache, pocl = Path(tmp) / "cache", Path(tmp) / "pocl"
        cold = load_time(nb, cache, pocl)
        warm = load_time(nb, cache, pocl)
    gpu = optcli.load(gpu_result.data, require_gpu=True, threads=args.threads)
    cpu = optcli.load(cpu_result.data, threads=args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    reference = sess.run(None, feeds)[0]
    err, scale = max_error(gpu.run(feeds)["output"], reference)
    steps = gpu_result.report["steps"]
    return {
        "name": name, "label": LABELS.get(name, name),
        "gpu_steps": sum(s["target"] == "opencl" for s in steps), "steps": len(steps),
        "transfers": gpu_result.report["transfers"],
        "opencl_ms": median_ms(lambda: gpu.run(feeds), args.runs),
        "arm_ms": median_ms(lambda: cpu.run(feeds), args.runs),
        "ort_ms": median_ms(lambda: sess.run(None, feeds), args.runs),
        "cold_load_s": cold["load_s"], "warm_load_s": warm["load_s"], "cold_builds": cold["builds"],
        "warm_builds": warm["builds"], "max_err": err, "rel_err": err / scale,
    }


def _unchecked_predictor(data: bytes, threads: int):
    """The plan on a ClDevice of its own whose programs are rendered with the unchecked
    accesses (LOADn / STOREn = the raw ones; the length arguments are still passed, unused)."""
    import optcli
    import optcli.runtime.opencl.device as opencl
    from optcli.gpu import dialect

    raw = "\n".join(f"#define {m}(p, i) RAW_{m}(p, i)" for m in ("LOAD4", "LOAD1")) + "\n" + "\n".join(
        f"#define {m}(v, p, i) RAW_{m}(v, p, i)" for m in ("STORE4", "STORE1")) + "\n"
    render, shared = opencl.render_opencl, opencl.ClDevice._shared
    opencl.render_opencl = lambda source, defines: render(source, defines).replace(dialect.BOUNDS, raw, 1)
    opencl.ClDevice._shared = {}  # a device (program table) of its own
    try:
        return optcli.load(data, require_gpu=True, threads=threads)
    finally:
        opencl.render_opencl, opencl.ClDevice._shared = render, shared


def bounds_overhead(name: str, args) -> dict:
    """Median latency with and without the bounds checks, runs interleaved (A B A B ...)."""
    import optcli
    from optcli.zoo import build, sample_inputs

    model = build(name, full=True)
    feeds = sample_inputs(model)
    data = optcli.optimize(model=model, valid_targets="opencl,arm", precision=args.precision).data
    checked = optcli.load(data, require_gpu=True, threads=args.threads)
    unchecked = _unchecked_predictor(data, args.threads)
    a, b = checked.run(feeds)["output"], unchecked.run(feeds)["output"]
    assert np.array_equal(a, b), "the checks changed a result"
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for k in range(2 * (args.runs + 2)):
        which, p = ("checked", checked) if k % 2 == 0 else ("unchecked", unchecked)
        t = time.perf_counter()
        p.run(feeds)
        if k >= 4:  # two warm-up runs each
            times[which].append(time.perf_counter() - t)
    med = {k: float(np.median(v) * 1e3) for k, v in times.items()}
    best = {k: float(np.min(v) * 1e3) for k, v in times.items()}  # the least disturbed run of each
    return {"name": name, "checked_ms": med["checked"], "unchecked_ms": med["unchecked"],
            "overhead": med["checked"] / med["unchecked"] - 1.0, "checked_min_ms": best["checked"],
            "unchecked_min_ms": best["unchecked"], "overhead_min": best["checked"] / best["unchecked"] - 1.0}


def machine(device_name: str) -> list[str]:
    import platform

    import onnxruntime
    import pyopencl

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    return [f"- OpenCL device: {device_name}", f"- host CPU: {cpu}, {os.cpu_count()} cores",
            f"- python {platform.python_version()}, numpy {np.__version__}, onnxruntime {onnxruntime.__version__}, "
            f"pyopencl {pyopencl.VERSION_TEXT}"]


def write_docs(rows: list[dict], args, device_name: str) -> Path:
    lines = ["# OpenCL benchmark: `opencl,arm` plan vs `arm` plan vs onnxruntime", "",
             "Generated by `benchmarks/bench_opencl.py`; rerun it to refresh this page.", "",
             f"- Command: `python benchmarks/bench_opencl.py --threads {args.threads} --runs {args.runs} "
             f"--precision {args.precision} --write-docs`",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             *machine(device_name), "",
             "| model | GPU steps | copies/run (up+down) | bytes/run | opencl ms | arm ms | onnxruntime ms | "
             "opencl/ort | cold load s | warm load s | warm/cold | max rel err |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        t = r["transfers"]
        lines.append(f"| {r['label']} | {r['gpu_steps']}/{r['steps']} | {t['uploads']}+{t['downloads']} | "
                     f"{t['bytes_per_run']} | {r['opencl_ms']:.1f} | {r['arm_ms']:.1f} | {r['ort_ms']:.1f} | "
                     f"{r['opencl_ms'] / r['ort_ms']:.2f}x | {r['cold_load_s']:.2f} | {r['warm_load_s']:.2f} | "
                     f"{r['warm_load_s'] / r['cold_load_s']:.1%} | {r['rel_err']:.1e} |")
    lines += ["", "Cold load: empty optcli program cache and empty PoCL kernel cache, fresh process; warm load: "
              "the same again with the caches the cold load filled. `warm/cold` below 10% meets the aim of a 90% "
              "shorter warm load.", ""]
    if "pthread" in device_name or "Portable Computing Language" in device_name or "PoCL" in device_name:
        lines += ["The device here is PoCL, OpenCL on the CPU: these figures show the OpenCL path's overheads "
                  "(copies, layout conversions, kernel launch) and load times on this machine, not GPU speed. "
                  "Run the script on a machine with a GPU for GPU figures.", ""]
    path = ROOT / "docs" / "benchmarks-opencl.md"
    path.write_text("\n".join(lines))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2,resnet18,efficientnet_lite0")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--bounds-overhead", action="store_true", help="measure the kernels' bounds checks")
    args = parser.parse_args()
    from optcli.runtime.opencl.device import ClDevice

    device_name = ClDevice.shared().name
    if args.bounds_overhead:
        for name in args.models.split(","):
            r = bounds_overhead(name, args)
            print(f"{LABELS.get(name, name)} on {device_name}, {args.precision}, {args.runs} runs each, "
                  f"interleaved: median checked {r['checked_ms']:.1f} ms vs unchecked {r['unchecked_ms']:.1f} ms "
                  f"({r['overhead']:+.1%}); fastest {r['checked_min_ms']:.1f} vs {r['unchecked_min_ms']:.1f} ms "
                  f"({r['overhead_min']:+.1%})", flush=True)
        return 0
    rows = []
    for name in args.models.split(","):
        print(f"{LABELS.get(name, name)}: ...", flush=True)
        r = bench_model(name, args)
        rows.append(r)
        print(f"  opencl {r['opencl_ms']:.1f} ms, arm {r['arm_ms']:.1f} ms, ort {r['ort_ms']:.1f} ms; "
              f"load cold {r['cold_load_s']:.2f} s ({r['cold_builds']} builds), warm {r['warm_load_s']:.2f} s "
              f"({r['warm_builds']} builds); copies {r['transfers']}; rel err {r['rel_err']:.1e}", flush=True)
    if args.write_docs:
        print(f"wrote {write_docs(rows, args, device_name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
