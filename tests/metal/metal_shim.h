// A small Metal Shading Language shim for compiling (and running) the rendered Metal kernels as
// C++17 with clang on machines without Metal.  It declares only what Metal itself provides and
// the kernels use, so a kernel that leans on an OpenCL-only builtin (mad, vload_half, ...) fails
// to compile here as it would on a Mac.
//
// - Vector types are clang ext_vector_type vectors (.x/.y/.z/.w, arithmetic with scalars,
//   comparisons giving lane masks); Metal's constructor syntax float4(a, b, c, d), float4(s) and
//   the conversions float4(half4) / half4(float4) go through function-like macros of the type's
//   name (a plain `float4 v` is untouched: no parenthesis follows).
// - half is _Float16 (storage only: the kernels compute in float).
// - Address spaces: with METAL_SHIM_ADDRESS_SPACES (compile checks) device / constant /
//   threadgroup are clang address spaces, so passing a device pointer where a plain pointer is
//   expected fails as in Metal; without it (execution) they vanish.
// - Attributes ([[buffer(i)]], [[thread_position_in_grid]]) are accepted and ignored
//   (-Wno-unknown-attributes).
#ifndef OPTCLI_METAL_SHIM_H
#define OPTCLI_METAL_SHIM_H

#ifdef METAL_SHIM_ADDRESS_SPACES
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2))) const
#define threadgroup __attribute__((address_space(3)))
#else
#define device
#define constant const
#define threadgroup
#endif
#define thread
#define kernel

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define MAXFLOAT 0x1.fffffep+127f

namespace metal {
typedef _Float16 half;
typedef unsigned int uint;
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float3 __attribute__((ext_vector_type(3)));
typedef float float4 __attribute__((ext_vector_type(4)));
typedef half half2 __attribute__((ext_vector_type(2)));
typedef half half3 __attribute__((ext_vector_type(3)));
typedef half half4 __attribute__((ext_vector_type(4)));
typedef int int2 __attribute__((ext_vector_type(2)));
typedef int int3 __attribute__((ext_vector_type(3)));
typedef int int4 __attribute__((ext_vector_type(4)));
typedef uint uint2 __attribute__((ext_vector_type(2)));
typedef uint uint3 __attribute__((ext_vector_type(3)));
typedef uint uint4 __attribute__((ext_vector_type(4)));

// constructors and conversions (see the macros at the end)
inline float4 _make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline float4 _make_float4(float s) { return float4{s, s, s, s}; }
inline float4 _make_float4(float4 v) { return v; }
inline float4 _make_float4(half4 v) { return __builtin_convertvector(v, float4); }
inline half4 _make_half4(half a, half b, half c, half d) { return half4{a, b, c, d}; }
inline half4 _make_half4(float4 v) { return __builtin_convertvector(v, half4); }
inline half4 _make_half4(half4 v) { return v; }

// math: the Metal functions the kernels use, scalar and float4
#define OPTCLI_SHIM_UNARY(name, builtin)                                                             \
    inline float name(float a) { return builtin(a); }                                               \
    inline float4 name(float4 v) { return float4{builtin(v.x), builtin(v.y), builtin(v.z), builtin(v.w)}; }
OPTCLI_SHIM_UNARY(exp, __builtin_expf)
OPTCLI_SHIM_UNARY(log, __builtin_logf)
OPTCLI_SHIM_UNARY(sqrt, __builtin_sqrtf)
OPTCLI_SHIM_UNARY(tanh, __builtin_tanhf)
OPTCLI_SHIM_UNARY(floor, __builtin_floorf)
OPTCLI_SHIM_UNARY(ceil, __builtin_ceilf)
OPTCLI_SHIM_UNARY(fabs, __builtin_fabsf)
OPTCLI_SHIM_UNARY(abs, __builtin_fabsf)
OPTCLI_SHIM_UNARY(rint, __builtin_rintf)
#undef OPTCLI_SHIM_UNARY

inline float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
inline float fmin(float a, float b) { return __builtin_fminf(a, b); }
inline float4 fmax(float4 a, float4 b) {
    return float4{fmax(a.x, b.x), fmax(a.y, b.y), fmax(a.z, b.z), fmax(a.w, b.w)};
}
inline float4 fmin(float4 a, float4 b) {
    return float4{fmin(a.x, b.x), fmin(a.y, b.y), fmin(a.z, b.z), fmin(a.w, b.w)};
}
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float4 fma(float4 a, float4 b, float4 c) {
    return float4{fma(a.x, b.x, c.x), fma(a.y, b.y, c.y), fma(a.z, b.z, c.z), fma(a.w, b.w, c.w)};
}
inline float clamp(float x, float lo, float hi) { return fmin(fmax(x, lo), hi); }
inline float4 clamp(float4 x, float4 lo, float4 hi) { return fmin(fmax(x, lo), hi); }
inline int clamp(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float min(float a, float b) { return fmin(a, b); }
inline float max(float a, float b) { return fmax(a, b); }
// select(a, b, c): c ? b : a, lane by lane (a comparison of vectors gives the lane mask)
inline float select(float a, float b, bool c) { return c ? b : a; }
inline float4 select(float4 a, float4 b, int4 c) {
    return float4{c.x ? b.x : a.x, c.y ? b.y : a.y, c.z ? b.z : a.z, c.w ? b.w : a.w};
}
// barriers: the shim runs threadgroups of one thread (shim.py's driver), where a barrier has
// nobody to wait for
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline void threadgroup_barrier(mem_flags) {}
}  // namespace metal

#define float4(...) ::metal::_make_float4(__VA_ARGS__)
#define half4(...) ::metal::_make_half4(__VA_ARGS__)

#endif
