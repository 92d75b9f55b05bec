"""The Paddle Lite facade (optcli.runtime.paddle_api): a script written against Paddle Lite's Python
API runs with only its import line changed, and each call does what Paddle Lite documents, with
optcli's errors where Paddle Lite aborts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optcli
from optcli.errors import InputError, UsageError
from optcli.runtime import paddle_api
from optcli.runtime.paddle_api import MobileConfig, PowerMode, create_paddle_predictor
from tests.helpers import single_node_model

ROOT = Path(__file__).resolve().parents[2]

# Written against Paddle Lite's Python API documents (MobileConfig, PowerMode, LightPredictor,
# Tensor: https://paddlepaddle.org.cn/lite/develop/api_reference/python_api_doc.html): the light
# API's workflow, from a file and from a buffer, by index and by name, numpy and float lists.
PADDLE_SCRIPT = '''\
from paddlelite.lite import *
import sys
import numpy as np

model_path, input_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
x = np.load(input_path)

# 1. the config: model file, threads, power mode
config = MobileConfig()
config.set_model_from_file(model_path)
config.set_threads(2)
config.set_power_mode(PowerMode.LITE_POWER_NO_BIND)
print("threads", config.threads(), "power mode", config.power_mode())

# 2. the predictor
predictor = create_paddle_predictor(config)
print(predictor.get_version(), predictor.get_input_names(), predictor.get_output_names())

# 3. the input, from numpy
input_tensor = predictor.get_input(0)
input_tensor.from_numpy(x)
print("input shape", input_tensor.shape())

# 4. run
predictor.run()

# 5. the output, to numpy
output_tensor = predictor.get_output(0)
output_data = output_tensor.numpy()
print("output shape", output_tensor.shape())
np.save(out_dir + "/from_file.npy", output_data)

# The same model from memory, its tensors by name, the data as lists of floats
with open(model_path, "rb") as f:
    model_buffer = f.read()
config = MobileConfig()
config.set_model_from_buffer(model_buffer)
config.set_power_mode(PowerMode.LITE_POWER_HIGH)
predictor = create_paddle_predictor(config)
input_tensor = predictor.get_input_by_name(predictor.get_input_names()[0])
input_tensor.resize([1, 3, 32, 32])
input_tensor.set_float_data(x.flatten().tolist())
predictor.run()
output_tensor = predictor.get_output_by_name(predictor.get_output_names()[0])
np.save(out_dir + "/from_buffer.npy", np.array(output_tensor.float_data()).reshape(output_tensor.shape()))
'''


def test_a_paddle_lite_script_runs_with_only_its_import_changed(small_nb, small_cnn, tmp_path):
    """The script above, ``from paddlelite.lite import *`` replaced by ``from optcli import *`` and
    nothing else, in a fresh process: its outputs are optcli.load's."""
    script = PADDLE_SCRIPT.replace("from paddlelite.lite import *", "from optcli import *")
    changed = [a for a, b in zip(PADDLE_SCRIPT.splitlines(), script.splitlines()) if a != b]
    assert changed == ["from paddlelite.lite import *"]
    (tmp_path / "script.py").write_text(script)
    x = small_cnn[2]["input"]
    np.save(tmp_path / "x.npy", x)
    out = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(small_nb), str(tmp_path / "x.npy"),
                          str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), CI="true"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "threads 2 power mode PowerMode.LITE_POWER_NO_BIND" in out.stdout
    assert "['input'] ['output']" in out.stdout and "input shape [1, 3, 32, 32]" in out.stdout
    expected = optcli.load(small_nb).run({"input": x})["output"]
    assert f"output shape {list(expected.shape)}" in out.stdout
    for name in ("from_file", "from_buffer"):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), expected, rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_star_import_gives_paddle_lite_names():
    namespace: dict = {}
    exec("from optcli import *", namespace)
    assert namespace["MobileConfig"] is MobileConfig and namespace["PowerMode"] is PowerMode
    assert namespace["create_paddle_predictor"] is create_paddle_predictor
    assert optcli.LightPredictor is optcli.PaddlePredictor and optcli.Tensor is paddle_api.Tensor


def test_power_modes_are_paddle_lites():
    """Names and values of Paddle Lite's lite_api::PowerMode (paddle_place.h)."""
    assert {m.name: int(m) for m in PowerMode} == {
        "LITE_POWER_HIGH": 0, "LITE_POWER_LOW": 1, "LITE_POWER_FULL": 2, "LITE_POWER_NO_BIND": 3,
        "LITE_POWER_RAND_HIGH": 4, "LITE_POWER_RAND_LOW": 5}


def _predictor(source, **settings) -> paddle_api.PaddlePredictor:
    config = MobileConfig()
    if isinstance(source, bytes):
        config.set_model_from_buffer(source)
    else:
        config.set_model_from_file(source)
    for key, value in settings.items():
        getattr(config, f"set_{key}")(value)
    return create_paddle_predictor(config)


@pytest.mark.parametrize("mode, threads, expected", [
    (PowerMode.LITE_POWER_HIGH, 4, 4),
    (PowerMode.LITE_POWER_FULL, 4, 4),
    (PowerMode.LITE_POWER_NO_BIND, 4, 4),
    (PowerMode.LITE_POWER_RAND_HIGH, 4, 4),
    (PowerMode.LITE_POWER_LOW, 4, 1),
    (PowerMode.LITE_POWER_RAND_LOW, 4, 1),
    (PowerMode.LITE_POWER_HIGH, 64, 8),  # Paddle Lite caps threads at the cores there are
    (3, 2, 2),  # a plain int is Paddle Lite's value
])
def test_power_mode_sets_the_threads_a_run_uses(small_nb, monkeypatch, mode, threads, expected):
    monkeypatch.setattr(paddle_api, "_usable_cpus", lambda: 8)
    p = _predictor(small_nb, threads=threads, power_mode=mode)
    assert p._predictor.threads == expected


def test_defaults_are_paddle_lites(small_nb):
    """One thread and LITE_POWER_HIGH unless told otherwise, as Paddle Lite's MobileConfig."""
    config = MobileConfig()
    assert config.threads() == 1 and config.power_mode() is PowerMode.LITE_POWER_HIGH
    assert config.model_dir() == "" and not config.is_model_from_memory()
    config.set_model_from_file(small_nb)
    assert create_paddle_predictor(config)._predictor.threads == 1


def test_file_and_buffer_load_the_same_model(small_nb, small_cnn):
    x = small_cnn[2]["input"]
    results = []
    for source in (small_nb, small_nb.read_bytes()):
        p = _predictor(source)
        p.get_input(0).from_numpy(x)
        p.run()
        results.append(p.get_output(0).numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], optcli.load(small_nb, threads=1).run(small_cnn[2])["output"])


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """y = a - b: by-name and by-index lookups must not swap the operands."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = single_node_model("Sub", {"a": a, "b": a})
    path = tmp_path_factory.mktemp("sub") / "sub.nb"
    path.write_bytes(optcli.optimize(model=model).data)
    return path


def test_inputs_by_name_and_by_index_are_the_same_tensors(two_inputs):
    p = _predictor(two_inputs)
    assert p.get_input_names() == ["a", "b"] and p.get_output_names() == ["y0"]
    assert p.get_input_by_name("b") is p.get_input(1) and p.get_output_by_name("y0") is p.get_output(0)
    a, b = np.full((2, 3), 5, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    p.get_input_by_name("b").from_numpy(b)
    p.get_input(0).from_numpy(a)
    out = p.get_output(0)  # a handle taken before run() sees its results
    p.run()
    np.testing.assert_array_equal(out.numpy(), a - b)
    assert out.shape() == [2, 3] and out.float_data() == (a - b).ravel().tolist()


def test_from_numpy_copies(two_inputs):
    """Paddle Lite copies the array into the tensor: changing it afterwards changes nothing."""
    p = _predictor(two_inputs)
    a = np.ones((2, 3), np.float32)
    p.get_input(0).from_numpy(a)
    p.get_input(1).from_numpy(np.zeros((2, 3), np.float32))
    a[...] = 7
    p.run()
    np.testing.assert_array_equal(p.get_output(0).numpy(), np.ones((2, 3), np.float32))


def test_shape_before_and_after_data(two_inputs):
    p = _predictor(two_inputs)
    t = p.get_input(0)
    assert t.shape() == [2, 3], "before any data: the model's declared shape"
    t.resize([2, 3])
    t.set_float_data([1.0] * 6)
    assert t.shape() == [2, 3] and t.numpy().dtype == np.float32
    t.resize([3, 2])
    assert t.shape() == [3, 2]
    with pytest.raises(UsageError, match="holds no data"):
        t.numpy()  # resized to other dims: the old data is gone


@pytest.mark.parametrize("call, error, message", [
    (lambda p: p.get_input(2), InputError, r"input index 2 is out of range: the model has 2 inputs \(0 to 1\): a, b"),
    (lambda p: p.get_input(-1), InputError, "input index -1 is out of range"),
    (lambda p: p.get_output(1), InputError, r"output index 1 is out of range: the model has 1 output \(0 to 0\)"),
    (lambda p: p.get_input("a"), InputError, r"takes an index; by name: get_input_by_name\('a'\)"),
    (lambda p: p.get_input_by_name("c"), InputError, "no input named 'c'; its inputs are: a, b"),
    (lambda p: p.get_output_by_name("a"), InputError, "no output named 'a'; its outputs are: y0"),
    (lambda p: p.run(), InputError, "inputs without data: a, b"),
    (lambda p: p.get_output(0).numpy(), UsageError, "call run"),
    (lambda p: p.get_input(0).numpy(), UsageError, "call from_numpy"),
    (lambda p: p.get_output(0).from_numpy(np.zeros(1)), UsageError, "is an output"),
    (lambda p: p.get_output(0).resize([1]), UsageError, "is an output"),
    (lambda p: p.get_input(0).set_float_data([1.0]), UsageError, "resize"),
    (lambda p: (p.get_input(0).resize([2, 3]), p.get_input(0).set_float_data([1.0] * 5)), InputError,
     r"resized to \[2, 3\] \(6 values\), got 5"),
    (lambda p: p.get_input(0).resize([-1, 3]), UsageError, "negative"),
    (lambda p: p.get_input(0).set_lod([[0, 2]]), UsageError, "no LoD"),
])
def test_misuse_is_a_clear_error(two_inputs, call, error, message):
    with pytest.raises(error, match=message):
        call(_predictor(two_inputs))


def test_int_data_of_a_float_tensor_is_refused(two_inputs):
    p = _predictor(two_inputs)
    p.get_input(0).from_numpy(np.zeros((2, 3), np.float32))
    with pytest.raises(UsageError, match="holds float32, not int32; use numpy"):
        p.get_input(0).int32_data()
    assert p.get_input(0).lod() == []
    p.get_input(0).set_lod([])  # no LoD is fine


@pytest.mark.parametrize("call, message", [
    (lambda c: c.set_threads(0), "positive whole number"),
    (lambda c: c.set_power_mode(6), r"PowerMode\.LITE_POWER_HIGH.*got 6"),
    (lambda c: c.set_model_from_buffer("not bytes"), "bytes"),
    (lambda c: c.set_model_dir("model_dir"), "set_model_from_file"),
    (lambda c: c.set_model_buffer(b"model", b"params"), "set_model_from_buffer"),
    (lambda c: create_paddle_predictor(c), "no model"),
    (lambda c: create_paddle_predictor("config"), "takes a MobileConfig"),
])
def test_config_misuse_is_a_usage_error(call, message):
    with pytest.raises(UsageError, match=message):
        call(MobileConfig())


def test_the_last_model_given_wins(small_nb, two_inputs):
    config = MobileConfig()
    config.set_model_from_buffer(small_nb.read_bytes())
    config.set_model_from_file(two_inputs)
    assert not config.is_model_from_memory()
    assert create_paddle_predictor(config).get_input_names() == ["a", "b"]
