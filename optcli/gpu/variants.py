"""Every kernel program the GPU launch functions can emit, as (source, defines) pairs: a fixed,
finite set.

A GPU target compiles one program per (kernel source, defines): the launch functions in
``ops_*`` pick the source and the defines (fused epilogue, unary / binary op, pooling mode), and
the runtime adds the precision (``STORAGE_HALF``).  Defines are enumerated choices only; every
float (an activation's alpha, a fused FakeQuant's scale) and every size is a kernel argument.
This module lists every program from the same code tables the launch functions use, so that a
Metal library cache can be warmed ahead of time, the tests can compile every variant for every
language, and the runtime refuses to build anything else (``check_program``): however many
steps a file holds, the programs it can make the runtime build are at most these.
``tests/metal/test_variants.py`` walks the registry over representative nodes and checks that
every launch it sees falls inside this enumeration, so a new define cannot go unlisted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from optcli.activation_codes import ACTIVATION_CODES
from optcli.gpu.dialect import kernel_params, load_source

# Sources whose launches carry the fused-epilogue defines for every activation.
_EPILOGUE_SOURCES = ("conv.cl", "winograd.cl", "gemm.cl")


def epilogue_variants(with_none: bool = True, fake_quant: bool = True) -> list[dict]:
    """ACTIVATION (every fused activation, none included when asked) and, when asked, the same
    with a FakeQuant fused after it."""
    plain = [{"ACTIVATION": code} for name, code in sorted(ACTIVATION_CODES.items(), key=lambda kv: kv[1])
             if with_none or name is not None]
    return plain + ([{**e, "FAKE_QUANT": 1} for e in plain] if fake_quant else [])


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
    return sorted(p.name for p in resources.files("optcli.kernels").joinpath("gpu").iterdir() if p.name.endswith(".cl"))


def program_variants() -> Iterator[tuple[str, dict]]:
    """(source, defines) of every program the launch functions can emit, precision excluded."""
    for source in source_names():
        if source in _EPILOGUE_SOURCES:
            variants = epilogue_variants()
        elif source == "elementwise.cl":
            variants = _elementwise_variants()
        elif source == "pool.cl":
            variants = [{"POOL_MAX": 0}, {"POOL_MAX": 1}, {"POOL_MAX": 0, "FAKE_QUANT": 1}]
        else:
            variants = [{}]
        for defines in variants:
            yield source, defines


@cache
def _listed() -> frozenset[tuple[str, frozenset]]:
    return frozenset((source, frozenset(defines.items())) for source, defines in program_variants())


def check_program(source: str, defines: dict[str, Any]) -> None:
    """Refuse (ValueError) a program outside the enumeration: the runtime builds nothing else,
    so the programs one file can cost are bounded whatever its steps ask for."""
    rest = {k: v for k, v in defines.items() if k != "STORAGE_HALF"}
    if defines.get("STORAGE_HALF", 0) not in (0, 1) or (source, frozenset(rest.items())) not in _listed():
        raise ValueError(f"{source} with defines {defines} is not a program of the kernel library")


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


_SYNC = re.compile(r"\b(barrier|threadgroup_barrier|mem_fence|BARRIER|LID|__local|threadgroup)\b")
_COMMENT = re.compile(r"//[^\n]*")
_ANY_GROUP_SIZE = re.compile(r"\bLSIZE\(")


def synchronizing_entries() -> set[tuple[str, str]]:
    """(source, entry) of kernels whose work items cooperate (barriers, local memory, local ids)
    and assume a work-group size: a serial loop over the grid does not model them, so on Linux they
    are compile-checked only.  A kernel that reads its group's size (``LSIZE``) works with any,
    one work item per group included, which the serial loop is (``recurrent.cl``'s
    ``recurrent_steps``); its barriers are checked on PoCL and under oclgrind's race detector."""
    from optcli.gpu.dialect import _kernel_bodies

    found = set()
    for source in source_names():
        text = load_source(source)
        for entry, body in _kernel_bodies(text).items():
            code = _COMMENT.sub("", body)
            if _SYNC.search(code) and not _ANY_GROUP_SIZE.search(code):
                found.add((source, entry))
    return found
