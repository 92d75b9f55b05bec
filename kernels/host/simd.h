/* Portable 8-wide float vectors (GCC/Clang vector extensions) and the fused activation epilogue.
 *
 * One source for every host: the compiler lowers an 8-float vector to two NEON registers on
 * aarch64, two SSE registers on baseline x86-64, one AVX register in the x86-64-v3 clone.
 * No intrinsics: everything here is plain vector arithmetic, comparisons (which give -1/0 lane
 * masks) and __builtin_convertvector.
 *
 * The activations follow optcli/ops/activation.py (the numpy epilogue) lane for lane, NaNs
 * included: relu and clip keep a NaN, as np.maximum / np.clip do.
 */
#ifndef OPTCLI_SIMD_H
#define OPTCLI_SIMD_H

#include <stdint.h>
#include <string.h>

#define VL 8
typedef float v8f __attribute__((vector_size(32)));

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE v8f vsplat(float a) { v8f z = {0}; return z + a; }
ALWAYS_INLINE v8f vload(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
ALWAYS_INLINE void vstore(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* The activations work on 4-lane halves: comparisons of 8-lane vectors are split into scalar
 * compares on targets whose registers hold 4 floats (NEON, SSE), while 4-lane compares, selects
 * and conversions are single instructions everywhere.  Arithmetic stays 8 lanes wide. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

ALWAYS_INLINE v4f splat4(float a) { v4f z = {0}; return z + a; }
/* Lanes of a where m is set (-1), of b elsewhere. */
ALWAYS_INLINE v4f sel4(v4i m, v4f a, v4f b) { return (v4f)((m & (v4i)a) | (~m & (v4i)b)); }

/* Activation codes: the order of ACTIVATIONS in optcli/activation_codes.py (tests/test_activation_codes.py
   holds them equal). */
enum {
    ACT_NONE = 0, ACT_RELU, ACT_CLIP, ACT_LEAKY_RELU, ACT_SIGMOID, ACT_TANH,
    ACT_HARD_SIGMOID, ACT_HARD_SWISH, ACT_SWISH, ACT_GELU, ACT_GELU_TANH, ACT_COUNT
};

/* exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-5 polynomial), about 1 ulp.
 * Below -87.3 (where exp leaves the normal floats) the result is 0, so that -inf * sigmoid(-inf)
 * is NaN as in numpy. */
ALWAYS_INLINE v4f exp_neg4(v4f x) {
    v4i tiny = x < splat4(-87.3f);
    x = sel4(tiny, splat4(-87.3f), x);
    v4f fx = x * 1.44269504088896341f + 0.5f;
    v4i n = __builtin_convertvector(fx, v4i); /* truncates toward zero: floor needs a fix-up */
    v4f nf = __builtin_convertvector(n, v4f);
    n += (v4i)(nf > fx);                      /* mask is -1 where truncation rounded up */
    nf = __builtin_convertvector(n, v4f);
    x = x - nf * 0.693359375f - nf * -2.12194440e-4f;
    v4f z = x * x;
    v4f y = splat4(1.9875691500e-4f);
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    v4i bits = (n + 127) << 23;
    return sel4(tiny, splat4(0.0f), y * (v4f)bits);
}

/* 1 / (1 + exp(-x)), split by sign as the numpy kernel does so nothing overflows. */
ALWAYS_INLINE v4f sigmoid4(v4f x) {
    v4i neg = x < splat4(0.0f);
    v4f e = exp_neg4(sel4(neg, x, -x));  /* exp(-|x|) */
    v4f s = 1.0f / (e + 1.0f);
    return sel4(neg, e * s, s);          /* a NaN flows through the arithmetic and stays NaN */
}

/* Cephes tanhf: an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above. */
ALWAYS_INLINE v4f tanh4(v4f x) {
    v4i neg = x < splat4(0.0f);
    v4f ax = sel4(neg, -x, x);
    v4f e = exp_neg4(ax * -2.0f);        /* exp(-2|x|) in (0, 1] */
    v4f big = (1.0f - e) / (1.0f + e);
    v4f z = x * x;
    v4f p = splat4(-5.70498872745e-3f);
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    v4f small = p * z * x + x;
    return sel4(ax < splat4(0.625f), small, sel4(neg, -big, big)); /* NaN: big is NaN */
}

/* GELU, x * Phi(x) with Phi the standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2.  erfc(z) for
 * z >= 0 is Numerical Recipes' erfcc, t * exp(P(t) - z^2) with t = 1 / (1 + z / 2): relative error
 * below 1.2e-7 over all z, so the negative tail (Phi tiny) keeps its relative accuracy where
 * 1 + erf(x / sqrt 2) would cancel to noise; x >= 0 takes 1 - erfc / 2.  From |x| ~ 13 on erfc is
 * 0: x itself above, -0 below (NaN at -inf, as x * 0.5 * (1 + erf) gives in numpy).
 *
 * Written without comparisons (the sign from its bit, clamps and the flush to 0 in integer
 * arithmetic) so that one body serves 4 and 8 lanes: an 8-lane comparison becomes scalar code on
 * 4-lane hardware, but 8-lane arithmetic runs as two 4-lane halves, and as one AVX register in
 * the x86-64-v3 clone, twice the speed of act4's halves. */

/* exp(a) for a from -2e6 to 1e-6 (n = round(a / ln 2) by the 1.5 * 2^23 trick, Cephes' polynomial
 * on the rest), flushed to 0 below 2^-126. */
#define EXP_SMALL_BODY(V, VI, a)                                                            \
    V fx = (a) * 1.44269504088896341f + 12582912.0f;                                       \
    VI n = (VI)fx - 0x4B400000;                                                             \
    V nf = fx - 12582912.0f;                                                                \
    V r = (a) - nf * 0.693359375f - nf * -2.12194440e-4f;                                  \
    V y = r * 1.9875691500e-4f + 1.3981999507e-3f;                                          \
    y = y * r + 8.3334519073e-3f;                                                           \
    y = y * r + 4.1665795894e-2f;                                                           \
    y = y * r + 1.6666665459e-1f;                                                           \
    y = y * r + 5.0000001201e-1f;                                                           \
    y = y * (r * r) + r + 1.0f;                                                             \
    VI e = n + 127;                                                                         \
    e &= ~(e >> 31); /* max(n + 127, 0): bits 0 are +0 */                                   \
    y *= (V)(e << 23);

/* min(v, c) for v >= 0 (or NaN, inf) and a positive float's bits c: positive floats order as their bits. */
#define CLAMP_POS_BODY(V, VI, v, c) \
    VI d_ = (VI)(v) - (c);          \
    v = (V)((c) + (d_ & (d_ >> 31)));

#define DEFINE_GELU(name, tanh_name, V, VI)                                                  \
    ALWAYS_INLINE V name(V x) {                                                            \
        VI neg = (VI)x >> 31; /* -1 where the sign bit is set */                           \
        V z = (V)((VI)x & 0x7fffffff) * 0.70710678118654752f;                              \
        CLAMP_POS_BODY(V, VI, z, 0x41200000) /* 10: erfc(10) is below every float */       \
        V t = 1.0f / (z * 0.5f + 1.0f);                                                     \
        V p = t * 0.17087277f - 0.82215223f;                                                \
        p = p * t + 1.48851587f;                                                            \
        p = p * t - 1.13520398f;                                                            \
        p = p * t + 0.27886807f;                                                            \
        p = p * t - 0.18628806f;                                                            \
        p = p * t + 0.09678418f;                                                            \
        p = p * t + 0.37409196f;                                                            \
        p = p * t + 1.00002368f;                                                            \
        p = p * t - 1.26551223f;                                                            \
        V a = p - z * z;                                                                    \
        EXP_SMALL_BODY(V, VI, a)                                                            \
        V h = t * y * 0.5f; /* erfc(z) / 2 */                                               \
        return x * (V)((neg & (VI)h) | (~neg & (VI)(1.0f - h)));                            \
    }                                                                                       \
    /* The tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), is          \
     * x * sigmoid(2u), and 2u has x's sign: sigmoid from exp(-|2u|) keeps the negative tail. */ \
    ALWAYS_INLINE V tanh_name(V x) {                                                       \
        VI neg = (VI)x >> 31;                                                               \
        V ax = (V)((VI)x & 0x7fffffff);                                                     \
        CLAMP_POS_BODY(V, VI, ax, 0x42200000) /* 40: exp(-2u) is 0 */                       \
        V w = ax * (ax * ax * 0.0713548162726f + 1.59576912161f);                           \
        V a = -w;                                                                           \
        EXP_SMALL_BODY(V, VI, a)                                                            \
        V s = 1.0f / (y + 1.0f);                                                            \
        return x * (V)((neg & (VI)(y * s)) | (~neg & (VI)s));                               \
    }

typedef int32_t v8i __attribute__((vector_size(32)));
DEFINE_GELU(gelu4, gelu_tanh4, v4f, v4i)
DEFINE_GELU(gelu8, gelu_tanh8, v8f, v8i)
#if defined(__x86_64__)
/* 16 lanes, for the AVX-512 variant of the GEMM (gemm.c): inlined only into its functions, whose
 * target has the 512-bit registers (a transformer's GELU after its FC took as long as the product) */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
DEFINE_GELU(gelu16, gelu_tanh16, v16f, v16i)
#endif

/* sigmoid and swish the same way, 8 lanes: sigmoid(v) = s or e * s by v's sign bit, e = exp(-|v|),
 * s = 1 / (1 + e); |v| clamped at 100 (e flushes to 0), so a NaN is put back from its bits. */
ALWAYS_INLINE v8f sigmoid8(v8f v) {
    v8i bits = (v8i)v, neg = bits >> 31, mag = bits & 0x7fffffff;
    v8i nan = (0x7f800000 - mag) >> 31; /* -1 where |v| is a NaN's bits */
    v8f a = (v8f)mag;
    CLAMP_POS_BODY(v8f, v8i, a, 0x42c80000)
    a = -a;
    EXP_SMALL_BODY(v8f, v8i, a)
    v8f s = 1.0f / (y + 1.0f);
    return (v8f)((neg & (v8i)(y * s)) | (~neg & (v8i)s) | (nan & 0x7fc00000));
}

ALWAYS_INLINE v8f swish8(v8f v) { return v * sigmoid8(v); } /* a NaN v makes it NaN */

/* tanh, 8 lanes, the same way (no comparisons: one body for every host): Cephes tanhf as tanh4, an
 * odd polynomial below 0.625 and 1 - 2 / (exp(2|v|) + 1) above, on |v| clamped at 10 (tanh is 1
 * in float32 there), the sign put back from v's bit and a NaN from its bits. */
ALWAYS_INLINE v8f tanh8(v8f v) {
    v8i bits = (v8i)v, mag = bits & 0x7fffffff;
    v8i nan = (0x7f800000 - mag) >> 31;
    v8i small = (mag - 0x3f200000) >> 31; /* -1 where |v| < 0.625 */
    v8f ax = (v8f)mag;
    CLAMP_POS_BODY(v8f, v8i, ax, 0x41200000)
    v8f z = ax * ax;
    v8f p = z * -5.70498872745e-3f + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    v8f lo = p * z * ax + ax;
    v8f a = ax * -2.0f;
    EXP_SMALL_BODY(v8f, v8i, a)
    v8f hi = (1.0f - y) / (1.0f + y);
    v8i t = (small & (v8i)lo) | (~small & (v8i)hi);
    return (v8f)(((t | (bits & (int32_t)0x80000000)) & ~nan) | (nan & 0x7fc00000));
}

ALWAYS_INLINE v4f clamp01_4(v4f v) {
    v = sel4(v < splat4(0.0f), splat4(0.0f), v);
    return sel4(v > splat4(1.0f), splat4(1.0f), v);
}

ALWAYS_INLINE v4f act4(v4f v, int act, float alpha, float beta) {
    switch (act) {
    case ACT_RELU: /* a NaN stays NaN, as with np.maximum */
        return sel4(v < splat4(0.0f), splat4(0.0f), v);
    case ACT_CLIP:
        v = sel4(v < splat4(alpha), splat4(alpha), v);
        return sel4(v > splat4(beta), splat4(beta), v);
    case ACT_LEAKY_RELU:
        return sel4(v >= splat4(0.0f), v, v * alpha);
    case ACT_SIGMOID:
        return sigmoid4(v);
    case ACT_TANH:
        return tanh4(v);
    case ACT_HARD_SIGMOID:
        return clamp01_4(v * alpha + beta);
    case ACT_HARD_SWISH:
        return v * clamp01_4(v * (1.0f / 6.0f) + 0.5f);
    case ACT_SWISH:
        return v * sigmoid4(v);
    case ACT_GELU:
        return gelu4(v);
    case ACT_GELU_TANH:
        return gelu_tanh4(v);
    default:
        return v;
    }
}

/* Copy n < 8 floats with fixed-size moves: a memcpy of a variable size is a libc call, which
 * cost more than the multiply-adds of a short row. */
ALWAYS_INLINE void copy_short(float *dst, const float *src, int n) {
    int i = 0;
    if (n & 4) { memcpy(dst, src, 4 * sizeof(float)); i = 4; }
    if (n & 2) { memcpy(dst + i, src + i, 2 * sizeof(float)); i += 2; }
    if (n & 1) dst[i] = src[i];
}

/* Copy n < lanes floats (lanes 4, 8 or 16: a vector's) with fixed-size moves, 8 at a time then
 * copy_short: the partial vectors at the end of a row. */
ALWAYS_INLINE void copy_part(float *dst, const float *src, int n, const int lanes) {
    const int ch = lanes < 8 ? lanes : 8;
    for (int i = 0; i < lanes; i += ch) {
        if (n >= i + ch) memcpy(dst + i, src + i, (size_t)ch * sizeof(float));
        else if (n > i) copy_short(dst + i, src + i, n - i);
    }
}

/* Store the first n (1..VL) lanes of v. */
ALWAYS_INLINE void vstore_part(float *p, v8f v, int n) {
    if (n >= VL) {
        vstore(p, v);
    } else {
        float tmp[VL];
        vstore(tmp, v);
        copy_short(p, tmp, n);
    }
}

/* The activation over n floats in place, as its own pass over data still in L1: a loop per
 * activation (act is a constant once inlined), kept out of the kernels' register tiles, where a
 * switch per stored vector cost as much as the multiply-adds. */
ALWAYS_INLINE void act_span_k(float *y, int64_t n, const int act, float alpha, float beta) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f h0, h1;
        memcpy(&h0, y + i, sizeof h0);
        memcpy(&h1, y + i + 4, sizeof h1);
        h0 = act4(h0, act, alpha, beta);
        h1 = act4(h1, act, alpha, beta);
        memcpy(y + i, &h0, sizeof h0);
        memcpy(y + i + 4, &h1, sizeof h1);
    }
    if (i < n) {
        float t[8] = {0};
        copy_short(t, y + i, (int)(n - i));
        v4f h0, h1;
        memcpy(&h0, t, sizeof h0);
        memcpy(&h1, t + 4, sizeof h1);
        h0 = act4(h0, act, alpha, beta);
        h1 = act4(h1, act, alpha, beta);
        memcpy(t, &h0, sizeof h0);
        memcpy(t + 4, &h1, sizeof h1);
        copy_short(y + i, t, (int)(n - i));
    }
}

/* relu and clip as plain loops: compilers turn `v < lo ? lo : v` into one max instruction
 * (NaN-exact: maxps returns its second operand for a NaN), where lane masks take four. */
ALWAYS_INLINE void clip_span(float *y, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) {
        float v = y[i];
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        y[i] = v;
    }
}

ALWAYS_INLINE void relu_span(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = y[i];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

ALWAYS_INLINE v8f act8(v8f v, const int act) {
    switch (act) {
    case ACT_SIGMOID: return sigmoid8(v);
    case ACT_TANH: return tanh8(v);
    case ACT_SWISH: return swish8(v);
    case ACT_GELU: return gelu8(v);
    default: return gelu_tanh8(v);
    }
}

/* GELU, sigmoid, tanh and swish over n floats in place, 8 lanes at a time on x86-64 (see DEFINE_GELU); 4
 * elsewhere, where 8-lane vectors are no wider than two registers.  tanh goes here only from the
 * stand-alone activations (elementwise.c), where tanh8 took half act_span's 4-lane time on AVX2
 * (6144 floats, an attention score's Add + Tanh in a decoder's Loop: 6.1 vs 12.8 us); the kernels'
 * epilogues keep act_span, whose inlined constants the depthwise tiles' register budget is held to. */
ALWAYS_INLINE void act8_span(float *y, int64_t n, const int act) {
#if defined(__x86_64__)
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vstore(y + i, act8(vload(y + i), act));
    if (i < n) {
        float t[VL] = {0};
        copy_short(t, y + i, (int)(n - i));
        vstore(t, act8(vload(t), act));
        copy_short(y + i, t, (int)(n - i));
    }
#else
    act_span_k(y, n, act, 0.0f, 0.0f);
#endif
}

ALWAYS_INLINE void act_span(float *y, int64_t n, int act, float alpha, float beta) {
    switch (act) {
    case ACT_RELU: relu_span(y, n); break;
    case ACT_CLIP: clip_span(y, n, alpha, beta); break;
    case ACT_LEAKY_RELU: act_span_k(y, n, ACT_LEAKY_RELU, alpha, beta); break;
    case ACT_SIGMOID: act8_span(y, n, ACT_SIGMOID); break;
    case ACT_TANH: act_span_k(y, n, ACT_TANH, alpha, beta); break;
    case ACT_HARD_SIGMOID: act_span_k(y, n, ACT_HARD_SIGMOID, alpha, beta); break;
    case ACT_HARD_SWISH: act_span_k(y, n, ACT_HARD_SWISH, alpha, beta); break;
    case ACT_SWISH: act8_span(y, n, ACT_SWISH); break;
    case ACT_GELU: act8_span(y, n, ACT_GELU); break;
    case ACT_GELU_TANH: act8_span(y, n, ACT_GELU_TANH); break;
    default: break;
    }
}

/* Even lanes of the 16 floats at p (the stride-2 deinterleave of the depthwise scratch). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define HAVE_SHUFFLE 1
ALWAYS_INLINE v8f vload_even(const float *p) {
    v8f a = vload(p), b = vload(p + VL);
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
}
/* ... and the odd lanes (2x2 max pooling takes both phases of a row at once). */
ALWAYS_INLINE v8f vload_odd(const float *p) {
    v8f a = vload(p), b = vload(p + VL);
    return __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif
#endif

/* np.maximum lane by lane: the larger, or a NaN of either.  Compared in 4-lane halves taken with
 * shuffles (registers, not the stack: a memcpy into halves went through memory and stalled on
 * store forwarding, 2x the whole pooling's time); without shuffles, 8-lane compares. */
ALWAYS_INLINE v4f max4_nan(v4f a, v4f b) { return sel4((a > b) | (a != a), a, b); }
ALWAYS_INLINE v8f vmax_nan(v8f a, v8f b) {
#ifdef HAVE_SHUFFLE
    v4f lo = max4_nan(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(b, b, 0, 1, 2, 3));
    v4f hi = max4_nan(__builtin_shufflevector(a, a, 4, 5, 6, 7), __builtin_shufflevector(b, b, 4, 5, 6, 7));
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
#else
    v8i m = (a > b) | (a != a);
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
#endif
}

#ifdef HAVE_SHUFFLE
/* r[i][j] <-> r[j][i] for eight 8-float vectors: unpack pairs, then pairs of pairs, then halves
 * (24 shuffles; what AVX does with unpcklps / shufps / vperm2f128). */
ALWAYS_INLINE void transpose8(v8f r[8]) {
    v8f a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) {
            b[i + j] = __builtin_shufflevector(a[i + j], a[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            b[i + j + 2] = __builtin_shufflevector(a[i + j], a[i + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    /* b[0..3] hold columns (0, 4), (2, 6), (1, 5), (3, 7) of rows 0-3 in their halves; b[4..7] of rows 4-7 */
    const int col[4] = {0, 2, 1, 3};
    for (int k = 0; k < 4; k++) {
        r[col[k]] = __builtin_shufflevector(b[k], b[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[col[k] + 4] = __builtin_shufflevector(b[k], b[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}
#endif

/* x86-64: an AVX2+FMA clone of each hot function next to the baseline one, picked by the loader
 * (ifunc) on the CPU it runs on; no -march=native, so a built package can move between machines. */
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(OPTCLI_NO_CLONES) && \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 14))
#define HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT_CLONES
#endif

#endif
