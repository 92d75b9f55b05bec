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

HOT_CLONES static void quantize_item(void *ctx, int64_t it) {
    const quant_t *q = ctx;
    const int64_t s = it * CHUNK, e = s + CHUNK < q->n ? s + CHUNK : q->n;
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
