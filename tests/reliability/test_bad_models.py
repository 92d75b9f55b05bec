"""`opt` on bad models: exit code 2, one clear line, no traceback, no output, no temp files.

Each case writes a model into its own folder, runs the real `opt` command in process (as
``tests/test_cli.py`` does), and checks that the output folder is left exactly as it was.
One case runs `opt` as a subprocess to prove nothing else reaches stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optcli.cli import opt_main
from tests.helpers import run_cli


def _model(nodes, inits=(), x_shape=(1, 4), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _relu(opset: int) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], opset=opset)


def _with_external(location: str, offset: str = "0", length: str = "48") -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [w])
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        t.external_data.add(key=key, value=value)
    return model


def _do(*_) -> None:
    """Lets a case's lambda take several steps (each argument is one)."""


WEIGHTS = np.arange(12, dtype=np.float32).tobytes()


def _outside(d: Path) -> Path:
    """A weights file beside (outside) the model folder."""
    (d.parent / "outside.bin").write_bytes(WEIGHTS)
    return d.parent / "outside.bin"

# name -> (writes the model folder, part of the expected message)
CASES = {
    "truncated_protobuf": (lambda d: (d / "model.onnx").write_bytes(_relu(17).SerializeToString()[:-9]),
                           "not a readable ONNX model"),
    "random_bytes": (lambda d: (d / "model.onnx").write_bytes(np.random.default_rng(0).bytes(5000)),
                     "not a readable ONNX model|holds no graph"),
    "empty_file": (lambda d: (d / "model.onnx").write_bytes(b""), "holds no graph|not a readable"),
    "cycle": (lambda d: onnx.save(_model([helper.make_node("Add", ["x", "b"], ["a"]),
                                          helper.make_node("Relu", ["a"], ["b"]),
                                          helper.make_node("Identity", ["a"], ["y"])]), d / "model.onnx"),
              "has a cycle"),
    "self_loop": (lambda d: onnx.save(_model([helper.make_node("Add", ["x", "y"], ["y"])]), d / "model.onnx"),
                  "has a cycle"),
    "missing_initializer": (lambda d: onnx.save(_model([helper.make_node("MatMul", ["x", "w"], ["y"])]),
                                                d / "model.onnx"),
                            "reads 'w', which no node, graph input or initializer defines"),
    "opset_3": (lambda d: onnx.save(_relu(3), d / "model.onnx"), "opset 3 is outside the supported range"),
    "opset_99": (lambda d: onnx.save(_relu(99), d / "model.onnx"), "opset 99 is outside the supported range"),
    "absurd_input": (lambda d: onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])],
                                                x_shape=(10**6, 10**6)), d / "model.onnx"),
                     "input 'x' has an absurd shape"),
    "absurd_reshape": (lambda d: onnx.save(_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                                                  [_ints("s", [10**6, 10**6, 10**6])]), d / "model.onnx"),
                       "absurd shape"),
    "absurd_constant_of_shape": (lambda d: onnx.save(_model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1])),
         helper.make_node("Add", ["x", "c"], ["y"])], [_ints("s", [10**6, 10**6, 4])]), d / "model.onnx"),
        "absurd shape"),
    "absurd_constant_of_computed_shape": (lambda d: onnx.save(_model(
        [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Mul", ["sh", "k"], ["s"]),
         helper.make_node("ConstantOfShape", ["s"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
        [_ints("k", [10**6, 10**6])]), d / "model.onnx"), "absurd shape"),
    "external_dotdot": (lambda d: _do(_outside(d), onnx.save(_with_external("../outside.bin"), d / "model.onnx")),
                        "outside the model directory"),
    "external_absolute": (lambda d: _do(onnx.save(_with_external(str(_outside(d))), d / "model.onnx")),
                          "outside the model directory"),
    "external_symlink": (lambda d: _do(os.symlink(_outside(d), d / "w.bin"),
                                       onnx.save(_with_external("w.bin"), d / "model.onnx")),
                         "outside the model directory"),
    "external_system_file": (lambda d: onnx.save(_with_external("/etc/passwd"), d / "model.onnx"),
                             "outside the model directory"),
    "external_truncated": (lambda d: _do((d / "w.bin").write_bytes(WEIGHTS[:20]),
                                         onnx.save(_with_external("w.bin"), d / "model.onnx")), "truncated"),
    "external_missing": (lambda d: onnx.save(_with_external("w.bin"), d / "model.onnx"), "missing"),
    "external_bad_offset": (lambda d: _do((d / "w.bin").write_bytes(WEIGHTS),
                                          onnx.save(_with_external("w.bin", offset="abc"), d / "model.onnx")),
                            "non-numeric external data offset"),
    "external_negative_offset": (lambda d: _do((d / "w.bin").write_bytes(WEIGHTS),
                                               onnx.save(_with_external("w.bin", offset="-8"), d / "model.onnx")),
                                 "negative external data offset"),
    "not_a_model": (lambda d: (d / "model.onnx").write_text("ir_version: 8\ngraph { node { op_type: 'Relu' } }"),
                    "not a readable ONNX model|holds no graph"),
}


def _run_opt(args: list[str], capsys) -> tuple[int, str]:
    code, out, err = run_cli(opt_main, "opt", args, capsys)
    return code, out + err


def _snapshot(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_exits_2_with_one_line(case, tmp_path, capsys):
    write, message = CASES[case]
    model_dir, out_dir = tmp_path / "model", tmp_path / "out"
    model_dir.mkdir()
    out_dir.mkdir()
    write(model_dir)
    before = _snapshot(tmp_path)
    code, text = _run_opt([f"--model_dir={model_dir}", f"--optimize_out={out_dir}/net",
                           f"--report={out_dir}/report.json", "--valid_targets=opencl,arm"], capsys)
    lines = text.strip().splitlines()
    assert code == 2, text
    assert len(lines) == 1 and lines[0].startswith("opt: error: "), text
    assert "Traceback" not in text and "internal error" not in text
    import re

    assert re.search(message, lines[0]), lines[0]
    assert _snapshot(tmp_path) == before, "opt left files behind"


def test_constant_folding_does_not_allocate_for_huge_ranges(tmp_path, capsys):
    """A Range whose limit comes out of folding (shape inference cannot size it) asks for 3x10^8
    elements: folding must leave it to run time rather than allocate it."""
    import tracemalloc

    nodes = [helper.make_node("ReduceMax", ["l"], ["lm"], keepdims=0),
             helper.make_node("Range", ["a", "lm", "c"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("a", 0), ("l", [3e8]), ("c", 1))]
    onnx.save(_model(nodes, inits, x_shape=(1,)), tmp_path / "m.onnx")
    tracemalloc.start()
    try:
        code, text = _run_opt([f"--model_file={tmp_path / 'm.onnx'}", f"--optimize_out={tmp_path}/m", "-q"], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, text
    assert peak < 200 << 20, f"optimizing a tiny model allocated {peak / 1e6:.0f} MB"


def test_no_traceback_through_a_real_process(tmp_path):
    (tmp_path / "model").mkdir()
    CASES["cycle"][0](tmp_path / "model")
    (tmp_path / "trunc.onnx").write_bytes(_relu(17).SerializeToString()[:-9])
    for args in ([f"--model_dir={tmp_path / 'model'}"], [f"--model_file={tmp_path / 'trunc.onnx'}"]):
        proc = subprocess.run([sys.executable, "-c", "from optcli.cli import opt_main; opt_main()", *args,
                               f"--optimize_out={tmp_path}/out"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OPTCLI_DEBUG": ""})
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "out.nb").exists()
