"""What ``optcli.load`` checks beyond the file's form (``runtime/step_checks.py``,
``runtime/plan_shapes.py``): steps against their ops, the recorded shapes against the runtime's
own derivation, and whose fault a run's failure is.  Each case is a crafted body resealed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import InputError, NbFormatError
from tests.reliability.nbfuzz import parts, rebuild

W = np.random.default_rng(2).standard_normal((2, 1, 3, 3)).astype(np.float32)


def _conv(shape, targets="arm") -> bytes:
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return optcli.optimize(model=model, valid_targets=targets, disabled_passes={"keep_small_islands_on_host"}).data


@pytest.fixture(scope="module")
def conv():
    return _conv([1, 1, 4, 4])


def _crafted(data: bytes, edit) -> bytes:
    body, blob = parts(data)
    edit(body)
    return rebuild(body, blob)


def _conv_step(body) -> dict:
    return next(s for s in body["steps"] if s["op"] == "Conv")


@pytest.mark.parametrize("edit, message", [
    (lambda b: _conv_step(b)["attrs"].update(pads="1111"), "attribute 'pads' must be INTS"),
    (lambda b: _conv_step(b)["attrs"].update(pads=[1, 1, 1, 2**64 - 1]), "attribute 'pads' must be INTS"),
    (lambda b: _conv_step(b)["attrs"].update(pads=[-5, 1, 1, 1]), "attribute 'pads' .* is out of range"),
    (lambda b: _conv_step(b)["attrs"].update(strides=[0, 1]), "attribute 'strides' .* is out of range"),
    (lambda b: _conv_step(b)["attrs"].update(activation="rm -rf"), "fused activation 'rm -rf' is not one of"),
    (lambda b: _conv_step(b)["attrs"].update(activation="relu", activation_alpha="x"),
     "'activation_alpha' must be a number"),
    (lambda b: _conv_step(b).update(inputs=["x", ""]), "its input 1 is required but absent"),
    (lambda b: _conv_step(b).update(inputs=["x", "w", "", "x"]), "it has 4 inputs, the op at most 3"),
    (lambda b: b.update(opsets={"": 99}), "opset is 99"),
    (lambda b: b.update(opsets={"com.example": 1}), "the default ONNX domain's version is missing"),
    (lambda b: b["inputs"].append(dict(b["inputs"][0])), r"inputs\[1\]: 'x' is listed twice"),
    (lambda b: b["outputs"][0].update(name=""), r"outputs\[0\]: empty name"),
    (lambda b: _conv_step(b).update(cpu_kernel="onnx.Relu.default"), "names a second host kernel"),
    (lambda b: _conv_step(b).update(proto=b"\x80\x03"), "proto does not parse"),
    (lambda b: b["inputs"][0].update(shape=[2**63, 1, 4, 4]), "more than 2\\^62 elements"),
])
def test_steps_their_ops_do_not_allow_are_refused_at_load(conv, edit, message):
    with pytest.raises(NbFormatError, match=message):
        optcli.load(_crafted(conv, edit))


def test_a_weight_that_does_not_fit_its_conv_is_refused_at_load(conv):
    """onnx's inference does not compare a Conv's input channels with its weight; our rule does."""
    crafted = _crafted(conv, lambda b: b["inputs"][0].update(shape=[1, 3, 4, 4]))
    with pytest.raises(NbFormatError, match="the input has 3 channels, the weight takes 1"):
        optcli.load(crafted)


def test_recorded_shapes_that_disagree_with_the_steps_are_refused(conv):
    def edit(body):
        next(v for v in body["values"] if v["name"] == "y")["shape"] = [1, 2, 4, 5]

    with pytest.raises(NbFormatError, match=r"value 'y' \(written by step 0 .*, Conv\) is recorded as \[1, 2, 4, 5\] "
                                            r"but its step computes \[1, 2, 4, 4\]"):
        optcli.load(_crafted(conv, edit))
    with pytest.raises(NbFormatError, match="recorded as"):  # another rank
        optcli.load(_crafted(conv, lambda b: next(v for v in b["values"] if v["name"] == "y").update(shape=[1, 2])))


def test_dynamic_inputs_the_steps_cannot_take_are_the_inputs_fault():
    """A symbolic channel dim fed 3 channels: the kernel crashes, and the runtime's own shape rules
    say why; an InputError (exit 2), not a KernelError blaming optcli."""
    p = optcli.load(_conv([1, "C", 4, 4]))
    assert p.run({"x": np.ones((1, 1, 4, 4), np.float32)})["y"].shape == (1, 2, 4, 4)
    with pytest.raises(InputError, match="the input has 3 channels, the weight takes 1"):
        p.run({"x": np.ones((1, 3, 4, 4), np.float32)})


def test_dynamic_inputs_the_gpu_steps_cannot_take_are_refused_before_binding(opencl_device):
    """A GPU Conv placed for one input channel, its input made symbolic in the file: 3 channels
    at run would make the kernel read past its weight; the binding refuses them first."""
    def edit(body):
        for v in [*body["inputs"], *body["values"]]:
            if v["name"] in ("x", "x@opencl", "x@opencl.linear"):
                v["shape"] = ["N", "C", 4, 4]

    crafted = _crafted(_conv(["N", 1, 4, 4], "opencl,arm"), edit)
    p = optcli.load(crafted, require_gpu=True)
    assert p.run({"x": np.ones((2, 1, 4, 4), np.float32)})["y"].shape == (2, 2, 4, 4)
    with pytest.raises(InputError, match="the input has 3 channels, the weight takes 1"):
        p.run({"x": np.ones((1, 3, 4, 4), np.float32)})


def test_the_runtime_imports_no_pass(conv, tmp_path):
    """The .nb format and the plan sit below both the compiler and the runtime: loading and running
    a file imports nothing from optcli.passes (nor the compiler)."""
    path = tmp_path / "conv.nb"
    path.write_bytes(conv)
    code = ("import sys, numpy as np, optcli\n"
            f"optcli.load({str(path)!r}).run({{'x': np.ones((1, 1, 4, 4), np.float32)}})\n"
            "print(sorted(m for m in sys.modules if m.startswith(('optcli.passes', 'optcli.compiler', "
            "'optcli.frontend'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_host_step_out_of_memory_is_a_step_error(conv):
    """Sizes follow the inputs (shapes, and data such as a Range's bounds): a result too big to hold
    is the input's fault (exit 2), not a KernelError."""
    from optcli.runtime.host.steps import StepError

    def no_memory(inputs):
        raise MemoryError("Unable to allocate 6.00 GiB (test)")

    p = optcli.load(conv)
    p._executor.fns = [no_memory, *p._executor.fns[1:]]
    with pytest.raises(StepError, match="does not fit in memory"):
        p.run({"x": np.ones((1, 1, 4, 4), np.float32)})


@pytest.mark.parametrize("edit, message", [
    (lambda b: next(s for s in b["steps"] if s["op"] == "Download").update(inputs=["x"]),
     "reads 'x' on the opencl device, where it never is"),
    (lambda b: b["outputs"][0].update(name="y@opencl"), "output 'y@opencl' stays on the device"),
])
def test_values_cross_between_host_and_device_only_through_upload_and_download(edit, message):
    """A host step reading a GPU step's output would find nothing (a KeyError at run); a GPU step
    reading a host value, a buffer nobody wrote."""
    gpu = _conv(["N", 1, 4, 4], "opencl,arm")
    with pytest.raises(NbFormatError, match=message):
        optcli.load(_crafted(gpu, edit))
