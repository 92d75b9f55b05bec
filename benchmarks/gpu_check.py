"""The GPU check's driver (issue 21), run by ``bash benchmarks/gpu_check.sh run`` (see benchmarks/README.md).

Six parts, each with a time budget, each recorded with a status whatever happens to the others:

1. ``environment``: the machine, the driver, the versions, ``optcli devices`` (text and JSON), and
   the device the rest runs on (``--device NAME``, else the NVIDIA GPU; with ``--dry-run`` the
   device optcli picks);
2. ``tests``: the GPU tests with ``OPTCLI_OPENCL_DEVICE`` naming that device (pytest's own summary
   line says where they ran);
3. ``parity``, 4. ``timing``, 6. ``load``: see ``gpu_check_models.py``, each in a process of its own
   that is stopped at its limit (a hung driver cannot stop the rest);
5. ``recurrent``: ``gpu_recurrent_sweep.py``, LSTM and GRU layers of several widths with the whole
   sequence in one launch and with a launch per step (what ``WHOLE_SEQUENCE_HIDDEN`` comes from),
   each checked against onnxruntime.

Before them, unless ``--dry-run`` without ``--icd``, the NVIDIA OpenCL library is looked up and an
ICD file naming it is written to a folder of our own, which ``OCL_ICD_VENDORS`` points at.  The
result is ``OUT/gpu_check.json``, rewritten after every part; the pytest output goes to
``OUT/pytest.log``.  Exit code: 0 every part ok, 1 a part failed, 2 no NVIDIA OpenCL library or device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT, PYTEST_LOG = "gpu_check.json", "pytest.log"
NVIDIA_LIB = "libnvidia-opencl.so.1"
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64", "/usr/lib64", "/usr/local/nvidia/lib",
            "/usr/lib", "/usr/local/cuda/compat", "/usr/lib/wsl/lib")
LIB_PATH_ENV = "GPU_CHECK_LIB_PATH"  # folders (":"-separated) searched instead of ldconfig and LIB_DIRS
PARTS = ("environment", "tests", "parity", "timing", "recurrent", "load")
# seconds: on PoCL here the whole GPU test subset took 20 s with warm caches; the GPU compiles from cold
BUDGETS = {False: {"environment": 30, "tests": 110, "parity": 70, "timing": 110, "recurrent": 50, "load": 90},
           True: {"environment": 20, "tests": 60, "parity": 35, "timing": 45, "recurrent": 20, "load": 30}}  # --quick
RECURRENT_TOLERANCE = 1e-3  # a hundred steps of fp32 recurrence, as the corpus's recurrent models
TESTS = {False: "tests/test_models_gpu.py tests/runtime/test_opencl_runtime.py tests/runtime/test_dynamic_gpu.py "
                "tests/gpu",
         True: "tests/test_models_gpu.py tests/runtime/test_opencl_runtime.py"}
MODELS = {False: "mobilenet_v2,efficientnet_lite0,resnet18", True: "mobilenet_v2"}

_VERSIONS = """
import json
from importlib.metadata import PackageNotFoundError, version
out = {}
for name in ("numpy", "onnx", "onnxruntime", "pyopencl", "torch", "torchvision", "timm", "pytest"):
    try:
        out[name] = version(name)
    except PackageNotFoundError:
        out[name] = None
try:
    import torch
    out["torch_cuda"] = {"available": torch.cuda.is_available(), "cuda": torch.version.cuda,
                         "cudnn": torch.backends.cudnn.version(),
                         "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
except Exception as exc:
    out["torch_cuda"] = f"{type(exc).__name__}: {exc}"
import optcli.native
from optcli._version import __version__
out["optcli"], out["optcli_native"] = __version__, optcli.native.status()
print(json.dumps(out))
"""
_DEVICES = """
import sys
from optcli.cli import optcli_group
for args in (["devices"], ["devices", "--json"]):  # `optcli devices` and `optcli devices --json`, one smoke test
    try:
        optcli_group(args, standalone_mode=False)
    except Exception as exc:  # no usable device: said in the text
        print(f"optcli {' '.join(args)}: {type(exc).__name__}: {exc}")
    print("--8<--", flush=True)
"""


def command(cmd: list[str], timeout: float, **kw) -> dict:
    """{"rc", "out"} of a short command, or {"error"} when it cannot run or hangs."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1), **kw)
    except FileNotFoundError:
        return {"error": f"{cmd[0]}: not found"}
    except subprocess.TimeoutExpired:
        return {"error": f"{' '.join(cmd[:3])}: no answer in {timeout:.0f} s"}
    return {"rc": done.returncode, "out": (done.stdout + done.stderr).strip()}


def find_nvidia_opencl() -> tuple[str | None, list[str]]:
    """(path of the NVIDIA OpenCL library or None, what was searched)."""
    given = os.environ.get(LIB_PATH_ENV)
    searched: list[str] = []
    if given is None:
        found = command(["ldconfig", "-p"], 10)
        searched.append("ldconfig -p" + (f" ({found['error']})" if "error" in found else ""))
        for line in found.get("out", "").splitlines():
            if NVIDIA_LIB in line and "=>" in line and Path(line.split("=>", 1)[1].strip()).exists():
                return line.split("=>", 1)[1].strip(), searched
    for folder in [d for d in given.split(":") if d] if given is not None else LIB_DIRS:
        searched.append(folder)
        hits = sorted(Path(folder).glob("libnvidia-opencl.so*")) if Path(folder).is_dir() else []
        if hits:
            return str(next((h for h in hits if h.name == NVIDIA_LIB), hits[0])), searched
    return None, searched


def missing_library_message(searched: list[str]) -> str:
    folders = [s for s in searched if s.startswith("/")]
    cuda = [str(p) for d in folders if Path(d).is_dir() for p in sorted(Path(d).glob("libcuda.so*"))[:1]]
    text = (f"{NVIDIA_LIB} not found (searched: {', '.join(searched)}): this machine has no NVIDIA OpenCL "
            "library, so OpenCL cannot see its GPU; nothing was run on it")
    if cuda:
        caps = os.environ.get("NVIDIA_DRIVER_CAPABILITIES")
        text += (f". The driver itself is there ({cuda[0]}) without its OpenCL part: in a container the NVIDIA "
                 "runtime mounts it only when NVIDIA_DRIVER_CAPABILITIES includes compute (here: "
                 f"{caps if caps is not None else 'unset'})")
    return text


def setup_icd(work: Path) -> dict:
    """Write an ICD file naming the NVIDIA library into a folder of ours and point OCL_ICD_VENDORS at
    it (pyopencl's wheel bundles the ocl-icd loader, which reads it)."""
    lib, searched = find_nvidia_opencl()
    if lib is None:
        return {"status": "failed", "searched": searched, "message": missing_library_message(searched)}
    folder = work / "icd"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nvidia.icd").write_text(lib + "\n")
    os.environ["OCL_ICD_VENDORS"] = str(folder)
    return {"status": "ok", "library": lib, "library_file": os.path.realpath(lib), "searched": searched,
            "icd_file": str(folder / "nvidia.icd"),
            "OCL_ICD_VENDORS": str(folder)}


def choose_device(devices: list[dict], name: str | None, dry_run: bool) -> tuple[dict | None, str]:
    """(the device's entry from ``optcli devices --json``, "") or (None, why none)."""
    found = "; ".join(f"{d['name']} ({d['platform']}, {'usable' if d['usable'] else ' and '.join(d['problems'])})"
                      for d in devices) or "no OpenCL device at all"
    if name:
        picked = [d for d in devices if name.lower() in d["name"].lower() and d["usable"]]
        why = f"no usable OpenCL device matches --device {name!r} (found: {found})"
    elif dry_run:
        picked = [d for d in devices if d["runs_gpu_steps"]]
        why = f"optcli picks no OpenCL device here (found: {found})"
    else:
        picked = [d for d in devices
                  if d["usable"] and "nvidia" in f"{d['name']} {d['vendor']} {d['platform']}".lower()]
        why = f"no usable NVIDIA OpenCL device (found: {found})"
    return (picked[0], "") if picked else (None, why)


class Check:
    def __init__(self, args):
        self.args = args
        self.out, self.work = Path(args.out), Path(args.work)
        self.deadline = time.monotonic() + args.budget
        self.budgets = dict(BUDGETS[args.quick])
        for item in filter(None, (args.budgets or "").split(",")):
            part, seconds = item.split("=")
            self.budgets[part.strip()] = float(seconds)
        self.selector: str | None = None
        self.result = {
            "check": "optcli GPU check (issue 21, part 3)", "format": 1,
            "command": os.environ.get("GPU_CHECK_COMMAND", "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:])),
            "mode": "dry-run" if args.dry_run else "run", "quick": args.quick, "size": args.size,
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "status": "running", "device": None, "setup": read_setup(args.setup, args.prepared),
            "icd": {"status": "skipped", "message": "--dry-run without --icd: the OpenCL platforms as they are"},
            "parts": {p: {"status": "pending"} for p in PARTS}}

    def save(self) -> None:
        tmp = self.out / (RESULT + ".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.out / RESULT)

    def budget(self, part: str) -> float:
        """The part's budget, scaled down when what is left cannot pay every remaining part in full."""
        pending = [p for p in PARTS if self.result["parts"][p]["status"] == "pending" and p in self.args.parts]
        left = self.deadline - time.monotonic() - 5
        return max(1.0, self.budgets[part] * min(1.0, left / sum(self.budgets[p] for p in pending)))

    def part(self, name: str, fn) -> None:
        if self.result["parts"][name]["status"] != "pending":
            return  # skipped for a reason given already
        if name not in self.args.parts:
            self.result["parts"][name] = {"status": "skipped", "message": "not in --parts"}
            return
        budget = self.budget(name)
        print(f"\n=== {name} (budget {budget:.0f} s) ===", flush=True)
        start = time.monotonic()
        try:
            data = fn(budget)
        except Exception as exc:  # recorded; the next part runs
            data = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        data["seconds"], data["budget_s"] = round(time.monotonic() - start, 1), round(budget)
        self.result["parts"][name] = data
        self.save()
        print(f"=== {name}: {data['status']}{': ' + data['message'] if data.get('message') else ''} "
              f"({data['seconds']} s)", flush=True)

    def skip_rest(self, why: str) -> None:
        for data in self.result["parts"].values():
            if data["status"] == "pending":
                data.update(status="skipped", message=why)

    # ----------------------------------------------------------------- the parts
    def environment(self, budget: float) -> dict:
        py = sys.executable
        env = {"python": sys.version.split()[0], "executable": py, "platform": platform.platform(),
               "cpu": cpu_model(), "cores": os.cpu_count(),
               "nvidia_smi": command(["nvidia-smi", "-L"], 20),
               "nvidia_smi_query": command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                                            "--format=csv,noheader"], 20),
               "driver": first_line("/proc/driver/nvidia/version"),
               "OCL_ICD_VENDORS": os.environ.get("OCL_ICD_VENDORS")}
        versions = command([py, "-c", _VERSIONS], min(90, budget))
        env["versions"] = json.loads(versions["out"].splitlines()[-1]) if versions.get("rc") == 0 else versions
        listing = command([py, "-c", _DEVICES], min(90, budget))
        text, _, as_json = listing.get("out", listing.get("error", "")).partition("--8<--")
        print(text.strip(), flush=True)
        env["optcli_devices"] = {**listing, "out": text.strip()}
        try:  # the JSON list, then maybe why no device is usable
            devices = json.JSONDecoder().raw_decode(as_json[as_json.index("["):])[0]
        except ValueError:
            devices = []
        env["devices"] = devices
        print(f"optcli devices --json:\n{json.dumps(devices, indent=1)}", flush=True)
        if self.result["icd"]["status"] == "failed":
            return {**env, "status": "ok", "message": "no device chosen: no NVIDIA OpenCL library"}
        dev, why = choose_device(devices, self.args.device, self.args.dry_run)
        if dev is None:
            # what the ICD loader did, for the one run there may be on that machine
            env["icd_debug"] = command([py, "-c", "import pyopencl as cl; print(cl.get_platforms())"], 30,
                                       env={**os.environ, "OCL_ICD_DEBUG": "15"})
            env["icd_debug"]["out"] = env["icd_debug"].get("out", "")[-4000:]
            return {**env, "status": "failed", "message": why}
        self.selector = self.args.device or dev["name"]
        os.environ["OPTCLI_OPENCL_DEVICE"] = self.selector
        self.result["device"] = {k: dev[k] for k in ("name", "platform", "vendor", "kind", "version", "driver",
                                                     "compute_units", "global_mem_mb", "fp16_native")}
        self.result["device"]["selector"] = self.selector
        print(f"device: {dev['name']} ({dev['platform']}, driver {dev['driver']}); "
              f"OPTCLI_OPENCL_DEVICE={self.selector}", flush=True)
        return {**env, "status": "ok"}

    def tests(self, budget: float) -> dict:
        paths = (self.args.tests or TESTS[self.args.quick]).split()
        cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", "--maxfail=50", *paths]
        print(" ".join(cmd[2:]), flush=True)
        rc, timed_out = run_limited(cmd, budget, self.out / PYTEST_LOG)
        text = (self.out / PYTEST_LOG).read_text(errors="replace")
        counts = Counter(m.group(1) for m in re.finditer(r"^tests/\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)",
                                                         text, re.M))
        ran_on = re.findall(r"^opencl: (.*)$", text, re.M)
        summary = re.findall(r"^=+ (.* in [\d.]+s.*?) =+$", text, re.M)
        failures = [f"{m.group(1)}{' - ' + m.group(2)[:300] if m.group(2) else ''}"
                    for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", text, re.M)]
        data = {"command": " ".join(["python", *cmd[1:]]), "OPTCLI_OPENCL_DEVICE": self.selector, "rc": rc,
                "counts": dict(counts), "ran_on": ran_on[-1] if ran_on else None,
                "summary": summary[-1] if summary else None, "failures": failures[:40], "log": PYTEST_LOG}
        print(f"{dict(counts)}; {data['summary']}; {data['ran_on']}", flush=True)
        # pytest's summary says where the tests ran ("ran on"); stopped at the limit, its header ("run on")
        ran_here = bool(data["ran_on"] and re.match(r"GPU tests (ran|run) on ", data["ran_on"])) and \
            self.selector.lower() in data["ran_on"].lower()
        if not ran_here:
            return {**data, "status": "failed", "message": f"the GPU tests did not run on {self.selector!r}: "
                                                           f"{data['ran_on'] or 'pytest said nothing about it'}"}
        if counts["FAILED"] or counts["ERROR"] or (rc not in (0, None) and not timed_out):
            return {**data, "status": "failed",
                    "message": f"{counts['FAILED']} failed, {counts['ERROR']} errors (pytest exit code {rc})"}
        if timed_out:
            return {**data, "status": "partial", "message": f"stopped at its limit ({budget:.0f} s) after "
                                                            f"{sum(counts.values())} tests, none failed"}
        return {**data, "status": "ok"}

    def models_part(self, name: str, budget: float) -> dict:
        """Parts 3-5, in a child process (gpu_check_models.py) stopped at the part's limit."""
        config = {"work": str(self.work), "device": self.selector, "size": self.args.size, "budget_s": budget,
                  "models": self.args.models.split(","), "precisions": self.args.precisions.split(","),
                  "runs": self.args.runs, "warmup": 5 if self.args.quick else 10, "quick": self.args.quick,
                  "fresh_compiler_cache": not self.args.warm_compiler_cache}
        config["corpus"], config["corpus_note"] = corpus_entries(self.args.quick)
        path, out = self.work / f"{name}.config.json", self.work / f"{name}.json"
        path.write_text(json.dumps(config))
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).with_name("gpu_check_models.py")), name, str(path), str(out)]
        rc, timed_out = run_limited(cmd, budget + 15, None)
        data = json.loads(out.read_text()) if out.exists() else {}
        if timed_out:
            data.update(status="error", message=f"stopped at its limit ({budget + 15:.0f} s) while it ran; what it "
                                                "had finished is kept")
        elif rc != 0 or data.get("status") in (None, "running"):
            data.update(status="error", message=f"its process ended with exit code {rc} (see gpu_check.log)")
        return data

    def recurrent(self, budget: float) -> dict:
        """Part 5, in a child process stopped at the part's limit."""
        out = self.work / "recurrent.json"
        small = self.args.quick or self.args.size == "small"  # a sweep that fits a dry run on a CPU device
        cmd = [sys.executable, str(Path(__file__).with_name("gpu_recurrent_sweep.py")), "--budget", str(budget - 5),
               "--out", str(out), *(["--device", self.selector] if self.selector else []),
               *(["--hidden", "16,64", "--seq", "10"] if small else [])]
        rc, timed_out = run_limited(cmd, budget + 15, None)
        rows = json.loads(out.read_text()) if out.exists() else []
        data: dict = {"rows": rows}
        bad = [f"{r['op']} {r['hidden']} {mode}" for r in rows for mode in ("whole_sequence", "per_step")
               if mode in r and not r[mode]["max_rel_err"] <= RECURRENT_TOLERANCE]
        if timed_out or rc != 0:
            return {**data, "status": "error", "message": f"exit code {rc}" + (" (stopped at its limit)" * timed_out)}
        if bad:
            return {**data, "status": "failed", "message": f"off onnxruntime by more than {RECURRENT_TOLERANCE}: "
                                                           + ", ".join(bad)}
        cut = [r for r in rows if "skipped" in r]
        return {**data, "status": "partial" if cut else "ok",
                **({"message": f"the budget ran out: {len(cut)} of {len(rows)} not run"} if cut else {})}

    def run(self) -> int:
        self.save()
        if self.args.icd or not self.args.dry_run:
            self.result["icd"] = setup_icd(self.work)
            print(f"icd: {self.result['icd'].get('message') or self.result['icd']['icd_file']}", flush=True)
        self.part("environment", self.environment)
        if self.result["icd"]["status"] == "failed":
            self.skip_rest(f"no NVIDIA OpenCL library: {self.result['icd']['message']}")
        elif self.selector is None:
            why = self.result["parts"]["environment"].get("message", "the environment part failed")
            self.skip_rest(f"no device to run on: {why}")
        self.part("tests", self.tests)
        for name in ("parity", "timing"):
            self.part(name, lambda budget, name=name: self.models_part(name, budget))
        self.part("recurrent", self.recurrent)
        self.part("load", lambda budget: self.models_part("load", budget))
        failed = [p for p, d in self.result["parts"].items() if d["status"] in ("failed", "error")]
        stopped = self.result["icd"]["status"] == "failed" or self.selector is None
        partial = [p for p, d in self.result["parts"].items() if d["status"] == "partial"]
        self.result["status"] = "failed" if failed or stopped else "partial" if partial else "ok"
        self.result["failed_parts"] = failed
        self.result["finished_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        self.save()
        print_summary(self.result)
        return 2 if stopped else 1 if failed else 0


def run_limited(cmd: list[str], seconds: float, log: Path | None) -> tuple[int | None, bool]:
    """(exit code, timed out): the command in a session of its own, its output to ``log`` (else ours),
    the whole session killed at the limit."""
    sys.stdout.flush()
    with open(log, "w") if log else open(os.devnull) as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink if log else None, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=seconds), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, True


def corpus_entries(quick: bool) -> tuple[list[dict], str]:
    folder = os.environ.get("OPTCLI_CORPUS_DIR")
    if not folder:
        return [], "skipped: OPTCLI_CORPUS_DIR is not set"
    manifest = Path(folder) / "manifest.json"
    if not manifest.is_file():
        return [], f"skipped: no {manifest}"
    entries = [e for e in json.loads(manifest.read_text())["models"] if "ci" in e.get("subset", [])]
    return [{**e, "folder": folder} for e in entries[: 2 if quick else None]], f"{len(entries)} CI models of {folder}"


def read_setup(path: str | None, prepared: str | None) -> dict:
    """What gpu_check.sh did before the driver (key=value lines), and what prepare left."""
    setup: dict = {}
    if path and Path(path).is_file():
        setup = dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)
    if prepared and Path(prepared).is_dir():
        p = Path(prepared)
        setup["prepared_wheels"] = sorted(w.name for w in (p / "wheels").glob("*.whl"))
        setup["prepared_from"] = (p / "commit.txt").read_text().strip() if (p / "commit.txt").is_file() else None
    return setup


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor())


def first_line(path: str) -> str | None:
    p = Path(path)
    return p.read_text().splitlines()[0].strip() if p.is_file() else None


def print_summary(result: dict) -> None:
    from gpu_check_models import summary_lines

    dev = result["device"] or {}
    print(f"\n=== summary: {result['status']} on {dev.get('name', 'no device')} "
          f"({dev.get('platform', '-')}, driver {dev.get('driver', '-')}) ===")
    for name, data in result["parts"].items():
        print(f"{name}: {data['status']}{' - ' + data['message'] if data.get('message') else ''}")
    for line in summary_lines(result["parts"]):
        print(line)
    print(f"result: {RESULT}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["run"])
    parser.add_argument("--out", default=str(ROOT / "gpu_check_out"))
    parser.add_argument("--work", required=True, help="a scratch folder (gpu_check.sh makes one)")
    parser.add_argument("--setup", help="gpu_check.sh's record of the install")
    parser.add_argument("--prepared", help="the folder prepare filled (.gpu_check)")
    parser.add_argument("--budget", type=float, default=420, help="seconds for every part together")
    parser.add_argument("--budgets", help="per-part seconds, e.g. tests=100,load=30")
    parser.add_argument("--parts", default=",".join(PARTS), help="the parts to run (the others: skipped)")
    parser.add_argument("--dry-run", action="store_true", help="this machine's OpenCL device, no ICD set-up")
    parser.add_argument("--icd", action="store_true", help="set up the NVIDIA ICD even with --dry-run")
    parser.add_argument("--quick", action="store_true", help="fewer tests, one model, fewer runs")
    parser.add_argument("--size", choices=["full", "small"], default="full",
                        help="zoo models at their published sizes (224x224, 1000 classes) or small ones (32x32)")
    parser.add_argument("--device", help="part of the OpenCL device's name (default: the NVIDIA GPU; "
                                         "with --dry-run the device optcli picks)")
    parser.add_argument("--models", help=f"zoo models (default {MODELS[False]}; --quick: {MODELS[True]})")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--runs", type=int, help="timed runs per engine (default 50; --quick: 10)")
    parser.add_argument("--warm-compiler-cache", action="store_true",
                        help="cold loads keep the OpenCL compiler's own cache (PoCL's, NVIDIA's): only optcli's "
                             "program cache starts empty (the suite's dry run: PoCL compiles slowly)")
    parser.add_argument("--tests", help=f"pytest paths (default: {TESTS[False]}; --quick: {TESTS[True]})")
    args = parser.parse_args(argv)
    args.models = args.models or MODELS[args.quick]
    args.runs = args.runs or (10 if args.quick else 50)
    args.parts = [p.strip() for p in args.parts.split(",")]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
