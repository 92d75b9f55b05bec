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


@pytest.fixture
def native_calls(native_lib, monkeypatch):
    """Counts calls into the native depthwise and epilogue, to prove a test ran them."""
    calls = {"depthwise": 0, "epilogue": 0}
    dw, ep = native.depthwise_conv2d, native.bias_activation_

    def depthwise(*args, **kwargs):
        calls["depthwise"] += 1
        return dw(*args, **kwargs)

    def epilogue(*args, **kwargs):
        calls["epilogue"] += 1
        return ep(*args, **kwargs)

    monkeypatch.setattr(native, "depthwise_conv2d", depthwise)
    monkeypatch.setattr(native, "bias_activation_", epilogue)
    return calls
