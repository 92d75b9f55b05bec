"""The portable kernel dialect and its rendering for each GPU language.

Kernel sources (``kernels/gpu/*.cl``) are written once.  A kernel declares its parameters in its
head, and each target's signature generator turns that into the language's own signature:

    KERNEL(relu4, IN(x), OUT(y), INT(count))
    {
        const int i = GID(0);
        if (i >= count) return;
        STORE4(activate(LOAD4(x, i)), y, i);
    }

Parameters: ``IN(name)`` a read-only tensor in storage precision, ``OUT(name)`` a written one,
``INT(name)`` / ``FLOAT(name)`` scalars, ``EPILOGUE`` the fused epilogue's float parameters
(activation alpha / beta, a fused FakeQuant's scale, zero point and range).  The body uses the
macros of the prelude: ``GID(i)``, ``LID(i)``, ``GSIZE(i)``, ``LSIZE(i)`` (the work-group's size),
``BARRIER()`` (every work item of the work-group waits there, and sees the others' buffer writes
made before it: every work item must reach it), ``FLOAT4``/``F4(a, b, c, d)``,
``LOAD4``/``STORE4``/``LOAD1``/``STORE1`` (storage may be half: conversion happens here,
arithmetic is always float), ``FMA``, ``INLINE`` for helper functions, ``activate`` for the
fused epilogue selected by ``ACTIVATION`` (a kernel calling it declares ``EPILOGUE``).

Memory safety by construction: the signature generator gives every ``IN`` / ``OUT`` buffer a
companion ``int name_n`` (its length in storage elements, appended after the declared
parameters) which the runtime sets from the buffer it allocated, never from the file; every
``LOAD*`` checks its index against it (out of range reads 0) and every ``STORE*`` drops a write
out of range.  Kernel bodies touch buffers only through these macros (a test checks it), so no
launch, however wrong its sizes, reads or writes outside its buffers.

Defines hold only enumerated choices (precision ``STORAGE_HALF``, ``ACTIVATION``, ``FAKE_QUANT``,
the op codes): the programs a file can make the runtime build are the finite set of
``optcli.gpu.variants``; every float (and every size) is a kernel argument.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

_KERNEL_HEAD = re.compile(r"KERNEL\(\s*(\w+)((?:\s*,\s*(?:(?:IN|OUT|INT|FLOAT)\(\s*\w+\s*\)|EPILOGUE))*)\s*\)")
_PARAM = re.compile(r"(?:(IN|OUT|INT|FLOAT)\(\s*(\w+)\s*\)|(EPILOGUE))")

EPILOGUE_NAME = "_epi"  # the epilogue parameter's name in the rendered kernels (``activate`` reads it)
EPILOGUE_SLOTS = 8  # floats: alpha, beta, FakeQuant scale, zero point, qmin, qmax, 2 unused (a float8)


@dataclass(frozen=True)
class Param:
    kind: str  # IN, OUT, INT, FLOAT, EPILOGUE; SIZE for a buffer's generated length
    name: str


def _params(head_args: str) -> list[Param]:
    return [Param("EPILOGUE", EPILOGUE_NAME) if epi else Param(k, n) for k, n, epi in _PARAM.findall(head_args)]


def kernel_params(source: str) -> dict[str, list[Param]]:
    """Every kernel a source declares, with its declared parameters in order (what a ``Launch``
    gives arguments for)."""
    return {m.group(1): _params(m.group(2)) for m in _KERNEL_HEAD.finditer(source)}


def signature_params(params: list[Param]) -> list[Param]:
    """The parameters of the rendered kernel, in argument order: the declared ones, then one
    ``SIZE`` per buffer (``name_n``: its length in storage elements) in declaration order.
    Argument ``i`` is OpenCL argument ``i`` and Metal ``[[buffer(i)]]``."""
    return [*params, *(Param("SIZE", f"{p.name}_n") for p in params if p.kind in ("IN", "OUT"))]


@dataclass(frozen=True)
class Epilogue:
    """The float parameters of a fused epilogue, passed as one ``EPILOGUE`` argument (a float8 in
    OpenCL, 8 floats of constant memory in Metal), so that a new alpha builds no new program."""
    alpha: float = 0.0
    beta: float = 0.0
    fq_scale: float = 1.0
    fq_zero_point: float = 0.0
    fq_qmin: float = 0.0
    fq_qmax: float = 0.0

    def packed(self) -> np.ndarray:
        values = [self.alpha, self.beta, self.fq_scale, self.fq_zero_point, self.fq_qmin, self.fq_qmax]
        return np.array(values + [0.0] * (EPILOGUE_SLOTS - len(values)), np.float32)


_INT_MAX = 2**31 - 1


def kernel_arguments(params: list[Param], args: list[Any], label: str, buffer: Callable[[Any], Any],
                     elements: Callable[[Any], int]) -> list[tuple[str, Any]]:
    """A launch's arguments (one per declared parameter) as the rendered kernel takes them, in
    ``signature_params`` order: ``("buffer", buf)``, ``("int", v)``, ``("float", v)`` or
    ``("floats", float32 array)``.  ``buffer`` resolves a buffer argument to the backend's
    buffer; ``elements`` tells that buffer's real length in storage elements, which becomes its
    ``SIZE`` argument: the bound every ``LOAD`` / ``STORE`` of the kernel checks."""
    if len(params) != len(args):
        raise RuntimeError(f"{label}: the kernel takes {len(params)} arguments, the launch gives {len(args)}")
    out: list[tuple[str, Any]] = []
    sizes: list[tuple[str, Any]] = []
    for p, a in zip(params, args):
        if p.kind in ("IN", "OUT"):
            buf = buffer(a)
            out.append(("buffer", buf))
            sizes.append(("int", min(int(elements(buf)), _INT_MAX)))
        elif p.kind == "INT":
            out.append(("int", int(a)))
        elif p.kind == "FLOAT":
            out.append(("float", float(a)))
        else:
            if not isinstance(a, Epilogue):
                raise RuntimeError(f"{label}: argument '{p.name}' must be an Epilogue, got {a!r}")
            out.append(("floats", a.packed()))
    return out + sizes


@cache
def load_source(name: str) -> str:
    """A kernel source file from the package's GPU kernel library (``kernels/gpu/`` in the repo)."""
    return resources.files("optcli.kernels").joinpath("gpu").joinpath(name).read_text()


# The checked accesses, on top of each language's RAW_* ones.  `p##_n` is the buffer's SIZE
# parameter (elements of storage); an index is in range when, as unsigned, it is below the
# count (negative indices wrap to huge): one compare per access.  A read out of range gives 0,
# a write out of range is dropped.
BOUNDS = r"""
#define IN_RANGE4(p, i) ((uint)(i) < ((uint)(p##_n) >> 2))
#define IN_RANGE1(p, i) ((uint)(i) < (uint)(p##_n))
#define LOAD4(p, i) (IN_RANGE4(p, i) ? RAW_LOAD4(p, i) : F4S(0.0f))
#define LOAD1(p, i) (IN_RANGE1(p, i) ? RAW_LOAD1(p, i) : 0.0f)
#define STORE4(v, p, i) do { if (IN_RANGE4(p, i)) RAW_STORE4(v, p, i); } while (0)
#define STORE1(v, p, i) do { if (IN_RANGE1(p, i)) RAW_STORE1(v, p, i); } while (0)
"""

OPENCL_PRELUDE = r"""
#define INLINE inline
#define GID(i) ((int)get_global_id(i))
#define GSIZE(i) ((int)get_global_size(i))
#define LID(i) ((int)get_local_id(i))
#define LSIZE(i) ((int)get_local_size(i))
#define BARRIER() barrier(CLK_GLOBAL_MEM_FENCE)
#define FLOAT4 float4
#define F4(a, b, c, d) ((float4)((a), (b), (c), (d)))
#define F4S(a) ((float4)(a))
#define FMA(a, b, c) mad((a), (b), (c))
#define EPI_T float8
#define EPI_AT(e, k) ((e).s##k)
#if STORAGE_HALF
#define STORAGE half
#define RAW_LOAD4(p, i) vload_half4((i), (p))
#define RAW_STORE4(v, p, i) vstore_half4((v), (i), (p))
#define RAW_LOAD1(p, i) vload_half((i), (p))
#define RAW_STORE1(v, p, i) vstore_half((v), (i), (p))
#else
#define STORAGE float
#define RAW_LOAD4(p, i) vload4((i), (p))
#define RAW_STORE4(v, p, i) vstore4((v), (i), (p))
#define RAW_LOAD1(p, i) ((p)[i])
#define RAW_STORE1(v, p, i) ((p)[i] = (v))
#endif
""" + BOUNDS

EPILOGUE = r"""
#ifndef ACTIVATION
#define ACTIVATION 0
#endif
#ifndef FAKE_QUANT
#define FAKE_QUANT 0
#endif
// Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): Metal has no erf builtin.  Here for GELU, the
// stand-alone Erf / Gelu kernels (elementwise.cl) use it too.
INLINE FLOAT4 erf4(FLOAT4 x) {
    FLOAT4 a = fabs(x);
    FLOAT4 t = F4S(1.0f) / (F4S(1.0f) + 0.3275911f * a);
    FLOAT4 p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    FLOAT4 r = F4S(1.0f) - p * exp(-a * a);
    return select(r, -r, x < F4S(0.0f));
}
// e: the kernel's EPILOGUE argument (see dialect.Epilogue): alpha, beta, then the fused
// FakeQuant's scale, zero point, qmin, qmax.
INLINE FLOAT4 activation_only(FLOAT4 v, EPI_T e) {
#if ACTIVATION == 1
    return fmax(v, F4S(0.0f));
#elif ACTIVATION == 2
    return fmin(fmax(v, F4S(EPI_AT(e, 0))), F4S(EPI_AT(e, 1)));
#elif ACTIVATION == 3
    return select(v * EPI_AT(e, 0), v, v >= F4S(0.0f));
#elif ACTIVATION == 4
    return F4S(1.0f) / (F4S(1.0f) + exp(-v));
#elif ACTIVATION == 5
    return tanh(v);
#elif ACTIVATION == 6
    return clamp(v * EPI_AT(e, 0) + F4S(EPI_AT(e, 1)), F4S(0.0f), F4S(1.0f));
#elif ACTIVATION == 7
    return v * clamp(v * (1.0f / 6.0f) + F4S(0.5f), F4S(0.0f), F4S(1.0f));
#elif ACTIVATION == 8
    return v / (F4S(1.0f) + exp(-v));
#elif ACTIVATION == 9
    return v * 0.5f * (F4S(1.0f) + erf4(v * 0.70710678118654752f));
#elif ACTIVATION == 10
    // 0.5 v (1 + tanh(u)) = v * sigmoid(2u), u = sqrt(2 / pi) (v + 0.044715 v^3)
    return v / (F4S(1.0f) + exp(-v * (v * v * 0.0713548162726f + F4S(1.59576912161f))));
#else
    return v;
#endif
}
INLINE FLOAT4 activate_with(FLOAT4 v, EPI_T e) {
#if FAKE_QUANT
    // the fused FakeQuant after the activation: onnxruntime's QuantizeLinear -> DequantizeLinear
    const float scale = EPI_AT(e, 2), zero_point = EPI_AT(e, 3);
    const FLOAT4 q = clamp(rint(activation_only(v, e) / scale) + F4S(zero_point), F4S(EPI_AT(e, 4)),
                           F4S(EPI_AT(e, 5)));
    return (q - F4S(zero_point)) * scale;
#else
    return activation_only(v, e);
#endif
}
// In a kernel that declares EPILOGUE: the fused epilogue with that kernel's parameters.
#define activate(v) activate_with((v), _epi)
"""


def _opencl_signature(name: str, params: list[Param]) -> str:
    parts = []
    for p in params:
        if p.kind == "IN":
            parts.append(f"__global const STORAGE* restrict {p.name}")
        elif p.kind == "OUT":
            parts.append(f"__global STORAGE* restrict {p.name}")
        elif p.kind in ("INT", "SIZE"):
            parts.append(f"const int {p.name}")
        elif p.kind == "FLOAT":
            parts.append(f"const float {p.name}")
        else:
            parts.append(f"const EPI_T {p.name}")
    return f"__kernel void {name}({', '.join(parts)})"


def _format_define(key: str, value) -> str:
    """Defines are enumerated choices (small ints); a float or any other value is a kernel
    argument, never a define: it would make one program per value."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, (int, np.integer)) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
        raise ValueError(f"define {key}={value!r}: defines take enumerated ints only (floats are kernel arguments)")
    return f"#define {key} {int(value)}"


def render_opencl(source_name: str, defines: dict) -> str:
    """Full OpenCL C program text for one kernel source and one set of defines."""
    source = load_source(source_name)
    body = _KERNEL_HEAD.sub(lambda m: _opencl_signature(m.group(1), signature_params(_params(m.group(2)))), source)
    head = "\n".join(_format_define(k, defines[k]) for k in sorted(defines))
    return f"{head}\n{OPENCL_PRELUDE}\n{EPILOGUE}\n{body}"


METAL_PRELUDE = r"""
#include <metal_stdlib>
using namespace metal;
#define INLINE inline
#define GID(i) ((int)_gid[i])
#define GSIZE(i) ((int)_gsize[i])
#define LID(i) ((int)_lid[i])
#define LSIZE(i) ((int)_lsize[i])
#define BARRIER() threadgroup_barrier(mem_flags::mem_device)
#define FLOAT4 float4
#define F4(a, b, c, d) float4((a), (b), (c), (d))
#define F4S(a) float4(a)
#define FMA(a, b, c) fma((a), (b), (c))
#define EPI_T constant float*
#define EPI_AT(e, k) ((e)[k])
#if STORAGE_HALF
#define STORAGE half
#define STORAGE4 half4
#else
#define STORAGE float
#define STORAGE4 float4
#endif
// Packed tensors are read and written as whole vectors: float4 i of p is p[4i..4i+3] (as in
// the OpenCL rendering); buffers start at offset 0, so the vector pointers are aligned.
#define RAW_LOAD4(p, i) float4(((device const STORAGE4*)(p))[i])
#define RAW_STORE4(v, p, i) (((device STORAGE4*)(p))[i] = STORAGE4(v))
#define RAW_LOAD1(p, i) float((p)[i])
#define RAW_STORE1(v, p, i) ((p)[i] = STORAGE(v))
""" + BOUNDS

# Thread-position parameters a Metal kernel gets when its body uses the matching macro.
_METAL_THREAD_PARAMS = (("GID", "uint3 _gid [[thread_position_in_grid]]"),
                        ("GSIZE", "uint3 _gsize [[threads_per_grid]]"),
                        ("LID", "uint3 _lid [[thread_position_in_threadgroup]]"),
                        ("LSIZE", "uint3 _lsize [[threads_per_threadgroup]]"))


def _metal_signature(name: str, params: list[Param], body: str) -> str:
    """Buffers and scalars take the argument-table slots in head order: ``[[buffer(i)]]`` is the
    i-th parameter, so the runtime binds launch argument i at index i."""
    parts = []
    for i, p in enumerate(params):
        if p.kind == "IN":
            parts.append(f"device const STORAGE* {p.name} [[buffer({i})]]")
        elif p.kind == "OUT":
            parts.append(f"device STORAGE* {p.name} [[buffer({i})]]")
        elif p.kind in ("INT", "SIZE"):
            parts.append(f"constant int& {p.name} [[buffer({i})]]")
        elif p.kind == "FLOAT":
            parts.append(f"constant float& {p.name} [[buffer({i})]]")
        else:
            parts.append(f"constant float* {p.name} [[buffer({i})]]")
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
    body = _KERNEL_HEAD.sub(lambda m: _metal_signature(m.group(1), signature_params(_params(m.group(2))),
                                                       bodies[m.group(1)]), source)
    head = "\n".join(_format_define(k, defines[k]) for k in sorted(defines))
    return f"{head}\n{METAL_PRELUDE}\n{EPILOGUE}\n{body}"


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]
