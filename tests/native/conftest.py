"""Native kernel tests skip (with the reason) where the library was not built, unless
``OPTCLI_REQUIRE_NATIVE=1`` (CI with a compiler) makes that a failure."""

from __future__ import annotations

import os

import pytest

from optcli import native


@pytest.fixture
def native_lib():
    """The loaded library's module (optcli.native.library: ``_lib``, the thread calls); skips, or
    fails under OPTCLI_REQUIRE_NATIVE=1, where there is no library."""
    if not native.available():
        if os.environ.get("OPTCLI_REQUIRE_NATIVE") == "1":
            pytest.fail(f"OPTCLI_REQUIRE_NATIVE=1 but {native.status()}")
        pytest.skip(native.status())
    return native.library


def spy_native_function(monkeypatch, name: str, before=None) -> list:
    """The arguments of every call of the library's C function ``name`` made through
    ``library.function`` (how the wrappers call it) from now on, ``before()`` run ahead of each;
    steps prepared earlier keep the function they were given."""
    from optcli.native import library

    calls, real = [], library.function

    def function(wanted: str):
        fn = real(wanted)
        if wanted != name:
            return fn

        def spy(*args):
            calls.append(args)
            if before is not None:
                before()
            return fn(*args)

        return spy

    monkeypatch.setattr(library, "function", function)
    return calls


def _counted(calls: dict[str, int], key: str, fn):
    def wrapper(*args, **kwargs):
        calls[key] += 1
        return fn(*args, **kwargs)

    return wrapper


@pytest.fixture
def native_calls(native_lib, monkeypatch):
    """Counts calls into the native depthwise, epilogue, GEMMs and stem conv, and into the makers of the
    blocked layout's native calls (one per step and input shape), to prove a test ran them."""
    from optcli.native import blocked_conv, blocked_window

    calls = {}
    for key, module, name in (("depthwise", native, "depthwise_conv2d"), ("epilogue", native, "bias_activation_"),
                              ("gemm", native, "gemm_conv"), ("conv_gemm", native, "conv2d_gemm"),
                              ("stem", native, "stem_conv2d"),
                              ("blocked_conv", blocked_conv, "prepared_conv2d_blocked"),
                              ("blocked_depthwise", blocked_window, "prepared_depthwise_conv2d_blocked")):
        calls[key] = 0
        monkeypatch.setattr(module, name, _counted(calls, key, getattr(module, name)))
    return calls


@pytest.fixture(params=[4, 8, 16], ids=["4-lane", "8-lane", "16-lane"])
def lanes(request, native_lib):
    """Each vector width of the GEMM this CPU can run (16: x86-64 with AVX-512); the stem conv
    follows the GEMM's."""
    got = native_lib._lib.optcli_gemm_variant(request.param)
    if got != request.param:
        pytest.skip(f"no {request.param}-lane GEMM on this CPU")
    yield got
    native_lib._lib.optcli_gemm_variant(0)


@pytest.fixture(params=[1, 2], ids=["t1", "t2"])
def pool_threads(request, native_lib):
    """The native pool at 1 and 2 threads (its size restored after)."""
    old = native.set_num_threads(request.param)
    yield request.param
    native.set_num_threads(old)
