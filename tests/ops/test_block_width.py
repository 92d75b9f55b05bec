"""Which block width the host's blocked regions run with (ops/blocked.py ``block_width``): the
library's vector width where its blocked kernels pay (4 on aarch64, 8 with AVX2, 16 with AVX-512);
``OPTCLI_HOST_BLOCKED`` overrides.  At 8 the dense convs with a spatial window and output rows
narrower than ``DIRECT_MIN_COLUMNS`` run as the NCHW kernels between two conversions
(``DENSE_THROUGH_NCHW``)."""

from __future__ import annotations

import pytest

from optcli.ops import blocked


@pytest.fixture
def library(monkeypatch):
    """A library whose blocked kernels exist and whose vector width the test sets."""
    monkeypatch.setattr(blocked, "_native_blocked", lambda: (object(), object()))
    monkeypatch.delenv("OPTCLI_HOST_BLOCKED", raising=False)

    def width(w):
        monkeypatch.setattr(blocked.native, "vector_width", lambda: w)

    return width


@pytest.mark.parametrize("width, want", [(4, 4), (8, 8), (16, 16), (2, 1)])
def test_the_default_follows_the_measured_widths(library, width, want):
    library(width)
    assert blocked.block_width() == want


@pytest.mark.parametrize("value, want", [("1", 8), ("on", 8), ("0", 1), ("off", 1), ("", 8), ("bogus", 8)])
def test_the_environment_forces_either_way(library, monkeypatch, value, want):
    library(8)
    monkeypatch.setenv("OPTCLI_HOST_BLOCKED", value)
    assert blocked.block_width() == want


def test_forcing_off_wins_over_a_fast_width(library, monkeypatch):
    library(16)
    monkeypatch.setenv("OPTCLI_HOST_BLOCKED", "0")
    assert blocked.block_width() == 1


def test_without_the_library_it_is_one(monkeypatch):
    monkeypatch.setattr(blocked, "_native_blocked", lambda: None)
    monkeypatch.setenv("OPTCLI_HOST_BLOCKED", "1")
    assert blocked.block_width() == 1


@pytest.mark.parametrize("width, narrow", [(11, True), (blocked.DIRECT_MIN_COLUMNS, False)])
def test_dense_spatial_convs_on_narrow_rows_run_through_nchw_at_width_8(monkeypatch, width, narrow):
    """At B = 8 a blocked region's 3x3 dense conv with output rows narrower than DIRECT_MIN_COLUMNS
    runs the NCHW kernel between two conversions (there the blocked tile's edge and remainder tiles
    lose to the implicit GEMM on AVX2); on wider rows, its 1x1 and depthwise convs and at the other
    widths the blocked kernels run.  The results are the NCHW conv's either way."""
    import numpy as np

    from optcli import native
    from optcli.ops import conv
    from optcli.ops.registry import StepAttrs

    if not native.available() or blocked._native_blocked() is None:
        pytest.skip("needs the native library's blocked kernels")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 9, width)).astype(np.float32)
    calls = []
    real = blocked._conv_plain
    monkeypatch.setattr(blocked, "_conv_plain", lambda i, a: calls.append(i[1].shape) or real(i, a))
    for block in (4, 8):
        for ws, attrs in (((24, 16, 3, 3), {"pads": [1, 1, 1, 1]}), ((24, 16, 1, 1), {}),
                          ((16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16})):
            w = rng.standard_normal(ws).astype(np.float32)
            full = StepAttrs({"kernel_shape": list(ws[2:]), **attrs})
            calls.clear()
            y = blocked.conv_blocked([blocked.to_blocked(x, block), w, None], full)[0]
            want = conv.conv_im2col([x, w, None], dict(full))[0]
            np.testing.assert_allclose(blocked.from_blocked(y, ws[0]), want, rtol=1e-4, atol=1e-4)
            through_nchw = block in blocked.DENSE_THROUGH_NCHW and ws[2:] == (3, 3) and ws[1] > 1 and narrow
            assert bool(calls) == through_nchw, (block, ws)

