"""``optcli.optimize``: one keyword per CompileOptions field (the dataclass is the one source of the
names and defaults), ``quant_model`` as ``opt --quant_model``, the first positional argument."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import onnx
import pytest

import optcli
import optcli.compiler
from optcli.cli import opt_main
from optcli.compile_options import CompileOptions
from optcli.zoo import build
from tests.helpers import run_cli

EXTRAS = {"quant_model", "progress"}  # optimize's own keywords: not CompileOptions fields


def signature_gaps(func, options_class) -> tuple[list[str], list[str], list[str]]:
    """(fields missing from ``func``'s keywords, keywords that are no field, fields whose default differs)."""
    params = {n: p for n, p in inspect.signature(func).parameters.items() if n not in EXTRAS}
    fields = {f.name: f for f in dataclasses.fields(options_class)}
    missing = [n for n in fields if n not in params]
    extra = [n for n in params if n not in fields]
    defaults = [n for n in fields if n in params and params[n].default != fields[n].default]
    return missing, extra, defaults


def test_optimize_takes_every_compile_options_field_with_its_default():
    """A CompileOptions field added without its keyword in optimize (or a default copied and then
    changed on one side) fails here."""
    assert signature_gaps(optcli.optimize, CompileOptions) == ([], [], [])
    assert optcli.compiler.CompileOptions is CompileOptions, "the compiler and optimize share one record"


def test_the_signature_check_sees_a_new_field():
    """The check above is not vacuous: a field optimize lacks is reported."""

    @dataclasses.dataclass
    class Grown(CompileOptions):
        new_flag: bool = False

    assert signature_gaps(optcli.optimize, Grown)[0] == ["new_flag"]


def test_only_model_file_is_positional_and_the_rest_keyword_only():
    params = list(inspect.signature(optcli.optimize).parameters.values())
    assert params[0].name == "model_file" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])


def test_the_docstring_describes_every_argument():
    doc = optcli.optimize.__doc__
    undocumented = [n for n in inspect.signature(optcli.optimize).parameters if f"{n}:" not in doc]
    assert not undocumented, f"optcli.optimize's docstring does not describe {undocumented}"


@pytest.fixture
def captured(monkeypatch):
    """What optimize hands compile_model, without compiling."""
    calls = []
    monkeypatch.setattr(optcli.compiler, "compile_model", lambda options, progress=None: calls.append(
        (options, progress)) or "result")
    return calls


def test_every_argument_reaches_compile_options(captured):
    """Each keyword lands in its own CompileOptions field (none dropped, none crossed)."""
    values = {f.name: object() for f in dataclasses.fields(CompileOptions)}
    progress = object()
    assert optcli.optimize(**values, progress=progress) == "result"
    options, got_progress = captured[0]
    assert isinstance(options, CompileOptions) and got_progress is progress
    crossed = [n for n, v in values.items() if getattr(options, n) is not v]
    assert not crossed, f"not passed through: {crossed}"


def test_defaults_are_compile_options_defaults(captured):
    optcli.optimize(model_file="m.onnx")
    assert captured[0][0] == CompileOptions(model_file="m.onnx")


@pytest.mark.parametrize("kwargs, quant_type", [
    ({"quant_model": True}, "QUANT_INT8"),
    ({"quant_model": True, "quant_type": "QUANT_INT16"}, "QUANT_INT16"),
    ({"quant_type": "QUANT_INT16"}, "QUANT_INT16"),
    ({}, None),
])
def test_quant_model_as_the_cli_maps_it(captured, kwargs, quant_type):
    optcli.optimize(model_file="m.onnx", **kwargs)
    assert captured[0][0].quant_type == quant_type


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "small.onnx"
    onnx.save(build("mobilenet_v2", resolution=32, width=0.25), path)
    return path


def test_quant_model_writes_what_opt_quant_model_writes(model_file, tmp_path, capsys):
    """optimize(model_file=..., quant_model=True) is `opt --quant_model`: the same bytes, weights int8."""
    result = optcli.optimize(model_file=model_file, quant_model=True)
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={model_file}", "--quant_model",
                                             f"--optimize_out={tmp_path}/q"], capsys)
    assert code == 0, err
    assert result.data == (tmp_path / "q.nb").read_bytes()
    plain = optcli.optimize(model_file=model_file)
    assert len(result.data) < len(plain.data) / 2, "QUANT_INT8 weights: the .nb shrinks about 4x"


def test_model_file_by_position(model_file):
    assert optcli.optimize(str(model_file)).data == optcli.optimize(model_file=model_file).data


def test_progress_gets_each_pass(model_file):
    records = []
    result = optcli.optimize(model_file, progress=records.append)
    assert [r["name"] for r in records] == [p["name"] for p in result.report["passes"]]


@pytest.mark.parametrize("args, message", [
    (("m.onnx", "arm"), "positional argument"),
    ((CompileOptions(model_file="m.onnx"),), "compile_model"),
    ((onnx.ModelProto(),), "model="),
])
def test_positional_mistakes_are_type_errors(captured, args, message):
    with pytest.raises(TypeError, match=message):
        optcli.optimize(*args)
    assert not captured


def test_optimize_result_runs(model_file):
    result = optcli.optimize(model_file, valid_targets=["arm"], input_shapes={"input": [1, 3, 32, 32]})
    x = np.zeros((1, 3, 32, 32), np.float32)
    assert optcli.load(result.data).run({"input": x})["output"].shape[0] == 1
