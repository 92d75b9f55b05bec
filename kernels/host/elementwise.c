/* Stand-alone element-wise activations (GELU, sigmoid, hard-swish...) over a flat array, sums of
 * two arrays of one shape with an activation (residual Add + Relu in one pass), the mean
 * of each row (global average pooling, squeeze-excite's ReduceMean), and LayerNormalization, on
 * the pool.
 *
 * The activations are the fused epilogue's (simd.h), applied to a tensor no producer could take
 * them from: numpy's erf and boolean-mask sigmoid cost 10-40x a vector pass.
 *
 * LayerNormalization normalises rows of C values.  Two memory orders come up: rows contiguous
 * (inner = 1: transformers, ConvNeXt's channels-last blocks), and C as the middle axis of
 * [outer, C, inner] (inner > 1: ConvNeXt's LayerNorm2d, exported as Transpose -> LayerNorm ->
 * Transpose over an NCHW tensor, whose rows are strided by H*W).  The second is vectorised
 * across the inner positions, so the transposes stay views and nothing is copied.
 * Mean and variance take two passes over the data (in cache), as numpy's reference does, so a
 * large mean does not cancel the variance away.
 */
#include "optcli_native.h"
#include "simd.h"

#define ACT_CHUNK 8192 /* floats per work item of the activations: 32 KiB */
#define ACT_BLOCK 512  /* floats copied then activated while in L1 */

typedef struct {
    const float *x, *b; /* b: the second operand of a sum, or NULL */
    float *y;
    int64_t n;
    int64_t nb; /* b's length: b repeats every nb floats of x (nb == n: the same shape) */
    int act;
    float alpha, beta;
} act_t;

HOT_CLONES static void act_item(void *ctx, int64_t it) {
    const act_t *a = ctx;
    int64_t end = (it + 1) * ACT_CHUNK < a->n ? (it + 1) * ACT_CHUNK : a->n;
    for (int64_t i = it * ACT_CHUNK; i < end; i += ACT_BLOCK) {
        int64_t len = end - i < ACT_BLOCK ? end - i : ACT_BLOCK;
        if (a->b) {
            /* in runs that stay within one period of b (all of the block where b is as long as x) */
            for (int64_t j0 = 0; j0 < len;) {
                int64_t off = (i + j0) % a->nb, run = a->nb - off < len - j0 ? a->nb - off : len - j0;
                const float *x = a->x + i + j0, *b = a->b + off;
                float *y = a->y + i + j0;
                int64_t j = 0;
                for (; j + VL <= run; j += VL) vstore(y + j, vload(x + j) + vload(b + j));
                for (; j < run; j++) y[j] = x[j] + b[j];
                j0 += run;
            }
        } else if (a->x != a->y) {
            memcpy(a->y + i, a->x + i, (size_t)len * sizeof(float));
        }
        if (a->act == ACT_TANH)
            act8_span(a->y + i, len, ACT_TANH); /* 8 lanes: half act_span's time (simd.h) */
        else
            act_span(a->y + i, len, a->act, a->alpha, a->beta);
    }
}

/* The activations and sums over n floats on the pool: below 128 KiB, waking a worker costs more
 * than it saves. */
static int run_act(act_t *a) {
    if (a->n < 0 || a->act < 0 || a->act >= ACT_COUNT) return OPT_EINVAL;
    opt_parallel(act_item, a, (a->n + ACT_CHUNK - 1) / ACT_CHUNK, a->n < (1 << 15) ? 1 : 0);
    return 0;
}

OPT_API int optcli_activation_f32(const float *x, float *y, int64_t n, int act, float alpha, float beta) {
    act_t a = {.x = x, .y = y, .n = n, .nb = n, .act = act, .alpha = alpha, .beta = beta};
    return run_act(&a);
}

OPT_API int optcli_add_f32(const float *x, const float *b, float *y, int64_t n, int act, float alpha, float beta) {
    if (!b) return OPT_EINVAL;
    act_t a = {.x = x, .b = b, .y = y, .n = n, .nb = n, .act = act, .alpha = alpha, .beta = beta};
    return run_act(&a);
}

/* y = act(x + b) with b of nb floats repeated along x (n a multiple of nb: a bias row [C] or a
 * [T, C] block added to [..., T, C], numpy's broadcast of trailing dims), one pass: a decoder's
 * attention Add of [1, 1, 96] to [1, 64, 96] and its Tanh took numpy's add and a second call. */
OPT_API int optcli_add_period_f32(const float *x, const float *b, float *y, int64_t n, int64_t nb, int act, float alpha,
                                  float beta) {
    if (!b || nb < 1 || n < 0 || n % nb) return OPT_EINVAL;
    act_t a = {.x = x, .b = b, .y = y, .n = n, .nb = nb, .act = act, .alpha = alpha, .beta = beta};
    return run_act(&a);
}

ALWAYS_INLINE float hsum(v8f v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}

typedef struct {
    const float *x;
    float *y;
    int64_t n, rows; /* row length; rows per work item */
    int64_t total;
} mean_t;

/* Blocks of 1024 summed in 8 float lanes, the block sums in double: float32 lanes alone would lose
 * digits on a 112 x 112 plane, pairwise summation (numpy's) costs 4x this. */
ALWAYS_INLINE float row_mean(const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t b = 0; b < n; b += 1024) {
        int64_t e = b + 1024 < n ? b + 1024 : n, i = b;
        v8f acc = vsplat(0.0f);
        for (; i + VL <= e; i += VL) acc += vload(x + i);
        float part = hsum(acc);
        for (; i < e; i++) part += x[i];
        sum += part;
    }
    return (float)(sum / (double)n);
}

HOT_CLONES static void mean_item(void *ctx, int64_t it) {
    const mean_t *a = ctx;
    int64_t end = (it + 1) * a->rows < a->total ? (it + 1) * a->rows : a->total;
    for (int64_t r = it * a->rows; r < end; r++) a->y[r] = row_mean(a->x + r * a->n, a->n);
}

OPT_API int optcli_row_mean_f32(const float *x, float *y, int64_t rows, int64_t n) {
    if (rows < 0 || n < 1) return OPT_EINVAL;
    mean_t a = {.x = x, .y = y, .n = n, .total = rows};
    a.rows = n >= 8192 ? 1 : 8192 / n; /* about 32 KiB of input per item */
    /* a sum is ~0.05 ns a float: below 4 MiB waking a worker (10-20 us) costs more than it saves */
    opt_parallel(mean_item, &a, (rows + a.rows - 1) / a.rows, rows * n < (1 << 20) ? 1 : 0);
    return 0;
}

typedef struct {
    const float *x, *scale, *bias;
    float *y, *mean, *inv;
    int64_t outer, c, inner;
    int64_t rows;   /* rows per work item (inner == 1) */
    int64_t blocks; /* work items per outer index (inner > 1) */
    int64_t group;  /* column blocks per work item (inner > 1) */
    float eps;
} ln_t;

/* 1 / sqrt(v) for v >= eps > 0 without libm (a static aarch64 build has no -lm): the bit-level
 * first guess and three Newton steps, within 2 ulp; an overflowed variance (inf) gives 0, as numpy's
 * 1 / sqrt(inf) does. */
ALWAYS_INLINE float rsqrt_pos(float v) {
    int32_t i;
    memcpy(&i, &v, sizeof i);
    i = 0x5f375a86 - (i >> 1);
    float y;
    memcpy(&y, &i, sizeof y);
    for (int k = 0; k < 3; k++) y = y * (1.5f - 0.5f * v * y * y);
    return v > 3.4e38f ? 0.0f : y;
}

/* One contiguous row of c values. */
ALWAYS_INLINE void ln_row(const ln_t *a, int64_t r) {
    const int64_t c = a->c;
    const float *x = a->x + r * c;
    float *y = a->y + r * c;
    v8f acc = vsplat(0.0f);
    int64_t i = 0;
    for (; i + VL <= c; i += VL) acc += vload(x + i);
    float sum = hsum(acc);
    for (; i < c; i++) sum += x[i];
    const float mean = sum / (float)c;
    v8f vm = vsplat(mean);
    acc = vsplat(0.0f);
    for (i = 0; i + VL <= c; i += VL) {
        v8f d = vload(x + i) - vm;
        acc += d * d;
    }
    float ss = hsum(acc);
    for (; i < c; i++) ss += (x[i] - mean) * (x[i] - mean);
    const float inv = rsqrt_pos(ss / (float)c + a->eps);
    v8f vi = vsplat(inv);
    for (i = 0; i + VL <= c; i += VL) {
        v8f v = (vload(x + i) - vm) * vi * vload(a->scale + i);
        vstore(y + i, a->bias ? v + vload(a->bias + i) : v);
    }
    for (; i < c; i++) {
        float v = (x[i] - mean) * inv * a->scale[i];
        y[i] = a->bias ? v + a->bias[i] : v;
    }
    if (a->mean) a->mean[r] = mean;
    if (a->inv) a->inv[r] = inv;
}

HOT_CLONES static void ln_rows_item(void *ctx, int64_t it) {
    const ln_t *a = ctx;
    int64_t end = (it + 1) * a->rows < a->outer ? (it + 1) * a->rows : a->outer;
    for (int64_t r = it * a->rows; r < end; r++) ln_row(a, r);
}

#define LN_COLS (4 * VL) /* inner positions per block of the strided form: 4 vectors */

/* Columns [p, p + LN_COLS) of one [C, inner] slab, each normalised over its C values. */
ALWAYS_INLINE void ln_cols_full(const ln_t *a, const float *x, float *y, float *mean, float *inv) {
    const int64_t c = a->c, s = a->inner;
    v8f m[4] = {0}, q[4] = {0}, rc = vsplat(1.0f / (float)c);
    for (int64_t k = 0; k < c; k++)
        for (int j = 0; j < 4; j++) m[j] += vload(x + k * s + j * VL);
    for (int j = 0; j < 4; j++) m[j] *= rc;
    for (int64_t k = 0; k < c; k++)
        for (int j = 0; j < 4; j++) {
            v8f d = vload(x + k * s + j * VL) - m[j];
            q[j] += d * d;
        }
    for (int j = 0; j < 4; j++) {
        v8f var = q[j] * rc + a->eps;
        for (int l = 0; l < VL; l++) q[j][l] = rsqrt_pos(var[l]);
    }
    for (int64_t k = 0; k < c; k++) {
        v8f g = vsplat(a->scale[k]), b = vsplat(a->bias ? a->bias[k] : 0.0f);
        for (int j = 0; j < 4; j++) vstore(y + k * s + j * VL, (vload(x + k * s + j * VL) - m[j]) * q[j] * g + b);
    }
    if (mean)
        for (int j = 0; j < 4; j++) vstore(mean + j * VL, m[j]);
    if (inv)
        for (int j = 0; j < 4; j++) vstore(inv + j * VL, q[j]);
}

/* The same for one column at a time (the last, partial block). */
static void ln_col(const ln_t *a, const float *x, float *y, float *mean, float *inv) {
    const int64_t c = a->c, s = a->inner;
    float sum = 0.0f, ss = 0.0f;
    for (int64_t k = 0; k < c; k++) sum += x[k * s];
    const float m = sum / (float)c;
    for (int64_t k = 0; k < c; k++) ss += (x[k * s] - m) * (x[k * s] - m);
    const float r = rsqrt_pos(ss / (float)c + a->eps);
    for (int64_t k = 0; k < c; k++) y[k * s] = (x[k * s] - m) * r * a->scale[k] + (a->bias ? a->bias[k] : 0.0f);
    if (mean) *mean = m;
    if (inv) *inv = r;
}

/* A work item of the strided form: a run of whole column blocks of one slab, and the slab's last
 * columns when they do not fill a block, as one more block ending at the slab's end: it overlaps
 * the item's own last block, so no other thread writes those columns.  Slabs narrower than a
 * block go one column at a time. */
HOT_CLONES static void ln_cols_item(void *ctx, int64_t it) {
    const ln_t *a = ctx;
    const int64_t s = a->inner, full = s / LN_COLS, o = it / a->blocks;
    const float *x = a->x + o * a->c * s;
    float *y = a->y + o * a->c * s, *mean = a->mean ? a->mean + o * s : NULL, *inv = a->inv ? a->inv + o * s : NULL;
    if (full == 0) {
        for (int64_t p = 0; p < s; p++) ln_col(a, x + p, y + p, mean ? mean + p : NULL, inv ? inv + p : NULL);
        return;
    }
    int64_t b0 = it % a->blocks * a->group, b1 = b0 + a->group < full ? b0 + a->group : full;
    for (int64_t p = b0 * LN_COLS; p < b1 * LN_COLS; p += LN_COLS)
        ln_cols_full(a, x + p, y + p, mean ? mean + p : NULL, inv ? inv + p : NULL);
    if (b1 == full && s % LN_COLS) {
        int64_t p = s - LN_COLS;
        ln_cols_full(a, x + p, y + p, mean ? mean + p : NULL, inv ? inv + p : NULL);
    }
}

OPT_API int optcli_layer_norm_f32(const float *x, const float *scale, const float *bias, float *y, float *mean,
                                  float *inv, int64_t outer, int64_t c, int64_t inner, float eps) {
    if (outer < 0 || c < 1 || inner < 1 || !scale || !(eps > 0.0f)) return OPT_EINVAL;
    if (outer == 0) return 0;
    ln_t a = {.x = x, .scale = scale, .bias = bias, .y = y, .mean = mean, .inv = inv, .outer = outer, .c = c,
              .inner = inner, .eps = eps};
    /* ~0.25 ns a float: below 1 MiB (a 40 x 56 x 56 ConvNeXt stage: 29 us alone, 37 us on two
     * threads) waking a worker costs more than it saves */
    int single = outer * c * inner < (1 << 18);
    if (inner == 1) {
        a.rows = c >= 4096 ? 1 : 4096 / c; /* about 16 KiB of rows per item */
        opt_parallel(ln_rows_item, &a, (outer + a.rows - 1) / a.rows, single);
    } else {
        /* items of about 8 K floats: a block's 32 columns of a few dozen channels are too little
         * for a take from the pool, and neighbouring blocks share cache lines */
        int64_t full = inner / LN_COLS;
        a.group = c * LN_COLS >= 8192 ? 1 : 8192 / (c * LN_COLS);
        a.blocks = full ? (full + a.group - 1) / a.group : 1;
        opt_parallel(ln_cols_item, &a, outer * a.blocks, single);
    }
    return 0;
}

/* Half-precision storage for a GPU upload or download (runtime/gpu_common/device_buffers.py):
 * float32 -> IEEE binary16 rounding to nearest even, finite values beyond the half range saturating
 * to +-65504 (an attention mask's -3.4e38 stays "minus a lot", not -inf) while infinities and NaN
 * stay what they are; and binary16 -> float32, exactly.  numpy's casts took 1.3 ms for one 224x224
 * RGB image (8 ns a value), most of an fp16 GPU run's host time on an H100.  GCC 12 does not
 * vectorize _Float16 conversions (one vcvtps2ph per value, ~2 ns), so x86-64 with F16C takes 8
 * values per instruction through intrinsics (~0.15 ns a value, 10x), the one place this library
 * uses them.  Where the compiler has no _Float16 both return OPT_ENOTSUP and numpy's casts run. */
#ifdef __FLT16_MAX__
ALWAYS_INLINE _Float16 half_saturated(float v) {
    float c = v > 65504.0f ? 65504.0f : (v < -65504.0f ? -65504.0f : v); /* NaN: both false, stays */
    return (_Float16)(v - v == 0.0f ? c : v);                            /* inf - inf is NaN: kept */
}

static void to_half(const float *x, _Float16 *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = half_saturated(x[i]);
}

static void from_half(const _Float16 *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void to_half_f16c(const float *x, _Float16 *y, int64_t n) {
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 c = _mm256_min_ps(hi, _mm256_max_ps(lo, v)); /* a NaN v: max_ps gives its 2nd operand, v */
        __m256 finite = _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_EQ_OQ);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_blendv_ps(v, c, finite), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) y[i] = half_saturated(x[i]);
}

__attribute__((target("avx2,f16c"))) static void from_half_f16c(const _Float16 *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = (float)x[i];
}

static int has_f16c(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return known;
}
#endif
#endif

OPT_API int optcli_f32_to_f16(const float *x, void *y, int64_t n) {
    if (n < 0 || (n && (!x || !y))) return OPT_EINVAL;
#ifdef __FLT16_MAX__
#if defined(__x86_64__) && defined(__GNUC__)
    if (has_f16c()) {
        to_half_f16c(x, (_Float16 *)y, n);
        return 0;
    }
#endif
    to_half(x, (_Float16 *)y, n);
    return 0;
#else
    return OPT_ENOTSUP;
#endif
}

OPT_API int optcli_f16_to_f32(const void *x, float *y, int64_t n) {
    if (n < 0 || (n && (!x || !y))) return OPT_EINVAL;
#ifdef __FLT16_MAX__
#if defined(__x86_64__) && defined(__GNUC__)
    if (has_f16c()) {
        from_half_f16c((const _Float16 *)x, y, n);
        return 0;
    }
#endif
    from_half((const _Float16 *)x, y, n);
    return 0;
#else
    return OPT_ENOTSUP;
#endif
}

/* Softmax along rows of n contiguous floats: exp(x - max) / sum, as numpy's three passes make it
 * but in one call (an attention's [heads, tokens, tokens] scores took ~9 us of numpy calls around
 * ~1 us of arithmetic).  exp is EXP_SMALL_BODY's (simd.h: Cephes' polynomial, relative error
 * ~1e-7) on x - max <= 0, clamped at -104 where exp is below every float; the sum in 8 float
 * lanes.  A row whose max is not finite (a NaN anywhere, +inf, or all -inf) is NaN throughout, as
 * numpy's inf - inf and NaN propagation make it. */
#define SOFTMAX_STRIDED_MAX_N 4096 /* rows softmax_mid takes (its scalar tail copies one into the stack) */

typedef struct {
    const float *x;
    float *y;
    int64_t n, rows, total; /* row length; rows per work item; rows in all */
} softmax_t;

ALWAYS_INLINE v8f exp_nonpos8(v8f a) {
    v8i keep = a >= vsplat(-104.0f);
    a = (v8f)(((v8i)a & keep) | ((v8i)vsplat(-104.0f) & ~keep));
    EXP_SMALL_BODY(v8f, v8i, a)
    return y;
}

ALWAYS_INLINE void softmax_row(const float *x, float *y, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) {
        float v = x[i];
        if (v > m || v != v) m = v;
        if (m != m) break;
    }
    if (!(m - m == 0.0f)) { /* NaN or an infinity: numpy's row is NaN */
        for (int64_t i = 0; i < n; i++) y[i] = __builtin_nanf("");
        return;
    }
    v8f mv = vsplat(m);
    double sum = 0.0; /* blocks of 1024 summed in float lanes, the blocks in double (as row_mean) */
    int64_t i = 0;
    while (i + VL <= n) {
        v8f acc = vsplat(0.0f);
        for (int64_t e_ = i + 1024 < n ? i + 1024 : n; i + VL <= e_; i += VL) {
            v8f e = exp_nonpos8(vload(x + i) - mv);
            vstore(y + i, e);
            acc += e;
        }
        sum += hsum(acc);
    }
    if (i < n) {
        float t[VL];
        for (int j = 0; j < VL; j++) t[j] = i + j < n ? x[i + j] - m : -104.0f;
        v8f e = exp_nonpos8(vload(t));
        vstore(t, e);
        for (int64_t j = 0; i + j < n; j++) {
            y[i + j] = t[j];
            sum += t[j];
        }
    }
    const float r = (float)(1.0 / sum);
    v8f inv = vsplat(r);
    for (i = 0; i + VL <= n; i += VL) vstore(y + i, vload(y + i) * inv);
    for (; i < n; i++) y[i] *= r;
}

HOT_CLONES static void softmax_item(void *ctx, int64_t it) {
    const softmax_t *a = ctx;
    int64_t end = (it + 1) * a->rows < a->total ? (it + 1) * a->rows : a->total;
    for (int64_t r = it * a->rows; r < end; r++) softmax_row(a->x + r * a->n, a->y + r * a->n, a->n);
}

OPT_API int optcli_softmax_f32(const float *x, float *y, int64_t rows, int64_t n) {
    if (rows < 0 || n < 1) return OPT_EINVAL;
    softmax_t a = {.x = x, .y = y, .n = n, .total = rows};
    a.rows = n >= 4096 ? 1 : 4096 / n; /* about 16 KiB of input per item */
    /* ~1 ns a float: below 64 K floats one thread does it before a worker would wake */
    opt_parallel(softmax_item, &a, (rows + a.rows - 1) / a.rows, rows * n < (1 << 16) ? 1 : 0);
    return 0;
}

/* Softmax along the middle axis of [outer, n, inner] (a segmentation head's classes over [C, H, W],
 * a YOLOv8 head's 16 distribution bins): each lane of a vector is one inner position, its row n
 * floats strided by inner (softmax_chunk); the same exp and NaN / infinity rules as softmax_row, the
 * sums in float lanes (rows of at most SOFTMAX_STRIDED_MAX_N: the caller takes longer ones elsewhere). */
typedef struct {
    const float *x;
    float *y;
    int64_t n, inner, chunks, chunk; /* chunk: inner positions per work item (SOFTMAX_MID_CHUNK, or all of inner) */
} softmax_mid_t;

#define SOFTMAX_MID_CHUNK 256 /* inner positions a work item sweeps each row for (its max and sum in L1) */

/* Positions [j0, j0 + w) (w a multiple of VL, at most SOFTMAX_MID_CHUNK) of one outer index: three
 * sweeps down the n rows, each along the chunk's contiguous positions (a row at a time, where one
 * vector of positions going down all rows read n lines from n distant rows: slower than numpy on a
 * [21, 128, 128] segmentation map). */
ALWAYS_INLINE void softmax_chunk(const float *x, float *y, int64_t n, int64_t inner, int64_t w) {
    float m[SOFTMAX_MID_CHUNK] __attribute__((aligned(32))), sum[SOFTMAX_MID_CHUNK] __attribute__((aligned(32)));
    for (int64_t j = 0; j < w; j += VL) vstore(m + j, vload(x + j));
    for (int64_t r = 1; r < n; r++) {
        const float *xr = x + r * inner;
        for (int64_t j = 0; j < w; j += VL) {
            v8f v = vload(xr + j), mv = vload(m + j);
            v8i take = (v > mv) | (v != v);
            vstore(m + j, (v8f)((take & (v8i)v) | (~take & (v8i)mv)));
        }
    }
    for (int64_t j = 0; j < w; j += VL) { /* a NaN or infinite max: its lane's row is NaN (sum set to NaN) */
        v8f mv = vload(m + j);
        v8i bad = ~((mv - mv) == vsplat(0.0f));
        vstore(m + j, (v8f)(~bad & (v8i)mv));
        vstore(sum + j, (v8f)(bad & (v8i)vsplat(__builtin_nanf(""))));
    }
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * inner;
        float *yr = y + r * inner;
        for (int64_t j = 0; j < w; j += VL) {
            v8f e = exp_nonpos8(vload(xr + j) - vload(m + j));
            vstore(yr + j, e);
            vstore(sum + j, vload(sum + j) + e);
        }
    }
    for (int64_t j = 0; j < w; j += VL) vstore(sum + j, vsplat(1.0f) / vload(sum + j));
    for (int64_t r = 0; r < n; r++) {
        float *yr = y + r * inner;
        for (int64_t j = 0; j < w; j += VL) vstore(yr + j, vload(yr + j) * vload(sum + j));
    }
}

HOT_CLONES static void softmax_mid_item(void *ctx, int64_t it) {
    const softmax_mid_t *a = ctx;
    const int64_t o = it / a->chunks, j0 = it % a->chunks * a->chunk;
    const int64_t j1 = j0 + a->chunk < a->inner ? j0 + a->chunk : a->inner;
    const float *x = a->x + o * a->n * a->inner;
    float *y = a->y + o * a->n * a->inner;
    int64_t j = j0;
    for (; j + VL <= j1; j += SOFTMAX_MID_CHUNK) {
        int64_t w = (j1 - j) / VL * VL;
        if (w > SOFTMAX_MID_CHUNK) w = SOFTMAX_MID_CHUNK;
        softmax_chunk(x + j, y + j, a->n, a->inner, w);
        if (w < SOFTMAX_MID_CHUNK) {
            j += w;
            break;
        }
    }
    for (; j < j1; j++) { /* the last positions (fewer than a vector), one row each through the stack */
        float row[SOFTMAX_STRIDED_MAX_N], out[SOFTMAX_STRIDED_MAX_N];
        for (int64_t r = 0; r < a->n; r++) row[r] = x[j + r * a->inner];
        softmax_row(row, out, a->n);
        for (int64_t r = 0; r < a->n; r++) y[j + r * a->inner] = out[r];
    }
}

OPT_API int optcli_softmax_mid_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner) {
    if (outer < 0 || n < 1 || n > SOFTMAX_STRIDED_MAX_N || inner < 1 || x == y) return OPT_EINVAL;
    softmax_mid_t a = {.x = x, .y = y, .n = n, .inner = inner};
    a.chunk = SOFTMAX_MID_CHUNK; /* positions per item: a multiple of VL */
    if (a.chunk > inner) a.chunk = inner;
    a.chunks = (inner + a.chunk - 1) / a.chunk;
    opt_parallel(softmax_mid_item, &a, outer * a.chunks, outer * n * inner < (1 << 16) ? 1 : 0);
    return 0;
}
