"""Parts 3-5 of the GPU check (``gpu_check.py`` runs each in a process of its own, stopped at its limit):

    python benchmarks/gpu_check_models.py parity|timing|load CONFIG.json OUT.json

- ``parity``: each model optimized for ``opencl,arm`` at each precision, loaded with
  ``require_gpu=True`` on the named device, run, and compared with onnxruntime (CPU): the steps the
  device runs against those left to the host, and the largest error per output's scale, held
  against ``optcli.tolerance.RELATIVE`` (the corpus's own tolerances for corpus models).
- ``timing``: batch 1, median and fastest of the timed runs after warm-up, for optcli on OpenCL
  (with device time per run from OpenCL profiling events, as ``optcli bench`` measures it), torch
  CUDA eager fp32 with and without ``cudnn.benchmark`` (the same architecture from torchvision /
  timm with random weights: not the zoo model's weights), onnxruntime on the CPU, and optcli's
  ``arm`` plan on the CPU.
- ``load``: ``optcli.load`` in a fresh process with empty caches (cold: optcli's program binaries,
  and PoCL's or NVIDIA's own compiler caches), then again with the caches the first one filled (warm).

OUT.json is rewritten after every model, so a part stopped at its limit keeps what it finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # corpus/ (and optcli, where it is not installed)
LABELS = {"mobilenet_v2": "MobileNetV2", "efficientnet_lite0": "EfficientNet-Lite0", "resnet18": "ResNet-18"}
TORCH_TWINS = {"mobilenet_v2": ("torchvision", "mobilenet_v2"), "resnet18": ("torchvision", "resnet18"),
               "efficientnet_lite0": ("timm", "efficientnet_lite0")}
TRANSFERS = ("Upload", "Download")
COPIES = ("Upload", "Download", "Pack", "Unpack")

_LOAD = """
import cProfile, io, json, pstats, sys, time
t0 = time.perf_counter()
import numpy as np
import optcli
from optcli.runtime.opencl.device import ClDevice
profiler = cProfile.Profile() if sys.argv[4] == "warm" else None  # where a warm load's time goes
if profiler:
    profiler.enable()
t1 = time.perf_counter()
ClDevice.shared(sys.argv[3])  # the device's pick, smoke test and context: the load below reuses them
t_device = time.perf_counter()
p = optcli.load(sys.argv[1], require_gpu=True, device=sys.argv[3])
if profiler:
    profiler.disable()
t2 = time.perf_counter()
p.run(dict(np.load(sys.argv[2])))
t3 = time.perf_counter()
dev = p.gpu.dev
print(json.dumps({"load_s": round(t2 - t1, 4), "device_open_s": round(t_device - t1, 4),
                  "first_run_s": round(t3 - t2, 4), "import_s": round(t1 - t0, 3),
                  "programs_built": dev.builds, "cache_hits": dev.cache.hits, "device": dev.describe(),
                  "dont_write_bytecode": sys.flags.dont_write_bytecode}))
if profiler:
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    print(text.getvalue(), file=sys.stderr)
"""


class Part:
    def __init__(self, config: dict, out: Path):
        self.cfg, self.out = config, out
        self.deadline = time.monotonic() + config["budget_s"]
        self.work = Path(config["work"])
        (self.work / "models").mkdir(parents=True, exist_ok=True)
        (self.work / "plans").mkdir(parents=True, exist_ok=True)
        self.corpus = {f"corpus:{e['name']}": e for e in config["corpus"]}
        self.items = [*config["models"], *self.corpus]
        self.data: dict = {"status": "running", "models": {}, "corpus": config["corpus_note"]}
        if not config["fresh_compiler_cache"]:
            self.data["compiler_cache"] = ("kept (--warm-compiler-cache): a cold load starts with an empty optcli "
                                           "program cache only, the OpenCL compiler's own cache is warm")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out)

    def finish(self, rows: dict[str, dict]) -> None:
        """ok when every row is, partial when the budget cut some, else failed."""
        bad = [name for name, r in rows.items() if r.get("ok") is False]
        cut = [name for name, r in rows.items() if "skipped" in r and "budget" in r["skipped"]]
        self.data["status"] = "failed" if bad else "partial" if cut else "ok"
        if bad:
            self.data["message"] = f"{len(bad)} of {len(rows)} failed: {', '.join(bad)}"
        elif cut:
            self.data["message"] = f"the budget ran out: {len(cut)} of {len(rows)} not run ({', '.join(cut)})"
        self.save()

    # ------------------------------------------------------------ models and plans
    def model(self, item: str) -> tuple[Path, dict[str, np.ndarray], str | None]:
        """(ONNX file, feeds, --input_shapes pinning a corpus model's inputs); the feeds are also
        saved beside the models for the load part's child processes."""
        feeds_path = self.work / "models" / f"{item.replace(':', '_')}.npz"
        if item in self.corpus:
            from corpus.evaluate import feeds_for, pinned_shapes

            entry = self.corpus[item]
            path, feeds, shapes = Path(entry["folder"]) / entry["file"], feeds_for(entry), pinned_shapes(entry)
        else:
            import onnx

            from optcli.zoo import build, sample_inputs

            path, shapes = self.work / "models" / f"{item}.onnx", None
            if not path.exists():
                full = self.cfg["size"] == "full"
                onnx.save(build(item, full=True) if full else build(item, resolution=32, width=0.25), str(path))
            feeds = sample_inputs(onnx.load(str(path)))
        if not feeds_path.exists():
            np.savez(feeds_path, **feeds)
        return path, feeds, shapes

    def plan(self, item: str, targets: str, precision: str) -> Path:
        """The .nb file for (item, targets, precision), optimized once and kept in the work folder."""
        import optcli

        nb = self.work / "plans" / f"{item.replace(':', '_')}.{targets.replace(',', '-')}.{precision}.nb"
        if not nb.exists():
            path, _, shapes = self.model(item)
            start = time.perf_counter()
            # Small models' GPU islands would stay on the host (the cost model, tuned on PoCL and phones):
            # the corpus's speech nets and the small zoo would then test no GPU kernel at all.
            keep = {"keep_small_islands_on_host"} if self.cfg["size"] == "small" or item in self.corpus else set()
            result = optcli.optimize(model_file=str(path), valid_targets=targets, precision=precision,
                                     input_shapes=shapes, disabled_passes=keep)
            nb.write_bytes(result.data)
            (nb.with_suffix(".seconds")).write_text(f"{time.perf_counter() - start:.3f}")
            reasons = [f"{r['op']}: {r['detail']}" for r in result.report.get("placement_reasons", [])
                       if r.get("target") == "opencl"]
            placed = {"opencl_steps": result.report["steps_per_target"].get("opencl", 0), "host_reasons": reasons}
            nb.with_suffix(".placed").write_text(json.dumps(placed))
        return nb

    def placed(self, nb: Path) -> dict:
        """The plan's GPU step count and why the optimizer kept ops off the GPU (its report), saved by plan()."""
        return json.loads(nb.with_suffix(".placed").read_text())

    def tolerance(self, item: str, precision: str) -> float:
        if item in self.corpus:
            from corpus.evaluate import tolerance_for

            return tolerance_for(self.corpus[item], precision)
        from optcli.tolerance import RELATIVE

        return RELATIVE[precision]


def onnxruntime_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------- parity
def parity(part: Part) -> None:
    import optcli
    from optcli.tolerance import max_error, within

    rows: dict[str, dict] = {}
    for item in part.items:
        path, feeds, _ = part.model(item)
        sess = onnxruntime_session(path)
        reference = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        for precision in part.cfg["precisions"]:
            row: dict = {"precision": precision}
            part.data["models"].setdefault(item, {})[precision] = rows[f"{item} {precision}"] = row
            if part.left() < 5:
                row["skipped"] = "the part's budget ran out"
                continue
            try:
                nb = part.plan(item, "opencl,arm", precision)
                placed = part.placed(nb)
                row["host_reasons"] = placed["host_reasons"]
                if placed["opencl_steps"] == 0 and row["host_reasons"]:
                    # every op stays on the host because it has no GPU kernel: a known gap, recorded with its
                    # reasons, not a GPU failure (a plan with GPU steps must still run them on the GPU)
                    row["skipped"] = "no GPU steps: " + "; ".join(row["host_reasons"])
                    print(f"parity {item} {precision}: {_row_text(row)}", flush=True)
                    continue
                start = time.perf_counter()
                predictor = optcli.load(str(nb), require_gpu=True, device=part.cfg["device"])
                row["load_s"] = round(time.perf_counter() - start, 3)
                steps, gpu = predictor.plan.steps, predictor.gpu
                on_gpu = set(gpu.gpu_indices)
                row.update(device=gpu.dev.describe(), steps=len(steps), gpu_steps=len(on_gpu),
                           host_steps=len(steps) - len(on_gpu), copy_steps=sum(s.op_type in COPIES for s in steps),
                           host_ops=dict(Counter(s.op_type for i, s in enumerate(steps) if i not in on_gpu)),
                           optimize_s=float(nb.with_suffix(".seconds").read_text()))
                start = time.perf_counter()
                outputs = predictor.run(feeds)
                row["first_run_s"] = round(time.perf_counter() - start, 3)
                row["still_on_gpu"] = predictor.gpu is not None
                errors = {}
                for name, expected in reference.items():
                    err, scale = max_error(outputs[name], expected)
                    errors[name] = {"max_abs": err, "scale": scale, "rel": err / scale,
                                    "within_per_element": within(outputs[name], expected, precision)}
                row["outputs"] = errors
                row["max_rel_err"] = max(e["rel"] for e in errors.values())
                row["tolerance"] = part.tolerance(item, precision)
                row["ok"] = row["still_on_gpu"] and row["max_rel_err"] <= row["tolerance"]
            except Exception as exc:  # recorded; the next model runs
                row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:500]}")
            print(f"parity {item} {precision}: {_row_text(row)}", flush=True)
            part.save()
    part.finish(rows)


def _row_text(row: dict) -> str:
    if "error" in row or "skipped" in row:
        return row.get("error") or row["skipped"]
    return (f"{row['gpu_steps']}/{row['steps']} steps on the device, {row['host_steps']} on the host; max error "
            f"{row['max_rel_err']:.2e} of the scale (tolerance {row['tolerance']:g}): "
            f"{'ok' if row['ok'] else 'FAILED'}")


# ------------------------------------------------------------------------- timing
def timed(fn, warmup: int, runs: int, max_s: float) -> dict:
    """Median and fastest wall time of ``runs`` calls after ``warmup`` (fewer when ``max_s`` is spent)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    stop = time.perf_counter() + max_s
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if time.perf_counter() > stop:
            break
    ms = np.asarray(times) * 1e3
    return {"runs": len(times), "median_ms": round(float(np.median(ms)), 3), "min_ms": round(float(ms.min()), 3)}


def optcli_opencl(part: Part, item: str, precision: str, feeds: dict, max_s: float, tune: str | None = None) -> dict:
    import optcli
    from optcli.commands.bench import profile

    start = time.perf_counter()
    predictor = optcli.load(str(part.plan(item, "opencl,arm", precision)), require_gpu=True,
                            device=part.cfg["device"], tune=tune)
    tune_s = time.perf_counter() - start
    row = timed(lambda: predictor.run(feeds), part.cfg["warmup"], part.cfg["runs"], max_s)
    # optcli bench's per-op profile: device time from OpenCL profiling events, wall time for host steps
    ops = profile(predictor, feeds, 5 if part.cfg["quick"] else 10)
    row["kernel_ms"] = round(sum(g["ms"] for g in ops if g["target"] != "arm" and g["op"] not in TRANSFERS), 3)
    row["copy_ms"] = round(sum(g["ms"] for g in ops if g["target"] != "arm" and g["op"] in TRANSFERS), 3)
    row["host_steps_ms"] = round(sum(g["ms"] for g in ops if g["target"] == "arm"), 3)
    row["kernel_share_of_wall"] = round(row["kernel_ms"] / row["median_ms"], 3)
    row["top_ops"] = ops[:8]
    row["device"] = predictor.gpu.dev.describe()
    if tune:
        row["tune"], row["load_with_tuning_s"] = tune, round(tune_s, 2)
    return row


def optcli_arm(part: Part, item: str, feeds: dict, max_s: float) -> dict:
    import optcli
    import optcli.native

    predictor = optcli.load(str(part.plan(item, "arm", "fp32")), threads=os.cpu_count())
    return {**timed(lambda: predictor.run(feeds), part.cfg["warmup"], part.cfg["runs"], max_s),
            "threads": os.cpu_count(), "native": optcli.native.status()}


def onnxruntime_cpu(part: Part, path: Path, feeds: dict, max_s: float) -> dict:
    sess = onnxruntime_session(path)
    return {**timed(lambda: sess.run(None, feeds), part.cfg["warmup"], part.cfg["runs"], max_s),
            "threads": "onnxruntime's default (one per physical core)"}


def torch_cuda(part: Part, item: str, feeds: dict, max_s: float) -> dict:
    """torch eager fp32 on CUDA, the same architecture with random weights; cudnn.benchmark off, then on."""
    if item not in TORCH_TWINS or part.cfg["size"] != "full":
        return {"skipped": "no torch twin (only the zoo's MobileNetV2, ResNet-18 and EfficientNet-Lite0 at "
                           "full size have one)"}
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"torch cannot be imported ({exc})"}
    if not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} sees no CUDA device"}
    library, arch = TORCH_TWINS[item]
    if library == "torchvision":
        import torchvision

        model = getattr(torchvision.models, arch)(weights=None)
    else:
        import timm

        model = timm.create_model(arch, pretrained=False)
    model = model.eval().cuda()
    x = torch.from_numpy(next(iter(feeds.values()))).cuda()

    def run():
        with torch.inference_mode():
            model(x)
        torch.cuda.synchronize()

    rows = {"model": f"{library}.{arch}", "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "note": "the same architecture as the zoo model, not the same weights (random); eager fp32, batch 1, "
                    "wall time per call ending in torch.cuda.synchronize()"}
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        rows["cudnn_benchmark" if benchmark else "eager"] = timed(run, part.cfg["warmup"] + 5, part.cfg["runs"],
                                                                 max_s / 2)
    torch.backends.cudnn.benchmark = False
    return rows


def engine_row(part: Part, engine: str, item: str, path: Path, feeds: dict, seconds: float) -> dict:
    if engine.startswith("optcli_opencl_"):  # optcli_opencl_fp32, optcli_opencl_fp32_tuned (--tune=normal)
        placed = part.placed(part.plan(item, "opencl,arm", engine.split("_")[2]))
        if placed["opencl_steps"] == 0:  # as in parity: a known gap, not a GPU failure
            return {"skipped": "no GPU steps: " + "; ".join(placed["host_reasons"])}
        return optcli_opencl(part, item, engine.split("_")[2], feeds, seconds,
                             tune="normal" if engine.endswith("_tuned") else None)
    if engine == "torch_cuda_fp32":
        return torch_cuda(part, item, feeds, seconds)
    if engine == "onnxruntime_cpu":
        return onnxruntime_cpu(part, path, feeds, seconds)
    return optcli_arm(part, item, feeds, seconds)


def timing(part: Part) -> None:
    rows: dict[str, dict] = {}
    engines = ["optcli_opencl_fp32", "torch_cuda_fp32", "onnxruntime_cpu", "optcli_arm"]
    engines += ["optcli_opencl_fp16"] if "fp16" in part.cfg["precisions"] else []
    engines += [] if part.cfg["quick"] else ["optcli_opencl_fp32_tuned"]
    for n, item in enumerate(part.items):
        path, feeds, _ = part.model(item)
        model_rows = part.data["models"].setdefault(item, {})
        for k, engine in enumerate(engines):
            # what is left, shared by the engines and models still to come
            share = part.left() / ((len(part.items) - n) * len(engines) - k)
            if part.left() < 3:
                row = {"skipped": "the part's budget ran out"}
            else:
                try:  # half for the timed runs, half for warm-up, loading and profiling
                    row = engine_row(part, engine, item, path, feeds, share / 2)
                except Exception as exc:
                    row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            model_rows[engine] = rows[f"{item} {engine}"] = row
            print(f"timing {item} {engine}: {_timing_text(row)}", flush=True)
            part.save()
    part.finish(rows)


def _timing_text(row: dict) -> str:
    if "error" in row or "skipped" in row:
        return row.get("error") or row["skipped"]
    if "eager" in row:
        return (f"median {row['eager']['median_ms']} ms, min {row['eager']['min_ms']} ms; cudnn.benchmark: "
                f"median {row['cudnn_benchmark']['median_ms']} ms, min {row['cudnn_benchmark']['min_ms']} ms")
    text = f"median {row['median_ms']} ms, min {row['min_ms']} ms ({row['runs']} runs)"
    text += f"; device kernels {row['kernel_ms']} ms, copies {row['copy_ms']} ms" if "kernel_ms" in row else ""
    return text + (f"; load with --tune={row['tune']}: {row['load_with_tuning_s']} s" if "tune" in row else "")


# --------------------------------------------------------------------------- load
def load_times(part: Part) -> None:
    rows: dict[str, dict] = {}
    for precision in part.cfg["precisions"][: 1 if part.cfg["quick"] else None]:  # every model at fp32 first
        for item in [i for i in part.items if i not in part.corpus]:
            row: dict = {}
            part.data["models"].setdefault(item, {})[precision] = rows[f"{item} {precision}"] = row
            if part.left() < 10:
                row["skipped"] = "the part's budget ran out"
                continue
            try:
                nb = part.plan(item, "opencl,arm", precision)
                part.model(item)  # writes the feeds file
                feeds = part.work / "models" / f"{item}.npz"
                cache = part.work / "cache" / f"{item}.{precision}"
                env = {**os.environ, "OPTCLI_CACHE_DIR": str(cache / "optcli")}
                if part.cfg["fresh_compiler_cache"]:  # PoCL's and NVIDIA's own caches of compiled kernels too
                    env.update(POCL_CACHE_DIR=str(cache / "pocl"), CUDA_CACHE_PATH=str(cache / "cuda"))
                for which in ("cold", "warm"):
                    done = subprocess.run([sys.executable, "-c", _LOAD, str(nb), str(feeds), part.cfg["device"], which],
                                          env=env, capture_output=True, text=True, timeout=max(part.left(), 1))
                    if done.returncode != 0:
                        raise RuntimeError(f"{which} load failed: {done.stderr.strip().splitlines()[-1:]}")
                    row[which] = json.loads(done.stdout.strip().splitlines()[-1])
                    if which == "warm":  # cProfile's top entries: where the warm load's time goes
                        row["warm_profile"] = [line for line in done.stderr.splitlines() if line.strip()][-45:]
                for which in ("cold", "warm"):  # what a user waits for: the load and the first run
                    row[which]["total_s"] = round(row[which]["load_s"] + row[which]["first_run_s"], 4)
                row["warm_over_cold"] = round(row["warm"]["total_s"] / row["cold"]["total_s"], 3)
                row["warm_over_cold_load_only"] = round(row["warm"]["load_s"] / row["cold"]["load_s"], 3)
                row["ok"] = row["warm"]["programs_built"] == 0  # the binary cache served every program
                if not row["ok"]:
                    row["error"] = f"the warm load built {row['warm']['programs_built']} programs again"
            except Exception as exc:
                row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:500]}")
            print(f"load {item} {precision}: " + (row.get("error") or row.get("skipped") or
                  f"cold {row['cold']['load_s']} s + first run {row['cold']['first_run_s']} s "
                  f"({row['cold']['programs_built']} programs built), warm {row['warm']['load_s']} s + "
                  f"{row['warm']['first_run_s']} s ({row['warm']['cache_hits']} from the cache); opening the "
                  f"device: cold {row['cold']['device_open_s']} s, warm {row['warm']['device_open_s']} s"), flush=True)
            part.save()
    part.finish(rows)


# ------------------------------------------------------------------------ summary
def summary_lines(parts: dict) -> list[str]:
    """Readable lines for the log from the parity, timing and load parts' results."""
    lines = []
    for item, precisions in parts["parity"].get("models", {}).items():
        for precision, row in precisions.items():
            lines.append(f"parity {LABELS.get(item, item)} {precision}: {_row_text(row)}")
    for item, engines in parts["timing"].get("models", {}).items():
        for engine, row in engines.items():
            lines.append(f"timing {LABELS.get(item, item)} {engine}: {_timing_text(row)}")
    for item, precisions in parts["load"].get("models", {}).items():
        for precision, row in precisions.items():
            text = row.get("error") or row.get("skipped") or (
                f"cold {row['cold']['total_s']} s, warm {row['warm']['total_s']} s (load + first run; "
                f"warm/cold {row['warm_over_cold']:.0%})")
            lines.append(f"load {LABELS.get(item, item)} {precision}: {text}")
    return lines


def main() -> int:
    name, config, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
    part = Part(config, out)
    part.save()
    {"parity": parity, "timing": timing, "load": load_times}[name](part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
