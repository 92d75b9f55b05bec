"""The fast call path into the native library (optcli/native/fastcall.c, ``library.function``).

Every kernel test under tests/native already calls through it; these check what those cannot: that
it is there where it can be built, that each invoker hands the arguments over in the order its
signature names, that bad arguments are refused rather than read, and that the ctypes fallback (a
Python without its headers) computes the same."""

from __future__ import annotations

import ctypes
import os
import re
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from optcli import native
from optcli.native import library

SOURCE = Path(library.__file__).with_name("fastcall.c")
_PROTO_TYPES = {"p": "vp", "q": "i64", "i": "int", "f": "float"}
_ARG_MACROS = {"p": "P", "q": "Q", "i": "I", "f": "F"}


def _invokers() -> list[tuple[str, list[str], list[str]]]:
    """(signature, prototype types, argument macros) of each INVOKER in fastcall.c."""
    text = re.sub(r"\s+", " ", SOURCE.read_text())
    found = []
    for sig, proto, args in re.findall(r"INVOKER\((\w+), \(([^)]*)\), ((?:[PQIF]\(\d+\),? ?)+)\)", text):
        found.append((sig, [t.strip() for t in proto.split(",")], re.findall(r"[PQIF]\(\d+\)", args)))
    return found


def test_fast_path_is_built_where_it_can_be():
    """Where Python's headers exist and a compiler built the library, setup.py built _fastcall too;
    CI (OPTCLI_REQUIRE_NATIVE=1) fails rather than quietly calling through ctypes."""
    if library._lib is None:
        pytest.skip(native.status())
    headers = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    if library._fastcall is None:
        if os.environ.get("OPTCLI_REQUIRE_NATIVE") == "1" and headers:
            pytest.fail(f"Python.h is here but {library.fastcall_status()}")
        pytest.skip(library.fastcall_status())
    assert "_fastcall" in native.status()
    assert type(library.function("optcli_fc_rows_f32")).__name__ == "Caller"


def test_each_invoker_passes_its_arguments_in_signature_order():
    """A typo in an INVOKER line (F(8) for F(9), int for int64_t) would hand a kernel the wrong
    value: read every line and hold it to its signature."""
    invokers = _invokers()
    assert len(invokers) >= 15, "the INVOKER lines were not found: the pattern no longer reads fastcall.c"
    for sig, proto, args in invokers:
        assert proto == [_PROTO_TYPES[c] for c in sig], (sig, proto)
        assert args == [f"{_ARG_MACROS[c]}({k})" for k, c in enumerate(sig)], (sig, args)
    table = set(re.findall(r"ROW\((\w+)\),", SOURCE.read_text()))  # the INVOKERS rows, not the macro's definition
    assert table == {sig for sig, _, _ in invokers}


def test_every_kernel_signature_has_an_invoker():
    """The kernels' entry points (not the tests-only and pool functions) all take the fast path."""
    if library._fastcall is None:
        pytest.skip(library.fastcall_status())
    fast = library._fastcall.signatures()
    for name, (args, res) in library._SIGNATURES.items():
        if res is not ctypes.c_int or len(args) < 3:
            continue
        sig = "".join(library._LETTERS[t] for t in args)
        assert sig in fast, f"{name} ({sig}) has no invoker in fastcall.c"


def _fc_case():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    w = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal(29).astype(np.float32)
    return x, w, b


@pytest.fixture
def lib():
    if library._lib is None:
        pytest.skip(native.status())
    return library


def test_fast_and_ctypes_paths_agree(lib, monkeypatch):
    """The same kernels through _fastcall and through the ctypes fallback give the same bits: a
    leaky ReLU (two floats after an int: alpha must land as alpha) and a few-row FC."""
    x, w, b = _fc_case()

    def run():
        y = np.empty((3, 29), np.float32)
        rc = lib.function("optcli_fc_rows_f32")(x, w, b, y, 3, 37, 29, 0, 0.0, 0.0)
        z = np.empty_like(y)
        rc2 = lib.function("optcli_activation_f32")(y, z, y.size, native.ACTIVATION_CODES["leaky_relu"], 0.25, 0.0)
        return rc, rc2, y, z

    rc, rc2, y_fast, z_fast = run()
    assert rc == rc2 == 0
    np.testing.assert_allclose(y_fast, x @ w + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(z_fast, np.where(y_fast < 0, np.float32(0.25) * y_fast, y_fast))
    monkeypatch.setattr(library, "_fastcall", None)
    monkeypatch.setattr(library, "_FUNCTIONS", {})
    assert type(lib.function("optcli_fc_rows_f32")).__name__ == "function"
    _, _, y_slow, z_slow = run()
    np.testing.assert_array_equal(y_slow, y_fast)
    np.testing.assert_array_equal(z_slow, z_fast)


@pytest.mark.parametrize("fast", [True, False], ids=["fastcall", "ctypes"])
def test_bad_arguments_are_refused_not_read(lib, monkeypatch, fast):
    """A non-contiguous array would have its first element's address passed and the kernel read the
    wrong elements: both paths refuse it, and a wrong count or type of argument; the fast path also a
    value a C int cannot hold."""
    if fast and library._fastcall is None:
        pytest.skip(library.fastcall_status())
    if not fast:
        monkeypatch.setattr(library, "_fastcall", None)
    monkeypatch.setattr(library, "_FUNCTIONS", {})
    x, w, b = _fc_case()
    y = np.empty((3, 29), np.float32)
    fc = lib.function("optcli_fc_rows_f32")
    with pytest.raises(TypeError, match="C-contiguous"):
        fc(np.asfortranarray(x), w, b, y, 3, 37, 29, 0, 0.0, 0.0)
    with pytest.raises(TypeError):
        fc(x, w, b, y, 3, 37, 29, 0, 0.0)
    if fast:  # (ctypes truncates an int silently: the wrappers check their values before the call)
        with pytest.raises(OverflowError):
            fc(x, w, b, y, 3, 37, 29, 1 << 40, 0.0, 0.0)
    with pytest.raises((TypeError, ctypes.ArgumentError)):
        fc(x, w, b, y, 3.5, 37, 29, 0, 0.0, 0.0)


def test_none_and_addresses_are_pointers(lib):
    """None is NULL (no bias), an int an address the wrapper worked out (an offset into a buffer)."""
    x, w, _ = _fc_case()
    y = np.zeros((4, 29), np.float32)
    fc = lib.function("optcli_fc_rows_f32")
    # rows 1..3 of y through an address past row 0, no bias
    assert fc(x, w, None, y.ctypes.data + 4 * 29, 3, 37, 29, 0, 0.0, 0.0) == 0
    np.testing.assert_array_equal(y[0], 0)
    np.testing.assert_allclose(y[1:], x @ w, rtol=1e-5, atol=1e-5)


def test_a_caller_refuses_an_unknown_signature():
    if library._fastcall is None:
        pytest.skip(library.fastcall_status())
    addr = ctypes.cast(library._lib.optcli_fc_rows_f32, ctypes.c_void_p).value
    with pytest.raises(ValueError, match="no invoker"):
        library._fastcall.Caller(addr, "pppz")
    with pytest.raises(ValueError):
        library._fastcall.Caller(0, "ppq")
