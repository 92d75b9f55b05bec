"""Which block width the host's blocked regions run with (ops/blocked.py ``block_width``): the
library's vector width where its blocked kernels pay (4 on aarch64, 16 with AVX-512), 1 with AVX2's
8, where the plain kernels on views measured 1.3-2.6x faster; ``OPTCLI_HOST_BLOCKED`` overrides."""

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


@pytest.mark.parametrize("width, want", [(4, 4), (8, 1), (16, 16)])
def test_the_default_follows_the_measured_widths(library, width, want):
    library(width)
    assert blocked.block_width() == want


@pytest.mark.parametrize("value, want", [("1", 8), ("on", 8), ("0", 1), ("off", 1), ("", 1), ("bogus", 1)])
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
