"""One activation table (optcli/activation_codes.py): the numpy kernels, the GPU dialect, the native
wrappers and the C enum of the host kernels all use the same names and codes."""

from __future__ import annotations

import re
from pathlib import Path

from optcli import activation_codes, native
from optcli.gpu import registry
from optcli.ops import activation

ROOT = Path(__file__).resolve().parents[1]
SIMD_H = ROOT / "kernels" / "host" / "simd.h"


def _c_enum() -> dict[str, int]:
    """The ACT_* enum of simd.h, parsed: name -> value (implicit values count up from the last)."""
    text = SIMD_H.read_text()
    body = re.search(r"enum\s*\{([^}]*ACT_NONE[^}]*)\}", text)
    assert body is not None, f"no ACT_ enum in {SIMD_H}"
    codes, nxt = {}, 0
    for item in body.group(1).split(","):
        item = re.sub(r"/\*.*?\*/", "", item).strip()
        if not item:
            continue
        name, _, value = (part.strip() for part in item.partition("="))
        nxt = int(value) if value else nxt
        codes[name] = nxt
        nxt += 1
    return codes


def test_the_c_enum_matches_the_table():
    enum = _c_enum()
    want = {"ACT_NONE": 0, **{f"ACT_{name.upper()}": code for name, code in activation_codes.ACTIVATION_CODES.items()
                              if name is not None}}
    assert {k: v for k, v in enum.items() if k != "ACT_COUNT"} == want
    assert enum["ACT_COUNT"] == len(activation_codes.ACTIVATION_CODES)


def test_every_user_holds_the_one_table():
    """No module keeps a table of its own: the GPU kernels' defines and the native wrappers' codes are
    the table's."""
    assert native.ACTIVATION_CODES is activation_codes.ACTIVATION_CODES
    assert registry.ACTIVATION_CODES is activation_codes.ACTIVATION_CODES
    assert registry.epilogue_defines({"activation": "hard_swish"})["ACTIVATION"] == \
        activation_codes.ACTIVATION_CODES["hard_swish"]


def test_every_activation_has_a_numpy_reference():
    import numpy as np

    x = np.linspace(-3, 3, 13, dtype=np.float32)
    for name in activation_codes.ACTIVATIONS:
        y = activation.apply_activation(x.copy(), name, 0.1 if name != "clip" else -1.0, 0.5 if name != "clip"
                                        else 1.0)
        assert y.shape == x.shape and np.isfinite(y).all(), name
