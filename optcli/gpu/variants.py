"""Every kernel program the GPU launch functions can emit, as (source, defines) pairs.

A GPU target compiles one program per (kernel source, defines): the launch functions in
``ops_*`` pick the source and the defines (fused epilogue, unary / binary op, pooling mode), and
the runtime adds the precision (``STORAGE_HALF``).  This module lists the define domains each
source can get, from the same code tables the launch functions use, so that a Metal library
cache can be warmed ahead of time and the tests can compile every variant for every language.

Float defines (``ACT_ALPHA`` / ``ACT_BETA``, the fused FakeQuant's ``FQ_*``) take any value at
run time; they are enumerated with representative values (one set with infinite Clip bounds,
which render as ``INFINITY``).
``tests/metal/test_variants.py`` walks the registry over representative nodes and checks that
every launch it sees falls inside this enumeration, so a new define cannot go unlisted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from importlib import resources

from optcli.gpu.dialect import ACTIVATION_CODES, kernel_params, load_source

# (ACTIVATION name, ACT_ALPHA, ACT_BETA): every fused epilogue, Clip also with open bounds.
_EPILOGUE_SAMPLES = [(None, 0.0, 0.0), ("relu", 0.0, 0.0), ("clip", 0.0, 6.0), ("clip", float("-inf"), float("inf")),
                     ("leaky_relu", 0.1, 0.0), ("sigmoid", 0.0, 0.0), ("tanh", 0.0, 0.0), ("hard_sigmoid", 0.2, 0.5),
                     ("hard_swish", 0.0, 0.0), ("swish", 0.0, 0.0)]

# Sources whose launches carry the fused-epilogue defines for every activation.
_EPILOGUE_SOURCES = ("conv.cl", "winograd.cl", "gemm.cl")


# A FakeQuant fused after any of them (quantized models): a switch, and four float defines.
_FAKE_QUANT_SAMPLE = {"FAKE_QUANT": 1, "FQ_SCALE": 0.05, "FQ_ZERO_POINT": 3.0, "FQ_QMIN": 0.0, "FQ_QMAX": 255.0}


def epilogue_variants(with_none: bool = True, fake_quant: bool = True) -> list[dict]:
    plain = [{"ACTIVATION": ACTIVATION_CODES[name], "ACT_ALPHA": alpha, "ACT_BETA": beta}
             for name, alpha, beta in _EPILOGUE_SAMPLES if with_none or name is not None]
    return plain + ([{**e, **_FAKE_QUANT_SAMPLE} for e in plain] if fake_quant else [])


def _elementwise_variants() -> list[dict]:
    from optcli.gpu.ops_elementwise import _EPILOGUE_OPS, BINARY_CODES, UNARY_CODES

    out: list[dict] = [{"UNARY_OP": code} for code in sorted(UNARY_CODES.values())]
    # stand-alone activations: map4 with the identity unary op and the activation as epilogue
    out += [{"UNARY_OP": 0, **e} for e in epilogue_variants(with_none=False, fake_quant=False)]
    for op, code in sorted(BINARY_CODES.items(), key=lambda kv: kv[1]):
        if op in _EPILOGUE_OPS:
            out += [{"BINARY_OP": code, **e} for e in epilogue_variants()]
        else:
            out.append({"BINARY_OP": code})
    return out


def source_names() -> list[str]:
    """Every kernel source of the library."""
    return sorted(p.name for p in resources.files("optcli.kernels").iterdir() if p.name.endswith(".cl"))


def program_variants() -> Iterator[tuple[str, dict]]:
    """(source, defines) of every program the launch functions can emit, precision excluded."""
    for source in source_names():
        if source in _EPILOGUE_SOURCES:
            variants = epilogue_variants()
        elif source == "elementwise.cl":
            variants = _elementwise_variants()
        elif source == "pool.cl":
            variants = [{"POOL_MAX": 0}, {"POOL_MAX": 1}, {"POOL_MAX": 0, **_FAKE_QUANT_SAMPLE}]
        else:
            variants = [{}]
        for defines in variants:
            yield source, defines


def define_keys(source: str) -> set[str]:
    """The defines a source reads in ``#if`` / ``#ifndef`` lines (the epilogue's included)."""
    from optcli.gpu.dialect import EPILOGUE

    text = load_source(source) + EPILOGUE
    names = set(re.findall(r"#\s*(?:el)?if(?:n?def)?\s+!?\s*(\w+)", text))
    return names


@cache
def kernel_entries() -> dict[str, list[str]]:
    """source -> the kernel entries it declares."""
    return {s: list(kernel_params(load_source(s))) for s in source_names()}


_SYNC = re.compile(r"\b(barrier|threadgroup_barrier|mem_fence|LID|__local|threadgroup)\b")


def synchronizing_entries() -> set[tuple[str, str]]:
    """(source, entry) of kernels whose work items cooperate (barriers, local memory, local ids):
    a serial loop over the grid does not model them, so on Linux they are compile-checked only."""
    from optcli.gpu.dialect import _kernel_bodies

    found = set()
    for source in source_names():
        text = load_source(source)
        for entry, body in _kernel_bodies(text).items():
            if _SYNC.search(body):
                found.add((source, entry))
    return found
