"""Shared fixtures: small models, compiled once per session."""

from __future__ import annotations

import pytest

import optcli
from optcli.zoo import build, sample_inputs


@pytest.fixture(scope="session")
def small_cnn():
    """(model, compiled result, feeds) for a small MobileNetV2-like net."""
    model = build("mobilenet_v2", resolution=32, width=0.25)
    return model, optcli.optimize(model=model), sample_inputs(model)


@pytest.fixture(scope="session")
def small_nb(small_cnn, tmp_path_factory):
    path = tmp_path_factory.mktemp("nb") / "small.nb"
    path.write_bytes(small_cnn[1].data)
    return path
