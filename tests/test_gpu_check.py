"""The GPU check (benchmarks/gpu_check.sh, issue 21) as a dry run on this machine's OpenCL device
(PoCL here), quick and with small models; and what it says where the NVIDIA OpenCL library is missing.

The dry run needs a usable OpenCL device (``opencl`` marker: it skips with the reason where there is
none); the others need none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
PARTS = {"environment", "tests", "parity", "timing", "recurrent", "load"}
STATUSES = {"ok", "partial", "failed", "error", "skipped"}
ONE_TEST = "tests/runtime/test_opencl_runtime.py::test_one_queue_per_predictor"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dry_run(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict, str]:
    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine: gpu_check.sh is a bash script")
    out = tmp_path / "out"
    environ = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), **(env or {})}
    proc = subprocess.run(["bash", str(SCRIPT), "run", "--dry-run", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=240)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else proc.stdout + proc.stderr
    assert (out / "gpu_check.json").exists(), f"no result file; the log:\n{log[-4000:]}"
    return proc, json.loads((out / "gpu_check.json").read_text()), log


@pytest.mark.opencl
def test_dry_run_records_every_part_on_the_named_device(tmp_path, opencl_device):
    proc, result, log = _dry_run(tmp_path, "--quick", "--size", "small", "--warm-compiler-cache", "--runs", "3",
                                 "--device", opencl_device.name, "--tests", ONE_TEST)
    assert proc.returncode == 0, f"exit code {proc.returncode}; the log:\n{log[-4000:]}"
    assert result["mode"] == "dry-run" and result["status"] == "ok", result.get("failed_parts")
    assert result["device"]["name"] == opencl_device.name and result["device"]["selector"] == opencl_device.name
    assert set(result["parts"]) == PARTS
    for name, part in result["parts"].items():
        assert part["status"] == "ok", (name, part.get("message"))
        assert part["seconds"] <= part["budget_s"] + 20, name
    env = result["parts"]["environment"]
    assert any(d["name"] == opencl_device.name for d in env["devices"]) and env["versions"]["optcli"]

    tests = result["parts"]["tests"]
    assert tests["counts"].get("PASSED") == 1, tests
    assert tests["ran_on"] == f"GPU tests ran on {opencl_device.describe()}"

    for precision in ("fp32", "fp16"):
        row = result["parts"]["parity"]["models"]["mobilenet_v2"][precision]
        assert row["ok"] and row["still_on_gpu"] and row["device"] == opencl_device.describe(), row
        assert row["gpu_steps"] > 0 and row["gpu_steps"] + row["host_steps"] == row["steps"], row
        assert 0 <= row["max_rel_err"] <= row["tolerance"] == {"fp32": 1e-4, "fp16": 1e-2}[precision]
        assert row["outputs"]["output"]["within_per_element"], row

    timing = result["parts"]["timing"]["models"]["mobilenet_v2"]
    for engine in ("optcli_opencl_fp32", "optcli_opencl_fp16", "onnxruntime_cpu", "optcli_arm"):
        assert timing[engine]["runs"] >= 1 and 0 < timing[engine]["min_ms"] <= timing[engine]["median_ms"], engine
    assert timing["optcli_opencl_fp32"]["kernel_ms"] > 0 and timing["optcli_opencl_fp32"]["top_ops"]
    assert "no torch twin" in timing["torch_cuda_fp32"]["skipped"]  # small models have none

    sweep = result["parts"]["recurrent"]["rows"]
    assert {(r["op"], r["hidden"]) for r in sweep} >= {("LSTM", 16), ("GRU", 16)}, sweep
    for row in sweep:
        for mode in ("whole_sequence", "per_step"):
            assert row[mode]["runs"] >= 1 and row[mode]["max_rel_err"] <= 1e-3, row

    load = result["parts"]["load"]["models"]["mobilenet_v2"]["fp32"]
    assert load["cold"]["programs_built"] > 0 and load["warm"]["programs_built"] == 0, load
    assert load["warm"]["cache_hits"] == load["cold"]["programs_built"] + load["cold"]["cache_hits"], load
    assert "=== summary: ok" in log and (tmp_path / "out" / "pytest.log").exists()


def test_a_missing_nvidia_library_is_named_and_nothing_else_runs(tmp_path):
    empty = tmp_path / "no-driver"
    empty.mkdir()
    proc, result, log = _dry_run(tmp_path, "--icd", "--quick", env={"GPU_CHECK_LIB_PATH": str(empty)})
    message = f"libnvidia-opencl.so.1 not found (searched: {empty}): this machine has no NVIDIA OpenCL library"
    assert proc.returncode == 2, log[-3000:]
    assert result["icd"]["status"] == "failed" and result["icd"]["message"].startswith(message), result["icd"]
    assert result["status"] == "failed" and message in log
    assert result["parts"]["environment"]["status"] in STATUSES - {"pending"}
    for name in PARTS - {"environment"}:
        part = result["parts"][name]
        assert part["status"] == "skipped" and part["message"].startswith("no NVIDIA OpenCL library: "), name


def test_the_icd_file_names_the_library_found(tmp_path, monkeypatch):
    gpu_check = _gpu_check()
    driver_only, with_opencl = tmp_path / "a", tmp_path / "b"
    driver_only.mkdir()
    with_opencl.mkdir()
    (driver_only / "libcuda.so.1").write_bytes(b"")
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)  # restored after the test
    monkeypatch.setenv("NVIDIA_DRIVER_CAPABILITIES", "utility")
    monkeypatch.setenv(gpu_check.LIB_PATH_ENV, str(driver_only))
    missing = gpu_check.setup_icd(tmp_path / "work")
    assert missing["status"] == "failed" and "OCL_ICD_VENDORS" not in os.environ
    assert f"The driver itself is there ({driver_only / 'libcuda.so.1'})" in missing["message"]
    assert "NVIDIA_DRIVER_CAPABILITIES includes compute (here: utility)" in missing["message"]

    (with_opencl / "libnvidia-opencl.so.1").write_bytes(b"")
    monkeypatch.setenv(gpu_check.LIB_PATH_ENV, f"{driver_only}:{with_opencl}")
    found = gpu_check.setup_icd(tmp_path / "work")
    assert found["status"] == "ok" and found["searched"] == [str(driver_only), str(with_opencl)]
    assert Path(found["icd_file"]).read_text() == f"{with_opencl / 'libnvidia-opencl.so.1'}\n"
    assert os.environ["OCL_ICD_VENDORS"] == str(Path(found["icd_file"]).parent)


def test_the_run_takes_the_nvidia_device_and_only_it():
    choose = _gpu_check().choose_device

    def device(name, platform, usable=True, picked=False):
        return {"name": name, "platform": platform, "vendor": platform, "usable": usable, "problems": [],
                "runs_gpu_steps": picked}

    pocl = device("pthread-AMD EPYC", "Portable Computing Language", picked=True)
    h100 = device("NVIDIA H100 80GB HBM3", "NVIDIA CUDA")
    assert choose([pocl, h100], None, dry_run=False) == (h100, "")
    assert choose([pocl, h100], None, dry_run=True) == (pocl, "")
    assert choose([pocl, h100], "pthread", dry_run=False) == (pocl, "")
    dev, why = choose([pocl], None, dry_run=False)
    assert dev is None and why.startswith("no usable NVIDIA OpenCL device (found: pthread-AMD EPYC")
    dev, why = choose([], None, dry_run=False)
    assert dev is None and "no OpenCL device at all" in why
