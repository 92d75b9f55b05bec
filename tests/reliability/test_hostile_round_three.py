"""Issue 23's attacks end to end: through ``optcli run`` each crafted file (or crafted input) ends
in exit 2 with one line, never exit 1, a traceback, a hang or a signal, in a plain interpreter and
under ``python -O``; and the tests that hold each attack pass under -O too (its asserts gone).
The files come from the tests of each part; docs/security.md maps every attack to its test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optcli
from optcli import native
from tests.helpers import single_node_model
from tests.reliability.nbfuzz import parts, rebuild

ROOT = Path(__file__).resolve().parents[2]

# Runs each case's argv through the CLI's entry point, in one process: {name: [exit code, stderr]}.
CHILD = """
import contextlib, io, json, sys
from optcli.cli import optcli_main
results = {"optimize": sys.flags.optimize}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    sys.argv = ["optcli", *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            optcli_main()
            code = 0
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:  # anything escaping the CLI is a failure of the test
            code = f"escaped: {type(exc).__name__}: {exc}"
    results[name] = [code, err.getvalue()]
print(json.dumps(results))
"""

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def _arm(model) -> bytes:
    return optcli.optimize(model=model, valid_targets="arm").data


def _with_input_dtype(data: bytes, name: str, dtype: str) -> bytes:
    """The file declaring its input ``name`` of ``dtype`` (as a crafted file may)."""
    body, blob = parts(data)
    for v in [*body["inputs"], *body["values"]]:
        if v["name"] == name:
            v["dtype"] = dtype
    return rebuild(body, blob)


def _attacks(tmp_path: Path, monkeypatch) -> dict[str, tuple[bytes, dict[str, np.ndarray], list[str]]]:
    """name -> (the .nb, the inputs given as .npy files, extra argv): one per attack of issue 23."""
    from tests.runtime.test_blocked_kernels_at_load import C, _region, _reshaped_weight
    from tests.runtime.test_conv_geometry_at_load import CASES, conv_file, with_1x1_kernel_shape
    from tests.runtime.test_input_driven_sizes import EQUATIONS, _sized_by_input, einsum_file
    from tests.runtime.test_run_budget import _endless_loop

    region, x = _region(monkeypatch), {"x": np.ones((1, C, 8, 8), np.float32)}
    cases = {
        # 1. layout confusion
        "blocked Add [1,16,8,8]+[1,1,8,8]": (_reshaped_weight(region, "w1", [1, C, 3, 3]), x, []),
        "blocked PRelu slope along W": (_reshaped_weight(region, "slope", [1, 1, 8]), x, []),
        # 3. conv geometry: a 1x1 kernel_shape on the weight of each native path
        "conv 1x1 kernel_shape, blocked 3x3": (with_1x1_kernel_shape(region), x, []),
    }
    for case, (k, group, channels, _) in CASES.items():
        cases[f"conv 1x1 kernel_shape, {case}"] = (with_1x1_kernel_shape(conv_file(k, group, channels)),
                                                   {"x": np.ones((1, channels, 16, 16), np.float32)}, [])
    # 2. indices
    ge = _arm(single_node_model("GatherElements", {"x": X, "i": np.zeros((3, 1), np.int64)}, attrs={"axis": 1}))
    cases["GatherElements index -5 on an axis of 4"] = (ge, {"x": X, "i": np.full((3, 1), -5)}, [])
    se = _arm(single_node_model("ScatterElements", {"x": X, "i": np.zeros((3, 1), np.int64),
                                                    "u": np.ones((3, 1), np.float32)}, attrs={"axis": 1}))
    cases["ScatterElements index -5 on an axis of 4"] = (se, {"x": X, "i": np.full((3, 1), -5),
                                                              "u": np.ones((3, 1), np.float32)}, [])
    gather = _arm(single_node_model("Gather", {"x": X, "i": np.zeros(1, np.int64)}, attrs={"axis": 1}))
    cases["Gather uint64 index 2^64-1"] = (_with_input_dtype(gather, "i", "uint64"),
                                           {"x": X, "i": np.array([2**64 - 1], np.uint64)}, [])
    cases["Gather float index 2.9"] = (_with_input_dtype(gather, "i", "float32"),
                                       {"x": X, "i": np.array([2.9], np.float32)}, [])
    # 4b. a Loop of 10^12 iterations
    cases["fallback Loop of 10^12 iterations"] = (_arm(_endless_loop()), {"x": np.zeros(4, np.float32)},
                                                  ["--timeout", "1"])
    # 5. the reader: zero bytes, dims numpy cannot form
    honest, x = conv_file(3, 1, 8), {"x": np.ones((1, 8, 16, 16), np.float32)}
    for shape in ([0, 2**62, 2**62], [0, 2**64 - 1]):
        body, blob = parts(honest)
        body["weights"][0].update(shape=shape, nbytes=0)
        cases[f"zero-byte weight {shape}"] = (rebuild(body, blob), x, [])
        body, blob = parts(honest)
        body["steps"][0]["attrs"]["value"] = {"$tensor": {"dtype": "float32", "shape": shape, "data": b""}}
        cases[f"zero-byte $tensor attribute {shape}"] = (rebuild(body, blob), x, [])
    # 6. sizes and values from the inputs
    ones = np.ones((1, 1), np.float32)
    for op, data in (("Expand", ones), ("Tile", ones), ("Reshape", ones), ("ConstantOfShape", None)):
        nb = _sized_by_input(op, data=data)
        for size in ([2**40, 2**40], [-3, 2]):
            cases[f"{op} sized {size} by an input"] = (nb, {"s": np.array(size, np.int64)}, [])
    relu = _with_input_dtype(_arm(single_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})), "x", "unknown")
    cases["datetime64 feed for an input of dtype unknown"] = (relu, {"x": np.zeros((2, 3), "datetime64[s]")}, [])
    for case, equation in EQUATIONS.items():
        cases[f"fallback Einsum equation {case}"] = (einsum_file(equation), {"a": np.ones((2, 3), np.float32),
                                                                            "b": np.ones((3, 2), np.float32)}, [])
    return cases


@pytest.fixture(scope="module")
def attack_argv(tmp_path_factory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("attacks")
    with pytest.MonkeyPatch.context() as monkeypatch:
        cases = _attacks(tmp, monkeypatch)
    argv = {}
    for k, (name, (data, inputs, extra)) in enumerate(cases.items()):
        (tmp / f"{k}.nb").write_bytes(data)
        args = ["run", str(tmp / f"{k}.nb"), "--targets", "arm", *extra]
        for input_name, value in inputs.items():
            np.save(tmp / f"{k}-{input_name}.npy", value)
            args += ["--input", f"{input_name}={tmp / f'{k}-{input_name}.npy'}"]
        argv[name] = args
    return argv


@pytest.mark.skipif(not native.available(), reason=native.status())
@pytest.mark.parametrize("flags", [[], ["-O"]], ids=["python", "python-O"])
def test_every_attack_exits_2_in_one_line_through_optcli_run(attack_argv, flags):
    proc = subprocess.run([sys.executable, *flags, "-c", CHILD, json.dumps(attack_argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("optimize") == len(flags)
    assert set(results) == set(attack_argv) and len(results) == 28
    bad = {name: (code, err) for name, (code, err) in results.items()  # (every input is given: no usage error)
           if code != 2 or len(err.strip().splitlines()) != 1 or "please report" in err or "--input" in err}
    assert not bad, json.dumps(bad, indent=1)


# The tests of issue 23's attacks, run again with every assert of optcli removed (PYTHONOPTIMIZE
# reaches the interpreters they start too).  pytest still rewrites the tests' own asserts.
UNDER_O = [
    "tests/runtime/test_blocked_kernels_at_load.py",
    "tests/ops/test_index_checks.py",
    "tests/runtime/test_conv_geometry_at_load.py",
    "tests/runtime/test_input_driven_sizes.py",
    "tests/runtime/test_run_budget.py",
    "tests/runtime/test_error_classes.py::test_index_out_of_range_is_the_inputs_fault",
    "tests/nb/test_fuzz.py::test_inflated_and_inconsistent_fields",
    "tests/nb/test_fuzz.py::test_a_name_with_a_line_break_still_makes_a_one_line_message",
    "tests/reliability/test_no_code_from_files.py::test_a_fifo_planted_under_an_entry_name_neither_hangs_nor_survives",
    "tests/reliability/test_no_code_from_files.py::test_a_fifo_planted_as_the_tuning_entry_neither_hangs_nor_is_read",
    "tests/reliability/test_no_code_from_files.py::test_a_fifo_planted_as_a_program_entry_neither_hangs_nor_is_read",
    "tests/frontend/test_onnx_reader.py::test_model_local_functions_are_inlined_in_a_fresh_process",
]


@pytest.mark.skipif(not native.available(), reason=native.status())
def test_the_attack_tests_pass_under_python_O():
    env = {**os.environ, "PYTHONOPTIMIZE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                           "ignore::pytest.PytestConfigWarning", *UNDER_O], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout and "deselected" not in proc.stdout, \
        proc.stdout[-2000:]
