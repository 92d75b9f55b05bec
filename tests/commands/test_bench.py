"""`optcli bench`: latency, init times, per-op profile, onnxruntime comparison, JSON/CSV, CI gate."""

from __future__ import annotations

import json

import pytest

from tests.commands.conftest import cli


@pytest.mark.opencl
def test_gpu_bench_json_with_profile_and_onnxruntime(gpu_model, capsys, opencl_device):
    code, out, err = cli(["bench", str(gpu_model[1]), "--runs=3", "--warmup=1", "--profile_runs=2",
                          f"--compare_onnx={gpu_model[0]}", "--json"], capsys)
    assert code == 0, err
    r = json.loads(out)
    assert r["runs"] == 3 and r["min_ms"] <= r["median_ms"] <= r["p90_ms"]
    assert r["init"]["cold_s"] > 0 and r["init"]["warm_s"] > 0 and r["peak_host_mb"] > 0
    profile = r["profile"]
    assert profile[0]["ms"] >= profile[-1]["ms"] and abs(sum(p["share"] for p in profile) - 1) < 0.01
    assert r["device"] == opencl_device.name and r["device_kind"] == opencl_device.kind
    # GPU steps timed by OpenCL profiling events: the model's convs ran on opencl, none on the host
    assert any(p["target"] == "opencl" and p["op"] == "Conv" and p["ms"] > 0 for p in profile)
    assert not any(p["target"] != "opencl" and p["op"] == "Conv" for p in profile), profile
    ort = r["onnxruntime"]
    assert ort["max_abs_diff"] < 1e-4 and ort["ratio"] > 0


def test_cpu_bench_text_and_csv(cpu_model, capsys):
    code, out, err = cli(["bench", str(cpu_model[1]), "--runs=2", "--warmup=0", "--input_shapes=input:1,3,16,16"],
                         capsys)
    assert code == 0, err
    assert "latency: min" in out and "cold start" in out and "per-op profile" in out and "Conv" in out
    assert max(len(line) for line in out.splitlines()[1:]) <= 80
    code, out, _ = cli(["bench", str(cpu_model[1]), "--runs=1", "--warmup=0", "--profile_runs=0",
                        "--input_shapes=input:1,3,16,16", "--csv"], capsys)
    header, row = out.strip().splitlines()
    assert header.startswith("model,device,runs,min_ms") and len(row.split(",")) == len(header.split(","))


def test_max_secs_stops_the_timed_runs(cpu_model, capsys):
    code, out, _ = cli(["bench", str(cpu_model[1]), "--runs=1000", "--max_secs=0", "--warmup=0", "--profile_runs=0",
                        "--input_shapes=input:1,3,8,8", "--json"], capsys)
    assert code == 0 and json.loads(out)["runs"] == 1


def test_max_diff_gate_exits_3(gpu_model, capsys):
    code, _, err = cli(["bench", str(gpu_model[1]), "--runs=1", "--warmup=0", "--profile_runs=0",
                        f"--compare_onnx={gpu_model[0]}", "--max_diff=0"], capsys)
    assert code == 3 and "exceeds --max_diff" in err


def test_user_errors(cpu_model, gpu_model, capsys):
    for args, message in ((["bench", str(cpu_model[1])], "--input_shapes=input:1,3,1,1"),
                          (["bench", str(gpu_model[1]), "--max_diff=1"], "give --compare_onnx"),
                          (["bench", str(gpu_model[1]), "--json", "--csv"], "choose one")):
        code, _, err = cli(args, capsys)
        assert code == 2 and message in err, (args, err)
