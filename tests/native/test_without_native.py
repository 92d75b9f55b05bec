"""Models run the same with the native library and without it (not built, or OPTCLI_NATIVE=0), a
`.nb` written where it was loaded runs where it is not, and ``threads=`` sizes its pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import optcli
from optcli import native
from optcli.zoo.models import build, sample_inputs
from tests.helpers import assert_close, run_ort
from tests.native.conftest import spy_native_function

ROOT = Path(__file__).resolve().parents[2]


PLAIN = ("choose_host_layout",)  # disabled: the plan without the channel-blocked layout


@pytest.fixture(scope="module", params=["blocked", "plain"])
def models(request):
    """(name, model, .nb bytes, feeds, onnxruntime's outputs) for small MobileNetV2 / EfficientNet-Lite0,
    planned with the channel-blocked host layout and without it."""
    out = []
    disabled = PLAIN if request.param == "plain" else ()
    for name, kw in (("mobilenet_v2", {"resolution": 64, "width": 0.5}), ("efficientnet_lite0", {"resolution": 64})):
        model = build(name, **kw)
        feeds = sample_inputs(model, seed=0)
        data = optcli.optimize(model=model, valid_targets="arm", disabled_passes=disabled).data
        out.append((name, model, data, feeds, run_ort(model, feeds)))
    return out


def _run(data: bytes, feeds: dict, **kw) -> list[np.ndarray]:
    return list(optcli.load(data, **kw).run(feeds).values())


def test_models_match_with_and_without_the_library(models, native_calls):
    for name, _, data, feeds, ref in models:
        with_lib = _run(data, feeds, threads=2)
        assert native_calls["depthwise"] + native_calls["blocked_depthwise"] > 0, "no native depthwise ran"
        with mock.patch.object(native.library, "_lib", None):
            without = _run(data, feeds, threads=2)
        for a, b, r in zip(with_lib, without, ref):
            assert_close(a, r, what=f"{name} native vs onnxruntime")
            assert_close(b, r, what=f"{name} numpy vs onnxruntime")


def test_threads_size_the_native_pool(models, native_lib, monkeypatch):
    """``optcli.load(threads=N)`` reaches the pool through threadpoolctl, and only during run()."""
    seen = []
    lib = native.library._lib

    def look():
        seen.append(lib.optcli_get_num_threads())

    for name in ("optcli_dwconv2d_f32", "optcli_dwconv2d_blocked_f32"):  # the depthwise convs of either layout
        spy_native_function(monkeypatch, name, look)
    _, _, data, feeds, _ = models[0]
    before = native.get_num_threads()
    for n in (1, 3):
        seen.clear()
        _run(data, feeds, threads=n)
        assert seen and set(seen) == {n}
        assert native.get_num_threads() == before


CHILD = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
    import optcli
    from optcli import native
    feeds = dict(np.load(sys.argv[2]))
    p = optcli.load(sys.argv[1], threads=2)
    first = p.run(feeds)
    p.run(feeds)  # a second run: the note is not repeated
    np.savez(sys.argv[3], **first)
    print(json.dumps({"available": native.available(), "status": native.status()}))
""")


def test_nb_runs_with_the_library_disabled(models, tmp_path, native_lib):
    """OPTCLI_NATIVE=0 in a fresh process: the numpy kernels run a `.nb` written with the library
    loaded, give onnxruntime's answer, and say once why."""
    _, model, data, feeds, ref = models[1]
    (tmp_path / "m.nb").write_bytes(data)
    np.savez(tmp_path / "in.npz", **feeds)
    env = {**os.environ, "OPTCLI_NATIVE": "0", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m.nb"), str(tmp_path / "in.npz"),
                          str(tmp_path / "out.npz")], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["available"] is False and "disabled by OPTCLI_NATIVE=0" in info["status"]
    notes = [line for line in res.stderr.splitlines() if "native host kernels" in line]
    assert len(notes) == 1, res.stderr
    got = np.load(tmp_path / "out.npz")
    for vi, r in zip(model.graph.output, ref):
        assert_close(got[vi.name], r, what="numpy kernels (OPTCLI_NATIVE=0) vs onnxruntime")


def test_status_names_the_library(native_lib):
    assert native.status().startswith("native host kernels: loaded ")
    assert native.library_path() is not None and native.library_path().name.startswith(native.LIB_PREFIX)


def test_the_library_handle_lives_in_one_module(native_lib):
    """Tests set the library aside with ``mock.patch.object(native.library, "_lib", None)``: no other
    module of optcli.native keeps a handle of its own that the patch would miss, and a wrapper
    called while the handle is aside does not reach the library."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(native.__path__):
        if not info.name.startswith("_"):  # not the built library itself
            module = importlib.import_module(f"optcli.native.{info.name}")
            assert info.name == "library" or not hasattr(module, "_lib"), info.name
    assert not hasattr(native, "_lib")
    with mock.patch.object(native.library, "_lib", None):
        assert not native.available()
        with pytest.raises(native.library.NativeError):  # a real check: under python -O too
            native.activation(np.ones(8, np.float32), "relu")
