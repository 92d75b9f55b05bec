"""The `opt` command: flags, outputs, reports, exit codes, atomic writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
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
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=metal,arm",  # metal: static shapes only
                        f"--optimize_out={tmp_path}/g"], capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings and all("cannot run on metal: dynamic shape (" in w and w.endswith(" on arm")
                            for w in warnings)
    ops = [re.search(r"warning: (?:\d+ )?(\w+) node", w).group(1) for w in warnings]
    assert len(ops) == len(set(ops)) and "Conv" in ops  # once per (target, op type, reason)


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


@pytest.mark.opencl
def test_devices_command(capsys):
    code, out, _ = run(["devices"], capsys, main=optcli_main)
    assert code == 0 and "usable" in out and "recommended: --precision=" in out
    code, out, _ = run(["devices", "--json"], capsys, main=optcli_main)
    assert code == 0 and json.loads(out)[0]["max_work_group_size"] > 0


def _island_model(tmp_path):
    """Relu -> CumSum (no GPU kernel) -> Sigmoid on a tiny tensor: GPU islands too small for their copies."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("CumSum", ["r", "axis"], ["c"], name="cumsum"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    path = tmp_path / "island.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_summary_says_how_many_steps_each_gpu_target_got(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=metal,arm", f"--optimize_out={tmp_path}/d",
                        f"--report={tmp_path}/d.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "d.json").read_text())
    n = report["nodes_after"]
    assert f"-> {n} steps: 0 of {n} steps on metal, {n} on arm" in err  # dynamic shapes: nothing on Metal
    assert report["steps_per_target"] == {"metal": 0, "arm": n}
    conv = [g for g in report["placement_reasons"] if g["op"] == "Conv"]
    assert conv == [{"target": "metal", "op": "Conv", "reason": "dynamic shape", "count": 3, "example": "conv_0",
                     "detail": "'input' has a dynamic shape (the metal runtime binds static shapes only; pin it with "
                               "--input_shapes)", "runs_on": ["arm"]}]
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=opencl,arm", f"--optimize_out={tmp_path}/y",
                        f"--report={tmp_path}/y.json"], capsys)
    report = json.loads((tmp_path / "y.json").read_text())
    k, n = report["steps_per_target"]["opencl"], report["nodes_after"]
    assert code == 0 and f"-> {n} steps: {k} of {n} steps on opencl" in err and k == n  # OpenCL binds them at run
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=opencl,arm", "--input_shapes=input:1,3,32,32",
                        f"--optimize_out={tmp_path}/s", f"--report={tmp_path}/s.json"], capsys)
    report = json.loads((tmp_path / "s.json").read_text())
    k, n = report["steps_per_target"]["opencl"], report["nodes_after"]
    assert code == 0 and k > 0 and report["steps_per_target"] == {"opencl": k, "arm": n - k}
    assert f"-> {n} steps: {k} of {n} steps on opencl, {n - k} on arm" in err
    assert report["placement_reasons"] == [] and "cannot run" not in err
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=arm", f"--optimize_out={tmp_path}/a"], capsys)
    assert code == 0 and re.search(r"-> \d+ steps on arm\b", err) and " of " not in err


def test_summary_says_when_the_cost_model_moved_every_gpu_step_to_the_host(tmp_path, capsys):
    path = _island_model(tmp_path)
    code, _, err = run([f"--model_file={path}", "--valid_targets=opencl,arm", f"--optimize_out={tmp_path}/i"],
                       capsys)
    assert code == 0, err
    assert "-> 3 steps: 0 of 3 steps on opencl, 3 on arm" in err
    line = next(x for x in err.splitlines() if "cost model moved all" in x)
    saving, copies = map(float, re.search(r"save an estimated ([\d.]+) us per run, .* cost ([\d.]+) us", line).groups())
    assert "2 GPU node(s) to arm" in line and saving < copies and "--disable_pass=keep_small_islands_on_host" in line
    code, _, err = run([f"--model_file={path}", "--valid_targets=opencl,arm", f"--optimize_out={tmp_path}/k",
                        "--disable_pass=keep_small_islands_on_host"], capsys)
    assert code == 0 and "cost model" not in err and "-> 11 steps: 10 of 11 steps on opencl, 1 on arm" in err


def test_arm_listed_before_opencl_still_prefers_opencl(model_file, tmp_path, capsys):
    code, _, err = run([f"--model_file={model_file}", "--valid_targets=arm,opencl", "--input_shapes=input:1,3,32,32",
                        f"--optimize_out={tmp_path}/o", f"--report={tmp_path}/o.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "o.json").read_text())
    assert report["targets"] == ["opencl", "arm"] and optcli.load(tmp_path / "o.nb").plan.targets == ["opencl", "arm"]
    assert all(s["target"] == "opencl" for s in report["steps"] if s["op"] == "Conv")


def test_help_states_the_valid_targets_order_rule():
    out = subprocess.run([sys.executable, "-c", "from optcli.cli import opt_main; opt_main()", "--help"],
                         capture_output=True, text=True, check=True).stdout
    text = " ".join(out.split())
    assert "host CPU is always the last resort" in text and "arm,opencl means opencl,arm" in text
