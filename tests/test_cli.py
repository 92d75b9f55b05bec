"""The `opt` command: flags, outputs, reports, exit codes, atomic writes."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

import optcli
from optcli.cli import opt_main, optcli_main
from optcli.zoo import build, sample_inputs
from tests.helpers import run_cli


def run(args: list[str], capsys, main=opt_main) -> tuple[int, str, str]:
    return run_cli(main, "opt", args, capsys)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "net.onnx"
    onnx.save(build("dynamic_cnn"), path)
    return path


def test_writes_nb_and_report(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=arm", f"--optimize_out={tmp_path}/net",
                        "--input_shapes=input:1,3,32,32", f"--report={tmp_path}/r.json"], capsys)
    assert code == 0, err
    assert (tmp_path / "net.nb").is_file()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["nodes_after"] < report["nodes_before"]
    assert {"passes", "steps", "memory", "sizes", "warnings", "fallback_ops"} <= set(report)
    assert report["memory"]["peak_activation_bytes"] <= report["memory"]["naive_activation_bytes"]
    assert all(s["target"] == "arm" and s["kernel"] for s in report["steps"])
    p = optcli.load(tmp_path / "net.nb")
    assert p.inputs[0].shape == (1, 3, 32, 32)
    p.run(sample_inputs(build("dynamic_cnn"), spatial=32))


def test_output_is_deterministic(model_file, tmp_path, capsys):
    for name in ("a", "b"):
        assert run([f"--model_file={model_file}", f"--optimize_out={tmp_path}/{name}.nb"], capsys)[0] == 0
    assert (tmp_path / "a.nb").read_bytes() == (tmp_path / "b.nb").read_bytes()


def test_model_dir_and_target_aliases(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_dir={model_file.parent}", "--valid_targets=host x86",
                        f"--optimize_out={tmp_path}/d"], capsys)
    assert code == 0, err
    assert optcli.load(tmp_path / "d.nb").plan.targets == ["arm"]


@pytest.mark.parametrize("args, message", [
    (["--valid_targets=gpu"], "unknown target 'gpu'.*valid targets are: arm"),
    (["--disable_pass=fuse_everything"], "unknown pass name"),
    (["--disable_pass=place_nodes"], "cannot be disabled"),
    (["--input_shapes=input:1,3,x,32"], "whole numbers"),
])
def test_user_errors_exit_2_with_one_line_and_no_output(model_file, tmp_path, capsys, args, message):
    code, out, err = run([f"--model_file={model_file}", f"--optimize_out={tmp_path}/x", *args], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    import re

    assert re.search(message, err), err
    assert not list(tmp_path.iterdir())


def test_bad_model_exits_2_and_leaves_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    code, _, err = run([f"--model_file={bad}", f"--optimize_out={tmp_path}/out"], capsys)
    assert code == 2 and "bad.onnx" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_missing_model_flag(capsys):
    code, _, err = run(["--optimize_out=x"], capsys)
    assert code == 2 and "--model_file" in err


def test_internal_error_exits_1(model_file, tmp_path, capsys, monkeypatch):
    import optcli.compiler

    monkeypatch.setattr(optcli.compiler, "to_bytes", lambda plan: 1 / 0)
    code, _, err = run([f"--model_file={model_file}", f"--optimize_out={tmp_path}/x"], capsys)
    assert code == 1 and "internal error" in err
    assert not list(tmp_path.iterdir())


def test_print_flags(model_file, tmp_path, capsys):
    code, out, _ = run(["--print_passes"], capsys)
    assert code == 0 and "fuse_conv_bn" in out
    code, out, _ = run(["--print_supported_ops", "--valid_targets=opencl,arm"], capsys)
    assert code == 0 and "Conv" in out and "opencl" in out
    code, out, _ = run(["--print_all_ops=true"], capsys)
    assert code == 0 and "Einsum" in out and " f" in out
    code, out, _ = run([f"--model_file={model_file}", "--print_model_ops", "--display_kernels"], capsys)
    assert code == 0 and "runs on" in out and "onnx.Conv." in out


def test_gpu_target_without_kernels_warns_once_per_op_and_falls_back(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=opencl,arm",
                        f"--optimize_out={tmp_path}/g"], capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings and all("cannot run on opencl; it runs on arm" in w for w in warnings)
    assert len(warnings) == len({w.split()[4] for w in warnings})  # once per op type


def test_optcli_group_has_opt(model_file, tmp_path, capsys):
    code, _, err = run(["opt", f"--model_file={model_file}", f"--optimize_out={tmp_path}/o"], capsys,
                       main=optcli_main)
    assert code == 0, err


def test_console_script_help():
    out = subprocess.run([sys.executable, "-c", "from optcli.cli import opt_main; opt_main()", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--model_dir", "--valid_targets", "--optimize_out", "--input_shapes", "--report"):
        assert flag in out


def test_placement_config_json_and_bad_file(model_file, tmp_path, capsys):
    cfg = tmp_path / "placement.json"
    cfg.write_text('{"Conv": "arm"}')
    report = tmp_path / "r.json"
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=opencl,arm", "--input_shapes=input:1,3,32,32",
                        f"--placement_config={cfg}", f"--optimize_out={tmp_path}/p", f"--report={report}"], capsys)
    assert code == 0, err
    steps = json.loads(report.read_text())["steps"]
    assert all(s["target"] == "arm" for s in steps if s["op"] == "Conv")
    cfg.write_text('{"Conv": "gpu9000"}')
    code, _, err = run([f"--model_file={model_file}", f"--placement_config={cfg}", f"--optimize_out={tmp_path}/q"],
                       capsys)
    assert code == 2 and "unknown target 'gpu9000'" in err


def test_devices_command(capsys):
    code, out, _ = run(["devices"], capsys, main=optcli_main)
    assert code == 0 and "usable" in out and "recommended: --precision=" in out
    code, out, _ = run(["devices", "--json"], capsys, main=optcli_main)
    assert code == 0 and json.loads(out)[0]["max_work_group_size"] > 0
