"""The portable kernel dialect and its rendering for each GPU language.

Kernel sources (``kernels/*.cl``) are written once.  A kernel declares its parameters in its
head, and each target's signature generator turns that into the language's own signature:

    KERNEL(relu4, IN(x), OUT(y), INT(count))
    {
        const int i = GID(0);
        if (i >= count) return;
        STORE4(activate(LOAD4(x, i)), y, i);
    }

Parameters: ``IN(name)`` a read-only tensor in storage precision, ``OUT(name)`` a written one,
``INT(name)`` / ``FLOAT(name)`` scalars.  The body uses the macros of the prelude: ``GID(i)``,
``LID(i)``, ``FLOAT4``/``F4(a, b, c, d)``, ``LOAD4``/``STORE4``/``LOAD1``/``STORE1`` (storage
may be half: conversion happens here, arithmetic is always float), ``FMA``, ``INLINE`` for
helper functions, ``activate`` for the fused epilogue selected by ``ACTIVATION``.
Precision (``STORAGE_HALF``) and the epilogue are defines, never extra sources.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

ACTIVATION_CODES = {None: 0, "relu": 1, "clip": 2, "leaky_relu": 3, "sigmoid": 4, "tanh": 5,
                    "hard_sigmoid": 6, "hard_swish": 7, "swish": 8}

_KERNEL_HEAD = re.compile(r"KERNEL\(\s*(\w+)((?:\s*,\s*(?:IN|OUT|INT|FLOAT)\(\s*\w+\s*\))*)\s*\)")
_PARAM = re.compile(r"(IN|OUT|INT|FLOAT)\(\s*(\w+)\s*\)")


@dataclass(frozen=True)
class Param:
    kind: str  # IN, OUT, INT, FLOAT
    name: str


def kernel_params(source: str) -> dict[str, list[Param]]:
    """Every kernel a source declares, with its parameters in order."""
    return {m.group(1): [Param(k, n) for k, n in _PARAM.findall(m.group(2))] for m in _KERNEL_HEAD.finditer(source)}


@cache
def load_source(name: str) -> str:
    """A kernel source file from the package's kernel library (``kernels/`` in the repo)."""
    return resources.files("optcli.kernels").joinpath(name).read_text()


OPENCL_PRELUDE = r"""
#define INLINE inline
#define GID(i) ((int)get_global_id(i))
#define GSIZE(i) ((int)get_global_size(i))
#define LID(i) ((int)get_local_id(i))
#define FLOAT4 float4
#define F4(a, b, c, d) ((float4)((a), (b), (c), (d)))
#define F4S(a) ((float4)(a))
#define FMA(a, b, c) mad((a), (b), (c))
#if STORAGE_HALF
#define STORAGE half
#define LOAD4(p, i) vload_half4((i), (p))
#define STORE4(v, p, i) vstore_half4((v), (i), (p))
#define LOAD1(p, i) vload_half((i), (p))
#define STORE1(v, p, i) vstore_half((v), (i), (p))
#else
#define STORAGE float
#define LOAD4(p, i) vload4((i), (p))
#define STORE4(v, p, i) vstore4((v), (i), (p))
#define LOAD1(p, i) ((p)[i])
#define STORE1(v, p, i) ((p)[i] = (v))
#endif
"""

EPILOGUE = r"""
#ifndef ACTIVATION
#define ACTIVATION 0
#endif
#ifndef ACT_ALPHA
#define ACT_ALPHA 0.0f
#endif
#ifndef ACT_BETA
#define ACT_BETA 0.0f
#endif
#ifndef FAKE_QUANT
#define FAKE_QUANT 0
#endif
INLINE FLOAT4 activation_only(FLOAT4 v) {
#if ACTIVATION == 1
    return fmax(v, F4S(0.0f));
#elif ACTIVATION == 2
    return fmin(fmax(v, F4S(ACT_ALPHA)), F4S(ACT_BETA));
#elif ACTIVATION == 3
    return select(v * ACT_ALPHA, v, v >= F4S(0.0f));
#elif ACTIVATION == 4
    return F4S(1.0f) / (F4S(1.0f) + exp(-v));
#elif ACTIVATION == 5
    return tanh(v);
#elif ACTIVATION == 6
    return clamp(v * ACT_ALPHA + F4S(ACT_BETA), F4S(0.0f), F4S(1.0f));
#elif ACTIVATION == 7
    return v * clamp(v * (1.0f / 6.0f) + F4S(0.5f), F4S(0.0f), F4S(1.0f));
#elif ACTIVATION == 8
    return v / (F4S(1.0f) + exp(-v));
#else
    return v;
#endif
}
INLINE FLOAT4 activate(FLOAT4 v) {
#if FAKE_QUANT
    // the fused FakeQuant after the activation: onnxruntime's QuantizeLinear -> DequantizeLinear
    const FLOAT4 q = clamp(rint(activation_only(v) / FQ_SCALE) + F4S(FQ_ZERO_POINT), F4S(FQ_QMIN), F4S(FQ_QMAX));
    return (q - F4S(FQ_ZERO_POINT)) * FQ_SCALE;
#else
    return activation_only(v);
#endif
}
"""


def _opencl_signature(name: str, params: list[Param]) -> str:
    parts = []
    for p in params:
        if p.kind == "IN":
            parts.append(f"__global const STORAGE* restrict {p.name}")
        elif p.kind == "OUT":
            parts.append(f"__global STORAGE* restrict {p.name}")
        elif p.kind == "INT":
            parts.append(f"const int {p.name}")
        else:
            parts.append(f"const float {p.name}")
    return f"__kernel void {name}({', '.join(parts)})"


def _format_define(key: str, value) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float):
        text = "INFINITY" if value == float("inf") else "(-INFINITY)" if value == float("-inf") else f"{value!r}f"
        return f"#define {key} {text}"
    return f"#define {key} {value}"


def render_opencl(source_name: str, defines: dict) -> str:
    """Full OpenCL C program text for one kernel source and one set of defines."""
    source = load_source(source_name)
    body = _KERNEL_HEAD.sub(lambda m: _opencl_signature(m.group(1), [Param(k, n) for k, n in
                                                                         _PARAM.findall(m.group(2))]), source)
    head = "\n".join(_format_define(k, defines[k]) for k in sorted(defines))
    return f"{head}\n{OPENCL_PRELUDE}\n{EPILOGUE}\n{body}"


METAL_PRELUDE = r"""
#include <metal_stdlib>
using namespace metal;
#define INLINE inline
#define GID(i) ((int)_gid[i])
#define GSIZE(i) ((int)_gsize[i])
#define LID(i) ((int)_lid[i])
#define FLOAT4 float4
#define F4(a, b, c, d) float4((a), (b), (c), (d))
#define F4S(a) float4(a)
#define FMA(a, b, c) fma((a), (b), (c))
#if STORAGE_HALF
#define STORAGE half
#define STORAGE4 half4
#else
#define STORAGE float
#define STORAGE4 float4
#endif
// Packed tensors are read and written as whole vectors: float4 i of p is p[4i..4i+3] (as in
// the OpenCL rendering); buffers start at offset 0, so the vector pointers are aligned.
#define LOAD4(p, i) float4(((device const STORAGE4*)(p))[i])
#define STORE4(v, p, i) (((device STORAGE4*)(p))[i] = STORAGE4(v))
#define LOAD1(p, i) float((p)[i])
#define STORE1(v, p, i) ((p)[i] = STORAGE(v))
"""

# Thread-position parameters a Metal kernel gets when its body uses the matching macro.
_METAL_THREAD_PARAMS = (("GID", "uint3 _gid [[thread_position_in_grid]]"),
                        ("GSIZE", "uint3 _gsize [[threads_per_grid]]"),
                        ("LID", "uint3 _lid [[thread_position_in_threadgroup]]"))


def _metal_signature(name: str, params: list[Param], body: str) -> str:
    """Buffers and scalars take the argument-table slots in head order: ``[[buffer(i)]]`` is the
    i-th parameter, so the runtime binds launch argument i at index i."""
    parts = []
    for i, p in enumerate(params):
        if p.kind == "IN":
            parts.append(f"device const STORAGE* {p.name} [[buffer({i})]]")
        elif p.kind == "OUT":
            parts.append(f"device STORAGE* {p.name} [[buffer({i})]]")
        elif p.kind == "INT":
            parts.append(f"constant int& {p.name} [[buffer({i})]]")
        else:
            parts.append(f"constant float& {p.name} [[buffer({i})]]")
    parts += [decl for macro, decl in _METAL_THREAD_PARAMS if re.search(rf"\b{macro}\(", body)]
    return f"kernel void {name}({', '.join(parts)})"


def _kernel_bodies(source: str) -> dict[str, str]:
    """The text of each kernel, from its head up to the next head (enough to see which thread
    ids it uses)."""
    heads = list(_KERNEL_HEAD.finditer(source))
    return {m.group(1): source[m.end(): heads[k + 1].start() if k + 1 < len(heads) else len(source)]
            for k, m in enumerate(heads)}


def render_metal(source_name: str, defines: dict) -> str:
    """Full Metal Shading Language library text for one kernel source and one set of defines:
    the same source and epilogue as ``render_opencl``, another prelude and signature generator."""
    source = load_source(source_name)
    bodies = _kernel_bodies(source)
    body = _KERNEL_HEAD.sub(lambda m: _metal_signature(m.group(1), [Param(k, n) for k, n in
                                                                    _PARAM.findall(m.group(2))],
                                                       bodies[m.group(1)]), source)
    head = "\n".join(_format_define(k, defines[k]) for k in sorted(defines))
    return f"{head}\n{METAL_PRELUDE}\n{EPILOGUE}\n{body}"


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]
