/* Quantized element-wise ops (optcli.QAdd, optcli/ops/qadd.py): the residual Adds of quantized
 * models, u8 / s8 in and out, so a residual block's tensors stay bytes between integer convs.
 *
 * The arithmetic is onnxruntime's QLinearAdd (MLAS, x86): each operand's scale ratio to the output
 * scale and all zero points folded into float32 fused multiply-adds,
 *     r = fma(a, a_scale / y_scale, fma(b, b_scale / y_scale, y_zp - (ra * a_zp + rb * b_zp))),
 * clamped to [qmin, qmax] (the output dtype, narrowed by a fused Relu) and rounded half to even.
 * The ratios and the constant term come from the caller, computed in float32 as the numpy reference
 * does (optcli/ops/qadd.py).  fmaf is one instruction in the AVX2/FMA clone and on aarch64, a libm
 * call (slow, exact) on x86-64 CPUs without FMA. */
#include <math.h>
#include <stdint.h>

#include "optcli_native.h"
#include "simd.h"

#define CHUNK 16384 /* elements per work item */

typedef struct {
    const uint8_t *a, *b;
    uint8_t *y;
    int64_t n;
    float ra, rb, fixed, lo, hi;
    int as, bs;
} qadd_t;

/* Locals and restrict pointers: a store through a uint8_t pointer may alias anything, the struct
 * included, and would keep the compiler from vectorising the loop. */
#define QADD_LOOP(TA, TB)                                                                  \
    do {                                                                                   \
        const TA *restrict a = (const TA *)q->a;                                           \
        const TB *restrict b = (const TB *)q->b;                                           \
        uint8_t *restrict y = q->y;                                                        \
        const float ra = q->ra, rb = q->rb, fixed = q->fixed, lo = q->lo, hi = q->hi;      \
        for (int64_t i = s; i < e; i++) {                                                  \
            float r = fmaf((float)a[i], ra, fmaf((float)b[i], rb, fixed));                 \
            r = r > lo ? r : lo; /* in maxps / minps's operand order: one instruction each */ \
            r = r < hi ? r : hi;                                                           \
            y[i] = (uint8_t)(int32_t)rintf(r); /* within the output dtype: its byte */     \
        }                                                                                  \
    } while (0)

HOT_CLONES static void qadd_item(void *ctx, int64_t it) {
    const qadd_t *q = ctx;
    const int64_t s = it * CHUNK, e = s + CHUNK < q->n ? s + CHUNK : q->n;
    if (!q->as && !q->bs) {
        QADD_LOOP(uint8_t, uint8_t);
    } else if (q->as && q->bs) {
        QADD_LOOP(int8_t, int8_t);
    } else if (q->as) {
        QADD_LOOP(int8_t, uint8_t);
    } else {
        QADD_LOOP(uint8_t, int8_t);
    }
}

OPT_API int optcli_qadd(const void *a, const void *b, void *y, int64_t n, const float *p, const int32_t *flags) {
    if (n < 0 || !(p[3] <= p[4]) || p[3] < -128.0f || p[4] > 255.0f) return OPT_EINVAL;
    if (n == 0) return 0;
    qadd_t q = {.a = a, .b = b, .y = y, .n = n, .ra = p[0], .rb = p[1], .fixed = p[2], .lo = p[3], .hi = p[4],
                .as = flags[0] != 0, .bs = flags[1] != 0};
    opt_parallel(qadd_item, &q, (n + CHUNK - 1) / CHUNK, 0);
    return 0;
}

/* QuantizeLinear, per tensor, float32 to u8 / s8, as the numpy kernel (optcli/ops/quant.py) and onnxruntime
 * compute it: rint(x / scale) in float32 (a division, not a product by 1 / scale: they differ at ties),
 * plus the zero point, clamped to [lo, hi] (the dtype's range); a NaN gives 0, as numpy's cast does. */
typedef struct {
    const float *x;
    uint8_t *y;
    int64_t n;
    float scale, zp, lo, hi;
} quant_t;

static int wide_path = 0; /* 0: by the CPU, 1: the portable loops (tests: optcli_lookup_variant) */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(OPTCLI_NO_VBMI)
#include <immintrin.h>
#define QUANT_AVX512 1
/* 16 floats a step: the input quantization of an integer plan is bound by its divisions (a float32 division, not
 * a product by 1 / scale, to give numpy's and onnxruntime's bytes at ties), and the x86-64-v3 clone's loop ran
 * 8 of them at a time (a 224x224x3 image took ~29 us).  The same steps as the loop below: round half to even,
 * plus the zero point, max then min (a NaN becomes lo, as there), a NaN lane's byte 0. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quantize_avx512(const float *x, uint8_t *y, int64_t n,
                                                                                float scale, float zp, float lo,
                                                                                float hi) {
    const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps(zp), vlo = _mm512_set1_ps(lo);
    const __m512 vhi = _mm512_set1_ps(hi);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, x + i);
        __m512 r = _mm512_add_ps(_mm512_roundscale_ps(_mm512_div_ps(v, vs), _MM_FROUND_TO_NEAREST_INT |
                                                                                   _MM_FROUND_NO_EXC), vz);
        const __mmask16 ok = _mm512_cmp_ps_mask(r, r, _CMP_ORD_Q);
        r = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
        _mm_mask_storeu_epi8(y + i, in, _mm512_maskz_cvtepi32_epi8(ok, _mm512_cvtps_epi32(r)));
    }
}
static int has_avx512(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    }
    return known;
}
#endif

HOT_CLONES static void quantize_item(void *ctx, int64_t it) {
    const quant_t *q = ctx;
    const int64_t s = it * CHUNK, e = s + CHUNK < q->n ? s + CHUNK : q->n;
#ifdef QUANT_AVX512
    if (wide_path == 0 && has_avx512()) {
        quantize_avx512(q->x + s, q->y + s, e - s, q->scale, q->zp, q->lo, q->hi);
        return;
    }
#endif
    const float *restrict x = q->x;
    uint8_t *restrict y = q->y;
    const float scale = q->scale, zp = q->zp, lo = q->lo, hi = q->hi;
    for (int64_t i = s; i < e; i++) {
        float r = rintf(x[i] / scale) + zp;
        const int nan = r != r;
        r = r > lo ? r : lo;
        r = r < hi ? r : hi;
        y[i] = nan ? 0 : (uint8_t)(int32_t)r; /* r is an integer within the dtype: its byte */
    }
}

OPT_API int optcli_quantize_f32(const float *x, void *y, int64_t n, float scale, float zp, float lo, float hi) {
    if (n < 0 || !(lo <= hi) || lo < -128.0f || hi > 255.0f) return OPT_EINVAL;
    if (n == 0) return 0;
    quant_t q = {.x = x, .y = y, .n = n, .scale = scale, .zp = zp, .lo = lo, .hi = hi};
    opt_parallel(quantize_item, &q, (n + CHUNK - 1) / CHUNK, 0);
    return 0;
}

/* DequantizeLinear, per tensor, u8 / s8 to float32: (x - zp) * scale in float32.  Both factors are exact
 * float32 values, so the product is the correctly rounded one that the numpy kernel gets by computing in
 * float64 and casting (optcli/ops/quant.py): the same bits.  The output of an integer plan (issue 26). */
typedef struct {
    const uint8_t *x;
    float *y;
    int64_t n;
    float scale;
    int32_t zp;
    int xs;
} dequant_t;

HOT_CLONES static void dequantize_item(void *ctx, int64_t it) {
    const dequant_t *q = ctx;
    const int64_t len = q->n - it * CHUNK < CHUNK ? q->n - it * CHUNK : CHUNK;
    const uint8_t *restrict x = q->x + it * CHUNK;
    float *restrict y = q->y + it * CHUNK;
    const float scale = q->scale;
    const int32_t zp = q->zp;
    if (q->xs) {
        for (int64_t i = 0; i < len; i++) y[i] = (float)((int32_t)(int8_t)x[i] - zp) * scale;
    } else {
        for (int64_t i = 0; i < len; i++) y[i] = (float)((int32_t)x[i] - zp) * scale;
    }
}

OPT_API int optcli_dequantize_f32(const void *x, float *y, int64_t n, float scale, int32_t zp, int32_t x_signed) {
    if (n < 0 || zp < (x_signed ? -128 : 0) || zp > (x_signed ? 127 : 255)) return OPT_EINVAL;
    if (n == 0) return 0;
    dequant_t q = {.x = x, .y = y, .n = n, .scale = scale, .zp = zp, .xs = x_signed != 0};
    opt_parallel(dequantize_item, &q, (n + CHUNK - 1) / CHUNK, 0);
    return 0;
}

/* Byte table lookup (optcli.QLookup, optcli/ops/qlookup.py): y[i] = table[x[i]] over n bytes, the table
 * indexed by the input's raw byte (an s8 value v at entry (uint8_t)v).  A "float island" of a quantized
 * model (hard-swish, a hard-sigmoid gate: DequantizeLinear -> float ops -> QuantizeLinear) is an
 * element-wise function of one byte; passes/fuse_qdq_lookup.py tabulates it at compile time.
 * The portable loop is one load per byte; where the CPU has AVX-512 VBMI the 256-entry table is four
 * 64-byte registers and vpermi2b picks from two of them at a time, 64 bytes per step. */
typedef struct {
    const uint8_t *x;
    uint8_t *y;
    int64_t n;
    const uint8_t *table;
} lookup_t;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(OPTCLI_NO_VBMI)
#define LOOKUP_VBMI 1
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void lookup_vbmi(const uint8_t *x, uint8_t *y,
                                                                               int64_t n, const uint8_t *table) {
    const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
    const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i v = _mm512_loadu_si512(x + i);
        const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1); /* entries v & 127 of the low half */
        const __m512i hi = _mm512_permutex2var_epi8(t2, v, t3); /* and of the high half */
        const __mmask64 top = _mm512_movepi8_mask(v);           /* v >= 128 */
        _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(top, lo, hi));
    }
    if (i < n) {
        const __mmask64 rest = (__mmask64)-1 >> (64 - (n - i));
        const __m512i v = _mm512_maskz_loadu_epi8(rest, x + i);
        const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
        _mm512_mask_storeu_epi8(y + i, rest, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
}
static int lookup_has_vbmi(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
    }
    return known;
}
#endif

static void lookup_item(void *ctx, int64_t it) {
    const lookup_t *q = ctx;
    const int64_t s = it * CHUNK, e = s + CHUNK < q->n ? s + CHUNK : q->n;
#ifdef LOOKUP_VBMI
    if (wide_path == 0 && lookup_has_vbmi()) {
        lookup_vbmi(q->x + s, q->y + s, e - s, q->table);
        return;
    }
#endif
    const uint8_t *restrict x = q->x, *restrict table = q->table;
    uint8_t *restrict y = q->y;
    for (int64_t i = s; i < e; i++) y[i] = table[x[i]];
}

OPT_API int optcli_lookup_u8(const void *x, void *y, int64_t n, const uint8_t *table) {
    if (n < 0 || (n > 0 && (x == NULL || y == NULL || table == NULL))) return OPT_EINVAL;
    if (n == 0) return 0;
    lookup_t q = {.x = x, .y = y, .n = n, .table = table};
    opt_parallel(lookup_item, &q, (n + CHUNK - 1) / CHUNK, 0);
    return 0;
}

OPT_API int optcli_lookup_variant(int which) {
    if (which == 0 || which == 1) wide_path = which;
    else if (which != -1) return -1;
#ifdef LOOKUP_VBMI
    return wide_path == 0 && lookup_has_vbmi() ? 2 : 1;
#else
    return 1;
#endif
}

/* The squeeze-excite multiply (optcli.QMul, optcli/ops/qmul.py): a quantized feature map x [rows, inner]
 * times a quantized gate g [rows] (one value per row: [N, C, 1, 1] against [N, C, H, W]), requantized:
 *     y = clamp(rint(float32((x - x_zp) * (g - g_zp)) * m) + y_zp, qmin, qmax),  m = x_scale * g_scale / y_scale
 * in float32, rounded half to even.  The integer product is exact (|.| <= 65536, exact in float32).
 * p: m, qmin, qmax; zp: x_zp, g_zp, y_zp, x signed, g signed. */
typedef struct {
    const uint8_t *x, *g;
    uint8_t *y;
    int64_t rows, inner, per_item;
    float m, lo, hi;
    int32_t xz, gz, yz, xs, gs;
} qmul_t;

#define QMUL_ROW(TX)                                                                                     \
    do {                                                                                                 \
        const TX *restrict x = (const TX *)q->x + r * inner;                                             \
        uint8_t *restrict y = q->y + r * inner;                                                          \
        for (int64_t i = 0; i < inner; i++) {                                                            \
            float v = (float)(((int32_t)x[i] - xz) * gv) * m;                                            \
            v = rintf(v) + yz;                                                                           \
            v = v > lo ? v : lo;                                                                         \
            v = v < hi ? v : hi;                                                                         \
            y[i] = (uint8_t)(int32_t)v;                                                                  \
        }                                                                                                \
    } while (0)

HOT_CLONES static void qmul_item(void *ctx, int64_t it) {
    const qmul_t *q = ctx;
    const int64_t s = it * q->per_item, e = s + q->per_item < q->rows ? s + q->per_item : q->rows;
    const int64_t inner = q->inner;
    const float m = q->m, lo = q->lo, hi = q->hi, yz = (float)q->yz;
    const int32_t xz = q->xz;
    for (int64_t r = s; r < e; r++) {
        const int32_t gv = (q->gs ? (int32_t)(int8_t)q->g[r] : (int32_t)q->g[r]) - q->gz;
        if (q->xs) QMUL_ROW(int8_t);
        else QMUL_ROW(uint8_t);
    }
}

OPT_API int optcli_qmul_rows(const void *x, const void *g, void *y, int64_t rows, int64_t inner, const float *p,
                             const int32_t *zp) {
    if (rows < 0 || inner < 0 || !(p[0] > 0.0f) || !(p[1] <= p[2]) || p[1] < -128.0f || p[2] > 255.0f)
        return OPT_EINVAL;
    if (zp[0] < (zp[3] ? -128 : 0) || zp[0] > (zp[3] ? 127 : 255) || zp[1] < (zp[4] ? -128 : 0) ||
        zp[1] > (zp[4] ? 127 : 255) || zp[2] < -128 || zp[2] > 255)
        return OPT_EINVAL;
    if (rows == 0 || inner == 0) return 0;
    const int64_t per_item = inner >= CHUNK ? 1 : CHUNK / inner;
    qmul_t q = {.x = x, .g = g, .y = y, .rows = rows, .inner = inner, .per_item = per_item, .m = p[0], .lo = p[1],
                .hi = p[2], .xz = zp[0], .gz = zp[1], .yz = zp[2], .xs = zp[3] != 0, .gs = zp[4] != 0};
    opt_parallel(qmul_item, &q, (rows + per_item - 1) / per_item, 0);
    return 0;
}

/* GlobalAveragePool on bytes (optcli.QGlobalAveragePool, optcli/ops/qmul.py), onnxruntime's
 * QLinearGlobalAveragePool: per row the exact integer sum of x - x_zp over inner values, then
 * y = clamp(rint(float32(sum) * m) + y_zp, qmin, qmax), m = x_scale / (y_scale * inner) in float32.
 * p: m, qmin, qmax; zp: x_zp, y_zp, x signed.  inner <= 2^23 keeps the sum (and its float) exact. */
typedef struct {
    const uint8_t *x;
    uint8_t *y;
    int64_t rows, inner, per_item;
    float m, lo, hi;
    int32_t xz, yz, xs;
} qgap_t;

HOT_CLONES static void qgap_item(void *ctx, int64_t it) {
    const qgap_t *q = ctx;
    const int64_t s = it * q->per_item, e = s + q->per_item < q->rows ? s + q->per_item : q->rows;
    const int64_t inner = q->inner;
    for (int64_t r = s; r < e; r++) {
        int32_t sum = 0;
        if (q->xs) {
            const int8_t *restrict x = (const int8_t *)q->x + r * inner;
            for (int64_t i = 0; i < inner; i++) sum += x[i];
        } else {
            const uint8_t *restrict x = q->x + r * inner;
            for (int64_t i = 0; i < inner; i++) sum += x[i];
        }
        sum -= q->xz * (int32_t)inner;
        float v = rintf((float)sum * q->m) + (float)q->yz;
        v = v > q->lo ? v : q->lo;
        v = v < q->hi ? v : q->hi;
        q->y[r] = (uint8_t)(int32_t)v;
    }
}

OPT_API int optcli_qgap_rows(const void *x, void *y, int64_t rows, int64_t inner, const float *p, const int32_t *zp) {
    if (rows < 0 || inner < 0 || inner > (1 << 23) || !(p[0] > 0.0f) || !(p[1] <= p[2]) || p[1] < -128.0f ||
        p[2] > 255.0f)
        return OPT_EINVAL;
    if (zp[0] < (zp[2] ? -128 : 0) || zp[0] > (zp[2] ? 127 : 255) || zp[1] < -128 || zp[1] > 255) return OPT_EINVAL;
    if (rows == 0) return 0;
    const int64_t per_item = inner >= CHUNK ? 1 : CHUNK / (inner ? inner : 1);
    qgap_t q = {.x = x, .y = y, .rows = rows, .inner = inner, .per_item = per_item, .m = p[0], .lo = p[1],
                .hi = p[2], .xz = zp[0], .yz = zp[1], .xs = zp[2] != 0};
    opt_parallel(qgap_item, &q, (rows + per_item - 1) / per_item, 0);
    return 0;
}
