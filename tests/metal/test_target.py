"""The `metal` target on a machine without Metal: `opt` produces the .nb (nothing Apple is
needed at optimize time), placement / kernel selection / report / --print_supported_ops treat it
as they treat `opencl`, its declared limits give placement reasons, and loading a metal plan
here warns and runs on the CPU (or refuses with require_gpu=True)."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import onnx
import pytest

import optcli
from optcli.errors import TargetError
from optcli.runtime import predictor
from optcli.targets import METAL, OPENCL
from optcli.targets.gpu import GpuLimits
from optcli.zoo import build, sample_inputs
from tests.gpu.test_conv import conv_case, ir_graph
from tests.test_cli import run


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("metal") / "net.onnx"
    onnx.save(build("mobilenet_v2", resolution=32, width=0.25), path)
    return path


def _report(model_file, tmp_path, capsys, targets: str) -> dict:
    out = tmp_path / targets.replace(",", "_")
    # the cost model keeps a model this small on the host: placement itself is under test here
    code, _, err = run([f"--model_file={model_file}", f"--valid_targets={targets}", f"--optimize_out={out}",
                        f"--report={out}.json", "--disable_pass=keep_small_islands_on_host"], capsys)
    assert code == 0, err
    assert (tmp_path / f"{out.name}.nb").is_file()
    return json.loads((tmp_path / f"{out.name}.json").read_text())


def test_opt_metal_on_linux_matches_opencl(model_file, tmp_path, capsys):
    metal = _report(model_file, tmp_path, capsys, "metal,arm")
    opencl = _report(model_file, tmp_path, capsys, "opencl,arm")
    assert metal["targets"][0] == "metal"
    gpu = [s for s in metal["steps"] if s["target"] == "metal"]
    assert gpu and all(s["kernel"].startswith("gpu.") for s in gpu)
    # the same kernel library, the same placement and kernel selection
    assert [(s["name"], s["kernel"]) for s in metal["steps"]] == [(s["name"], s["kernel"]) for s in opencl["steps"]]
    assert [s["target"].replace("opencl", "metal") for s in opencl["steps"]] == [s["target"] for s in metal["steps"]]


@pytest.mark.skipif(sys.platform == "darwin", reason="a Mac may run the plan on Metal")
def test_metal_plan_loads_on_the_cpu_here(model_file, tmp_path, capsys, optcli_notices):
    _report(model_file, tmp_path, capsys, "metal,arm")
    nb = tmp_path / "metal_arm.nb"
    model = build("mobilenet_v2", resolution=32, width=0.25)
    feeds = sample_inputs(model)
    predictor._WARNED.clear()
    p = optcli.load(nb)
    assert p.gpu is None
    assert any("metal" in m and "on the CPU" in m for m in optcli_notices())
    cpu = optcli.load(nb, targets=["arm"])
    a, b = p.run(feeds), cpu.run(feeds)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(TargetError, match="require_gpu=True.*metal"):
        optcli.load(nb, require_gpu=True)


def test_runtime_reports_unavailable_without_importing_metal():
    from optcli.runtime.metal import device as metal

    ok, why = metal.available()
    if sys.platform != "darwin":
        assert not ok and "macOS" in why
        assert "Metal" not in sys.modules


def test_print_supported_ops_shows_metal(capsys):
    code, out, _ = run(["--print_supported_ops", "--valid_targets=metal,arm"], capsys)
    assert code == 0
    head = out.splitlines()[0]
    assert "metal" in head and "arm" in head
    conv = next(line.split() for line in out.splitlines() if line.split()[:1] == ["Conv"])
    assert conv == ["Conv", "x", "x"]
    assert METAL.supported_ops() == OPENCL.supported_ops()


def test_metal_declares_its_limits():
    assert METAL.limits.max_threadgroup == 1024 and METAL.limits.max_kernel_args == 31
    assert METAL.limits.max_buffer_bytes == 256 * 2**20
    assert not OPENCL.limits.declared()
    assert METAL.language == "Metal Shading Language"


def _conv(kernel=(3, 3), channels=6):
    x, consts, attrs = conv_case((1, channels, 8, 8), 8, kernel, 1, pads=[1, 1, 1, 1] if kernel == (3, 3) else [0] * 4)
    return ir_graph("Conv", {"x": x}, consts, attrs)


def test_limits_give_placement_reasons():
    graph, node = _conv()
    assert METAL.can_run(node, graph) == (True, "metal kernel")
    few_args = dataclasses.replace(METAL, limits=GpuLimits(max_kernel_args=5))
    ok, reason = few_args.can_run(node, graph)
    assert not ok and "arguments; metal binds at most 5 per kernel" in reason
    small = dataclasses.replace(METAL, limits=GpuLimits(max_buffer_bytes=1024))
    ok, reason = small.can_run(node, graph)
    assert not ok and "one metal buffer holds at most" in reason


def test_limits_steer_kernel_selection():
    """A variant over the limit is skipped for one that fits: the 1x1 conv takes 16 arguments
    (11 declared, its epilogue, its 4 buffers' lengths), the 3x3 one 21, winograd's launches at
    most 13, the generic direct conv 26."""
    graph, node = _conv(kernel=(1, 1))
    assert METAL.select_kernel(node, graph) == "gpu.onnx.Conv.1x1"
    assert dataclasses.replace(METAL, limits=GpuLimits(max_kernel_args=16)).can_run(node, graph)[0]
    assert not dataclasses.replace(METAL, limits=GpuLimits(max_kernel_args=15)).can_run(node, graph)[0]
    graph, node = _conv(kernel=(3, 3))
    tight = dataclasses.replace(METAL, limits=GpuLimits(max_kernel_args=21))
    assert tight.select_kernel(node, graph) in ("gpu.onnx.Conv.3x3", "gpu.onnx.Conv.winograd")


def test_library_kernels_fit_metal_argument_table():
    from optcli.gpu.dialect import kernel_params, load_source, signature_params
    from optcli.gpu.variants import source_names

    widest = max(len(signature_params(p)) for s in source_names() for p in kernel_params(load_source(s)).values())
    assert widest <= METAL.limits.max_kernel_args
