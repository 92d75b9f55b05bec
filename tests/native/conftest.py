"""Native kernel tests skip (with the reason) where the library was not built, unless
``OPTCLI_REQUIRE_NATIVE=1`` (CI with a compiler) makes that a failure."""

from __future__ import annotations

import os

import pytest

from optcli import native


@pytest.fixture
def native_lib():
    """The loaded library; skips, or fails under OPTCLI_REQUIRE_NATIVE=1, where there is none."""
    if not native.available():
        if os.environ.get("OPTCLI_REQUIRE_NATIVE") == "1":
            pytest.fail(f"OPTCLI_REQUIRE_NATIVE=1 but {native.status()}")
        pytest.skip(native.status())
    return native


def _counted(calls: dict[str, int], key: str, fn):
    def wrapper(*args, **kwargs):
        calls[key] += 1
        return fn(*args, **kwargs)

    return wrapper


@pytest.fixture
def native_calls(native_lib, monkeypatch):
    """Counts calls into the native depthwise, epilogue and GEMMs, to prove a test ran them."""
    calls = {}
    for key, name in (("depthwise", "depthwise_conv2d"), ("epilogue", "bias_activation_"), ("gemm", "gemm_conv"),
                      ("conv_gemm", "conv2d_gemm")):
        calls[key] = 0
        monkeypatch.setattr(native, name, _counted(calls, key, getattr(native, name)))
    return calls
