/* Integer convolutions: u8 or s8 activations by s8 weights, accumulated exactly in s32, then
 * requantized to u8 or s8 in the same pass (optcli.QConv, optcli/ops/qconv.py).
 *
 * Why exact and why not vpmaddubsw: onnxruntime's QLinearConv accumulates exactly in int32, and
 * the plan must give its results within one quantization step.  vpmaddubsw sums two u8 x s8
 * products into a saturating int16 (255 * 127 * 2 > 32767): models whose weights use the full
 * s8 range would lose sums silently.  Here the activations are widened to int16 with their zero
 * point already subtracted (so padding is a plain 0) and vpmaddwd multiplies int16 pairs into
 * int32: (x - zp) * w pairs reach at most 2 * 255 * 128, and K * 255 * 128 stays in int32 up to
 * K = 65793 (the wrapper refuses more).  The plain C path computes the same integers.
 *
 * The GEMM: Y[m, col] = sum_k W[m, k] * X[k, col] per image and group, X the im2col matrix of the
 * input (a 1x1 conv with unit strides reads the input as it lies; the others gather from a centred,
 * zero-padded int16 copy made once per call).  A work item (image, group, band of columns, band of
 * rows) packs its columns into 16-column tiles of int16 pairs [tile][k / 2][16][2] (one vpmaddwd
 * operand per half tile and k pair) and runs 4-row x 16-column register tiles over them; W comes
 * pre-packed as int16 pairs (one int32 per two k, broadcast).  Depthwise convs (one input channel
 * per group) run direct, a channel per work item, two taps per vpmaddwd.
 *
 * The epilogue is onnxruntime's (MlasRequantizeOutput): float(acc + bias) * multiplier[m], clamped
 * in float to [qmin - zp, qmax - zp], rounded to nearest even, plus the zero point.  qmin and qmax
 * carry the output dtype's range narrowed by a fused Relu / Relu6 / Clip: clamping the quantized
 * value is the same as quantizing the clamped float, since rounding is monotone.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QG_X86 1
#include <immintrin.h>
#endif

#define TILE 16              /* columns per register tile and per packed tile */
#define MR 4                 /* rows per register tile */
#define PANEL_BYTES (96 * 1024) /* a band's packed columns: within the L2 beside its rows of W */

typedef struct {
    const uint8_t *x;   /* the input's bytes (u8 or s8 by xs) [N, C, H, W] */
    const int32_t *wp;  /* the GEMM's weights, int16 pairs [M, kp2] */
    const int8_t *wd;   /* depthwise weights [M, KH * KW] */
    const int32_t *bias;
    const float *mult;
    uint8_t *y;         /* u8 or s8 by ys [N, M, OH, OW] */
    int64_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW, G;
    int64_t cg, mg, K, kp2, P;
    int64_t nb, nn, mb, nm;
    int16_t *xpad;      /* the centred, zero-padded input [N, C, HP, WP] (NULL for pointwise convs) */
    const struct dw_geom *dwg; /* depthwise: the taps' offsets, shared by every channel */
    int64_t HP, WP;
    int32_t xzp, yzp, qmin, qmax;
    int xs, ys;
    _Atomic int failed;
} qconv_t;

static int g_avx2 = -1; /* -1 unknown, 0 the portable path, 1 AVX2; optcli_qgemm_variant sets it for the tests */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void pick(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    g_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    g_avx2 = 0;
#endif
}

OPT_API int optcli_qgemm_variant(int which) {
    pthread_once(&g_once, pick);
    if (which == 0) {
        pick();
    } else if (which == 1) {
        g_avx2 = 0;
    } else if (which == 2) {
#ifdef QG_X86
        if (!__builtin_cpu_supports("avx2")) return -1;
        g_avx2 = 1;
#else
        return -1;
#endif
    } else if (which != -1) {
        return -1;
    }
    return g_avx2 ? 2 : 1;
}

static inline int32_t centred(const qconv_t *q, const uint8_t *p) {
    return (q->xs ? (int32_t)(int8_t)*p : (int32_t)*p) - q->xzp;
}

/* n requantized values of output channel m into dst, as onnxruntime's MlasRequantizeOutput computes
 * them: float(acc + bias) * multiplier, clamped in float, rounded to nearest even (rintf in the default
 * rounding mode: one instruction where SSE4.1 or NEON has it; nearbyintf saves and restores the
 * floating-point environment, a libm call per value), plus the zero point.  The clamp sits between
 * the product and the rounding, so no FMA can fuse them. */
static inline void requant_row(const qconv_t *q, const int32_t *acc, int64_t n, int64_t m, uint8_t *dst) {
    const uint32_t b = q->bias ? (uint32_t)q->bias[m] : 0u;
    const float mult = q->mult[m], lo = (float)(q->qmin - q->yzp), hi = (float)(q->qmax - q->yzp);
    const int32_t zp = q->yzp;
    for (int64_t j = 0; j < n; j++) {
        float v = (float)(int32_t)((uint32_t)acc[j] + b) * mult;
        v = v < lo ? lo : (v > hi ? hi : v);
        const int32_t r = (int32_t)rintf(v) + zp;
        dst[j] = (uint8_t)r; /* r is within the output dtype: its two's complement byte */
    }
}

/* Packing: columns [c0, c0 + nc) of image b, group g's X into tiles [tile][kp2][TILE][2] of int16, zero
 * past nc and past K (an odd K's last pair), tile by tile so the writes run through one tile's memory.
 * A 1x1 conv with unit strides and no padding reads the input as it lies; the others read the
 * centred, zero-padded int16 copy of the input (q->xpad, [N, C, HP, WP]) made once per call, so the
 * gather has no bounds to check. */
static void pack_pointwise_plain(const qconv_t *q, int64_t b, int64_t g, int64_t c0, int64_t nc, int16_t *buf) {
    const int64_t tiles = (nc + TILE - 1) / TILE, hw = q->H * q->W;
    memset(buf, 0, (size_t)(tiles * q->kp2 * TILE * 2) * sizeof(int16_t));
    const uint8_t *xg = q->x + (b * q->C + g * q->cg) * hw + c0;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = nc - t * TILE < TILE ? nc - t * TILE : TILE;
        int16_t *dst = buf + t * q->kp2 * TILE * 2;
        for (int64_t k = 0; k < q->K; k++) {
            const uint8_t *src = xg + k * hw + t * TILE;
            int16_t *d = dst + (k / 2) * TILE * 2 + (k & 1);
            for (int64_t j = 0; j < n; j++) d[2 * j] = (int16_t)centred(q, src + j);
        }
    }
}

static void pack_padded(const qconv_t *q, int64_t b, int64_t g, int64_t c0, int64_t nc, int16_t *buf) {
    const int64_t tiles = (nc + TILE - 1) / TILE, HP = q->HP, WP = q->WP;
    memset(buf, 0, (size_t)(tiles * q->kp2 * TILE * 2) * sizeof(int16_t));
    const int16_t *xg = q->xpad + (b * q->C + g * q->cg) * HP * WP;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = nc - t * TILE < TILE ? nc - t * TILE : TILE;
        int64_t off[TILE];
        for (int64_t j = 0; j < n; j++) {
            const int64_t col = c0 + t * TILE + j;
            off[j] = (col / q->OW) * q->sh * WP + (col % q->OW) * q->sw;
        }
        int16_t *dst = buf + t * q->kp2 * TILE * 2;
        int64_t c = 0, kh = 0, kw = 0;
        for (int64_t k = 0; k < q->K; k++) {
            const int16_t *src = xg + c * HP * WP + kh * q->dh * WP + kw * q->dw;
            int16_t *d = dst + (k / 2) * TILE * 2 + (k & 1);
            for (int64_t j = 0; j < n; j++) d[2 * j] = src[off[j]];
            if (++kw == q->KW) {
                kw = 0;
                if (++kh == q->KH) {
                    kh = 0;
                    c++;
                }
            }
        }
    }
}

/* Plane i of the input, centred, into the zero-padded copy. */
static void pad_item(void *ctx, int64_t i) {
    qconv_t *q = ctx;
    int16_t *dst = q->xpad + i * q->HP * q->WP;
    const uint8_t *src = q->x + i * q->H * q->W;
    memset(dst, 0, (size_t)(q->HP * q->WP) * sizeof(int16_t));
    for (int64_t ih = 0; ih < q->H && ih + q->pt < q->HP; ih++) {
        int16_t *row = dst + (ih + q->pt) * q->WP + q->pl;
        const int64_t n = q->W < q->WP - q->pl ? q->W : q->WP - q->pl;
        const uint8_t *s0 = src + ih * q->W;
        const int16_t zp = (int16_t)q->xzp;
        if (q->xs) { /* (two plain loops: they vectorise, a call of centred() per byte did not) */
            for (int64_t iw = 0; iw < n; iw++) row[iw] = (int16_t)((int16_t)(int8_t)s0[iw] - zp);
        } else {
            for (int64_t iw = 0; iw < n; iw++) row[iw] = (int16_t)((int16_t)s0[iw] - zp);
        }
    }
}

#ifdef QG_X86
/* pack_padded for tiles of 16 columns within one output row and column strides 1 or 2 (a stem's, a dense
 * conv's): each k row of the tile is one run of the padded copy (every other value of a run of 32 for
 * stride 2), two k rows interleaved into the pairs the GEMM reads.  Other tiles go through pack_padded. */
__attribute__((target("avx2"))) static int pack_padded_avx2(const qconv_t *q, int64_t b, int64_t g, int64_t c0,
                                                            int64_t nc, int16_t *buf) {
    const int64_t tiles = (nc + TILE - 1) / TILE, HP = q->HP, WP = q->WP, sw = q->sw;
    if (nc % TILE || (sw != 1 && sw != 2)) return 0;
    for (int64_t t = 0; t < tiles; t++)
        if ((c0 + t * TILE) % q->OW + TILE > q->OW) return 0;
    const int16_t *xg = q->xpad + (b * q->C + g * q->cg) * HP * WP;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t col = c0 + t * TILE, base = (col / q->OW) * q->sh * WP + (col % q->OW) * sw;
        int16_t *dst = buf + t * q->kp2 * TILE * 2;
        int64_t c = 0, kh = 0, kw = 0;
        __m256i prev = _mm256_setzero_si256();
        for (int64_t k = 0; k < q->K; k++) {
            const int16_t *src = xg + c * HP * WP + kh * q->dh * WP + kw * q->dw + base;
            __m256i v = _mm256_loadu_si256((const __m256i *)src);
            if (sw == 2) { /* the even values of 32, in order: sign-extended from the low halves, packed */
                const __m256i e0 = _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16);
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(src + 16));
                const __m256i e1 = _mm256_srai_epi32(_mm256_slli_epi32(v1, 16), 16);
                v = _mm256_permute4x64_epi64(_mm256_packs_epi32(e0, e1), 0xD8);
            }
            if (k & 1 || k == q->K - 1) {
                const __m256i a = k & 1 ? prev : v, bb = k & 1 ? v : _mm256_setzero_si256();
                const __m256i lo = _mm256_unpacklo_epi16(a, bb), hi = _mm256_unpackhi_epi16(a, bb);
                int16_t *d = dst + (k / 2) * TILE * 2;
                _mm256_storeu_si256((__m256i *)d, _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i *)(d + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
            }
            prev = v;
            if (++kw == q->KW) {
                kw = 0;
                if (++kh == q->KH) {
                    kh = 0;
                    c++;
                }
            }
        }
    }
    return 1;
}
#endif

#ifdef QG_X86
/* A 1x1 conv with unit strides and no padding: row k of X is the input plane k as it lies, so two
 * rows at a time are widened, centred and interleaved 16 columns at a time. */
__attribute__((target("avx2"))) static void pack_pointwise_avx2(const qconv_t *q, int64_t b, int64_t g, int64_t c0,
                                                                int64_t nc, int16_t *buf) {
    const int64_t tiles = (nc + TILE - 1) / TILE, hw = q->H * q->W;
    const uint8_t *xg = q->x + (b * q->C + g * q->cg) * hw + c0;
    const __m256i zp = _mm256_set1_epi16((int16_t)q->xzp);
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = nc - t * TILE < TILE ? nc - t * TILE : TILE;
        int16_t *dst = buf + t * q->kp2 * TILE * 2;
        for (int64_t kp = 0; kp < q->kp2; kp++, dst += TILE * 2) {
            uint8_t r0[TILE] = {0}, r1[TILE] = {0};
            const uint8_t *s0 = xg + 2 * kp * hw + t * TILE, *s1 = s0 + hw;
            const int has1 = 2 * kp + 1 < q->K;
            __m128i a, c;
            if (n == TILE) {
                a = _mm_loadu_si128((const __m128i *)s0);
                c = has1 ? _mm_loadu_si128((const __m128i *)s1) : a;
            } else {
                memcpy(r0, s0, (size_t)n);
                if (has1) memcpy(r1, s1, (size_t)n);
                a = _mm_loadu_si128((const __m128i *)r0);
                c = _mm_loadu_si128((const __m128i *)(has1 ? r1 : r0));
            }
            __m256i wa = q->xs ? _mm256_cvtepi8_epi16(a) : _mm256_cvtepu8_epi16(a);
            __m256i wc = q->xs ? _mm256_cvtepi8_epi16(c) : _mm256_cvtepu8_epi16(c);
            wa = _mm256_sub_epi16(wa, zp);
            wc = has1 ? _mm256_sub_epi16(wc, zp) : _mm256_setzero_si256();
            if (n < TILE) { /* columns past the band are zero */
                const __m256i idx = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                const __m256i keep = _mm256_cmpgt_epi16(_mm256_set1_epi16((int16_t)n), idx);
                wa = _mm256_and_si256(wa, keep);
                wc = _mm256_and_si256(wc, keep);
            }
            const __m256i lo = _mm256_unpacklo_epi16(wa, wc), hi = _mm256_unpackhi_epi16(wa, wc);
            _mm256_storeu_si256((__m256i *)dst, _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
}

/* The requantization in vectors, requant_row's results in fewer steps: float(acc + bias) * multiplier, only
 * its upper clamp (qmax - zp) in float, rounded to nearest even by cvtps (default MXCSR); then the zero
 * point added in saturating int16 and the lower clamp done by the saturating packs and a byte max/min.
 * The same integers: rounding is monotone and the bounds are integers, so clamp(rint(v) + zp) equals
 * rint(clamp(v)) + zp; a v below int32's range converts to INT32_MIN, which every saturation keeps at
 * the bottom, and so does qmin's byte max. */
typedef struct {
    __m256 hi;
    __m256i zp, lo8, hi8;
    int ys;
} rq_t;

__attribute__((target("avx2"))) static inline rq_t rq_init(const qconv_t *q) {
    rq_t r = {.hi = _mm256_set1_ps((float)(q->qmax - q->yzp)), .zp = _mm256_set1_epi16((int16_t)q->yzp),
              .lo8 = _mm256_set1_epi8((char)q->qmin), .hi8 = _mm256_set1_epi8((char)q->qmax), .ys = q->ys};
    return r;
}

__attribute__((target("avx2"))) static inline __m256i rq_half(const rq_t *r, __m256i acc, __m256i bias, __m256 mul) {
    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(acc, bias)), mul);
    return _mm256_cvtps_epi32(_mm256_min_ps(f, r->hi));
}

/* 16 accumulators of one output channel (its bias b and multiplier m) as int16 plus the zero point, in
 * packs_epi32's order: a0's and a1's low 128-bit lanes, then their high lanes. */
__attribute__((target("avx2"))) static inline __m256i rq_16(const rq_t *r, __m256i a0, __m256i a1, int32_t b, float m) {
    const __m256i bias = _mm256_set1_epi32(b);
    const __m256 mul = _mm256_set1_ps(m);
    return _mm256_adds_epi16(_mm256_packs_epi32(rq_half(r, a0, bias, mul), rq_half(r, a1, bias, mul)), r->zp);
}

/* Two rq_16 results as bytes, clamped to [qmin, qmax], n <= 16 of each stored at d0 and d1 (d1 NULL: none).
 * rq_16's halves are outputs 0-7 | 8-15 where `ordered`, else 0-3, 8-11 | 4-7, 12-15 (put back by a byte
 * shuffle). */
__attribute__((target("avx2"))) static inline void rq_store2(const rq_t *r, __m256i v0, __m256i v1, uint8_t *d0,
                                                             uint8_t *d1, int64_t n, int ordered) {
    __m256i t = r->ys ? _mm256_packs_epi16(v0, v1) : _mm256_packus_epi16(v0, v1);
    t = r->ys ? _mm256_max_epi8(_mm256_min_epi8(t, r->hi8), r->lo8) : _mm256_max_epu8(_mm256_min_epu8(t, r->hi8), r->lo8);
    t = _mm256_permute4x64_epi64(t, 0xD8); /* v0's bytes in the low lane, v1's in the high */
    if (!ordered)
        t = _mm256_shuffle_epi8(t, _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9,
                                                     10, 11, 4, 5, 6, 7, 12, 13, 14, 15));
    if (n == TILE) {
        _mm_storeu_si128((__m128i *)d0, _mm256_castsi256_si128(t));
        if (d1) _mm_storeu_si128((__m128i *)d1, _mm256_extracti128_si256(t, 1));
    } else {
        uint8_t tmp[2 * TILE];
        _mm256_storeu_si256((__m256i *)tmp, t);
        memcpy(d0, tmp, (size_t)n);
        if (d1) memcpy(d1, tmp + TILE, (size_t)n);
    }
}

/* Rows [m0, m0 + rows) (rows <= MR) by one packed tile of n columns: the products, requantized. */
__attribute__((target("avx2"))) static void tile_avx2(const qconv_t *q, int64_t m0, int rows, const int16_t *xp,
                                                      uint8_t *y, int64_t ystride, int64_t n) {
    const int32_t *w[MR];
    for (int r = 0; r < MR; r++) w[r] = q->wp + (m0 + (r < rows ? r : 0)) * q->kp2;
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
            a31 = a00;
    for (int64_t kp = 0; kp < q->kp2; kp++, xp += TILE * 2) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)xp), b1 = _mm256_loadu_si256((const __m256i *)(xp + 16));
        __m256i s = _mm256_set1_epi32(w[0][kp]);
        a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(s, b0));
        a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(s, b1));
        s = _mm256_set1_epi32(w[1][kp]);
        a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(s, b0));
        a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(s, b1));
        s = _mm256_set1_epi32(w[2][kp]);
        a20 = _mm256_add_epi32(a20, _mm256_madd_epi16(s, b0));
        a21 = _mm256_add_epi32(a21, _mm256_madd_epi16(s, b1));
        s = _mm256_set1_epi32(w[3][kp]);
        a30 = _mm256_add_epi32(a30, _mm256_madd_epi16(s, b0));
        a31 = _mm256_add_epi32(a31, _mm256_madd_epi16(s, b1));
    }
    const __m256i acc[MR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    const rq_t rq = rq_init(q);
    for (int r = 0; r < rows; r += 2) {
        const int64_t m = m0 + r;
        const __m256i v0 = rq_16(&rq, acc[r][0], acc[r][1], q->bias ? q->bias[m] : 0, q->mult[m]);
        const __m256i v1 = r + 1 < rows ? rq_16(&rq, acc[r + 1][0], acc[r + 1][1], q->bias ? q->bias[m + 1] : 0,
                                                q->mult[m + 1])
                                        : v0;
        rq_store2(&rq, v0, v1, y + r * ystride, r + 1 < rows ? y + (r + 1) * ystride : NULL, n, 0);
    }
}
#endif

/* The plain C tile: the same integers and the same epilogue. */
static void tile_plain(const qconv_t *q, int64_t m0, int rows, const int16_t *xp, uint8_t *y, int64_t ystride,
                       int64_t n) {
    for (int r = 0; r < rows; r++) {
        const int32_t *w = q->wp + (m0 + r) * q->kp2;
        int32_t acc[TILE] = {0};
        const int16_t *p = xp;
        for (int64_t kp = 0; kp < q->kp2; kp++, p += TILE * 2) {
            const int32_t w0 = (int16_t)(uint16_t)((uint32_t)w[kp] & 0xffffu), w1 = (int16_t)(uint16_t)((uint32_t)w[kp] >> 16);
            for (int j = 0; j < TILE; j++) acc[j] += w0 * p[2 * j] + w1 * p[2 * j + 1];
        }
        requant_row(q, acc, n, m0 + r, y + r * ystride);
    }
}

static void gemm_item(void *ctx, int64_t it) {
    qconv_t *q = ctx;
    const int64_t jm = it % q->nm, jn = (it / q->nm) % q->nn, bg = it / (q->nm * q->nn);
    const int64_t b = bg / q->G, g = bg % q->G;
    const int64_t c0 = jn * q->nb, nc = q->P - c0 < q->nb ? q->P - c0 : q->nb;
    const int64_t m0 = jm * q->mb, mrows = q->mg - m0 < q->mb ? q->mg - m0 : q->mb;
    if (nc <= 0 || mrows <= 0) return;
    const int64_t tiles = (nc + TILE - 1) / TILE;
    int16_t *buf = (int16_t *)opt_scratch((size_t)(tiles * q->kp2 * TILE * 2 + 1) / 2);
    if (!buf) {
        q->failed = 1;
        return;
    }
    const int avx2 = g_avx2 == 1;
    (void)avx2; /* (read only where the AVX2 path is built) */
    if (q->xpad) {
#ifdef QG_X86
        if (!avx2 || !pack_padded_avx2(q, b, g, c0, nc, buf))
#endif
            pack_padded(q, b, g, c0, nc, buf);
    } else {
#ifdef QG_X86
        if (avx2)
            pack_pointwise_avx2(q, b, g, c0, nc, buf);
        else
#endif
            pack_pointwise_plain(q, b, g, c0, nc, buf);
    }
    const int64_t mbase = g * q->mg + m0;
    uint8_t *yb = q->y + (b * q->M + mbase) * q->P + c0;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = nc - t * TILE < TILE ? nc - t * TILE : TILE;
        const int16_t *xp = buf + t * q->kp2 * TILE * 2;
        for (int64_t r = 0; r < mrows; r += MR) {
            const int rows = mrows - r < MR ? (int)(mrows - r) : MR;
            uint8_t *dst = yb + r * q->P + t * TILE;
#ifdef QG_X86
            if (avx2) {
                tile_avx2(q, mbase + r, rows, xp, dst, q->P, n);
                continue;
            }
#endif
            tile_plain(q, mbase + r, rows, xp, dst, q->P, n);
        }
    }
}

typedef int16_t v16h __attribute__((vector_size(32)));
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef int8_t v16sb __attribute__((vector_size(16)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));

/* 8 requantized values (requant_row's arithmetic) as vectors, in 32-byte vectors that AVX2 keeps in
 * registers.  Rounding adds and subtracts 1.5 * 2**23: for |v| < 2**22 (v is clamped to within 510 of
 * zero) the sum lands where the float spacing is 1, so it rounds v to nearest even, exactly as rintf
 * does in the default rounding mode. */
ALWAYS_INLINE v8b requant8(v8i acc, int32_t bias, float mult, v8f vlo, v8f vhi, int32_t zp) {
    v8f v = __builtin_convertvector(acc + bias, v8f) * mult;
    v8i m = v < vlo;
    v = (v8f)((m & (v8i)vlo) | (~m & (v8i)v));
    m = v > vhi;
    v = (v8f)((m & (v8i)vhi) | (~m & (v8i)v));
    v = (v + 12582912.0f) - 12582912.0f;
    return __builtin_convertvector(__builtin_convertvector(v, v8i) + zp, v8b);
}

/* The depthwise geometry of one work item: its input plane copied as bytes into zero-point-padded
 * rows, one set per column phase of the stride (phase a holds the padded columns a, a + sw, ...), so
 * every tap of an output row reads a contiguous run of bytes whatever the stride. */
typedef struct dw_geom {
    int64_t HP, WQ;     /* padded rows, columns per phase that the taps read */
    int64_t toff[64];   /* each tap's offset from its output's first tap (kernels of <= 64 taps) */
    int64_t taps;       /* (worked out once per call: the divisions cost more than a small plane's sums) */
} dw_geom_t;

typedef struct {
    const dw_geom_t *g;
    int64_t HP, WQ, taps;
    const int64_t *toff;
    int16_t tw[64];     /* each tap's weight */
    int32_t bias;       /* the bias less x_zero_point * sum(w): the sums below read x uncentred */
    float mult;
} dw_t;

/* n bytes from s to d in fixed-size moves that overlap at the end instead of a memcpy call per row (a
 * call of libc's memcpy per input row cost a 28x28 plane as much as its sums); reads and writes stay
 * within [0, n). */
static inline void copy_bytes(uint8_t *d, const uint8_t *s, int64_t n) {
    if (n >= 32) {
        int64_t i = 0;
        for (; i + 32 <= n; i += 32) memcpy(d + i, s + i, 32);
        if (i < n) memcpy(d + n - 32, s + n - 32, 32);
    } else if (n >= 16) {
        memcpy(d, s, 16);
        memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else {
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
    }
}

/* Even and odd bytes of src[0, n) into ev and od (the stride-2 phase split), 32 at a time with AVX2, the
 * last 32 overlapping the previous ones (from an even start) so that nothing is read or written past
 * the row: a bounce through a small buffer stalled on store forwarding.  n >= 32. */
#ifdef QG_X86
__attribute__((target("avx2"))) static void split2_avx2(const uint8_t *src, int64_t n, uint8_t *ev, uint8_t *od) {
    const __m256i sel = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                         14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t i = 0, last = 0; !last; i += 32) {
        if (i + 32 >= n) {
            i = (n - 32) & ~(int64_t)1;
            last = 1;
        }
        __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(src + i)), sel);
        v = _mm256_permute4x64_epi64(v, 0xD8); /* evens in the low half, odds in the high */
        _mm_storeu_si128((__m128i *)(ev + i / 2), _mm256_castsi256_si128(v));
        _mm_storeu_si128((__m128i *)(od + i / 2), _mm256_extracti128_si256(v, 1));
    }
    if (n & 1) ev[n / 2] = src[n - 1]; /* an odd row's last byte: past the last even start's 32 */
}
#endif

/* The zero-point-padded phase copy of input plane `plane` into xp (sw * HP * WQ bytes and 32 of slack
 * for the last runs' overreach). */
static void dw_fill(const qconv_t *q, const dw_t *d, const uint8_t *plane, uint8_t *xp) {
    const int64_t sw = q->sw, HP = d->HP, WQ = d->WQ;
    memset(xp, (int)(uint8_t)q->xzp, (size_t)(sw * HP * WQ + 32));
    for (int64_t ih = 0; ih < q->H; ih++) {
        const int64_t r = ih + q->pt;
        if (r >= HP) break;
        const uint8_t *src = plane + ih * q->W;
        if (sw == 2) { /* input column i goes to phase (i + pl) % 2, place (i + pl) / 2 */
            const int64_t W = q->W, je = q->pl / 2, jo = (1 + q->pl) / 2;
            uint8_t *ev = xp + ((q->pl % 2) * HP + r) * WQ + je, *od = xp + (((1 + q->pl) % 2) * HP + r) * WQ + jo;
            const int64_t ne = WQ - je < (W + 1) / 2 ? WQ - je : (W + 1) / 2, no = WQ - jo < W / 2 ? WQ - jo : W / 2;
#ifdef QG_X86
            if (g_avx2 == 1 && W >= 32 && ne == (W + 1) / 2 && no == W / 2) { /* every byte lands in its row */
                split2_avx2(src, W, ev, od);
                continue;
            }
#endif
            for (int64_t j = 0; j < ne; j++) ev[j] = src[2 * j];
            for (int64_t j = 0; j < no; j++) od[j] = src[2 * j + 1];
            continue;
        }
        for (int64_t a = 0; a < sw; a++) { /* phase a: padded columns a + j * sw, input columns that - pl */
            uint8_t *dst = xp + (a * HP + r) * WQ;
            const int64_t first = a - q->pl;                              /* input column of j = 0 */
            const int64_t j0 = first >= 0 ? 0 : (-first + sw - 1) / sw;    /* first j inside the input */
            int64_t j1 = first >= q->W ? 0 : (q->W - 1 - first) / sw + 1; /* past the last one */
            if (j1 > WQ) j1 = WQ;
            if (j1 <= j0) continue;
            if (sw == 1) {
                copy_bytes(dst + j0, src + first + j0, j1 - j0);
            } else {
                for (int64_t j = j0; j < j1; j++) dst[j] = src[first + j * sw];
            }
        }
    }
}

#ifdef QG_X86
/* 16 outputs at a time with vpmaddwd: taps go two by two (the last one of an odd count with a zero
 * weight), their bytes widened to int16 and interleaved so each int32 lane takes both products of
 * one output; lanes come out as outputs 0-3, 8-11 (unpacklo) and 4-7, 12-15 (unpackhi), put back in
 * order at the end.  x is read uncentred (0..255 or -128..127; d->bias holds the zero point's share),
 * so pair sums reach 2 * 255 * 128: exact in int32. */
__attribute__((target("avx2"))) static void dw_rows_avx2(const qconv_t *q, const dw_t *d, const uint8_t *xp,
                                                         uint8_t *y) {
    const int64_t OW = q->OW, taps = d->taps, pairs = (taps + 1) / 2, WQ = d->WQ;
    int32_t wpair[32];
    int64_t off[64];
    for (int64_t p = 0; p < pairs; p++) {
        const int32_t w1 = 2 * p + 1 < taps ? d->tw[2 * p + 1] : 0;
        wpair[p] = (int32_t)((uint32_t)(uint16_t)d->tw[2 * p] | ((uint32_t)(uint16_t)w1 << 16));
        off[2 * p] = d->toff[2 * p];
        off[2 * p + 1] = 2 * p + 1 < taps ? d->toff[2 * p + 1] : d->toff[2 * p];
    }
    const int xs = q->xs;
    const rq_t rq = rq_init(q);
    __m256i pend = _mm256_setzero_si256(); /* a run waiting for a second one to be stored with */
    uint8_t *pend_dst = NULL;
    int64_t pend_n = 0;
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const uint8_t *base = xp + oh * q->sh * WQ;
        for (int64_t ow = 0; ow < OW; ow += 16) {
            __m256i alo = _mm256_setzero_si256(), ahi = alo;
            for (int64_t p = 0; p < pairs; p++) {
                const __m128i ra = _mm_loadu_si128((const __m128i *)(base + off[2 * p] + ow));
                const __m128i rb = _mm_loadu_si128((const __m128i *)(base + off[2 * p + 1] + ow));
                const __m256i a = xs ? _mm256_cvtepi8_epi16(ra) : _mm256_cvtepu8_epi16(ra);
                const __m256i b = xs ? _mm256_cvtepi8_epi16(rb) : _mm256_cvtepu8_epi16(rb);
                const __m256i w = _mm256_set1_epi32(wpair[p]);
                alo = _mm256_add_epi32(alo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
                ahi = _mm256_add_epi32(ahi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
            }
            /* alo holds outputs 0-3 | 8-11, ahi 4-7 | 12-15: packs_epi32 puts them in order */
            const __m256i v = rq_16(&rq, alo, ahi, d->bias, d->mult);
            const int64_t n = OW - ow < 16 ? OW - ow : 16;
            if (!pend_dst) {
                pend = v, pend_dst = y + oh * OW + ow, pend_n = n;
            } else if (n == pend_n) {
                rq_store2(&rq, pend, v, pend_dst, y + oh * OW + ow, n, 1);
                pend_dst = NULL;
            } else { /* runs of different lengths (a row's last one): each on its own */
                rq_store2(&rq, pend, pend, pend_dst, NULL, pend_n, 1);
                pend = v, pend_dst = y + oh * OW + ow, pend_n = n;
            }
        }
    }
    if (pend_dst) rq_store2(&rq, pend, pend, pend_dst, NULL, pend_n, 1);
}
#endif

/* The portable rows: 16 outputs at a time sum all their taps in vectors; each product of an uncentred
 * x and a weight fits int16 (255 * 128), the sums int32. */
HOT_CLONES static void dw_rows_plain(const qconv_t *q, const dw_t *d, const uint8_t *xp, uint8_t *y) {
    const int64_t OW = q->OW, WQ = d->WQ, taps = d->taps;
    const int32_t yzp = q->yzp;
    const v8f vlo = vsplat((float)(q->qmin - yzp)), vhi = vsplat((float)(q->qmax - yzp));
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const uint8_t *base = xp + oh * q->sh * WQ;
        for (int64_t ow = 0; ow < OW; ow += 16) {
            v8i a0 = {0}, a1 = {0};
            for (int64_t k = 0; k < taps; k++) {
                v16h s;
                if (q->xs) {
                    v16sb b;
                    memcpy(&b, base + d->toff[k] + ow, sizeof b);
                    s = __builtin_convertvector(b, v16h);
                } else {
                    v16b b;
                    memcpy(&b, base + d->toff[k] + ow, sizeof b);
                    s = __builtin_convertvector(b, v16h);
                }
                const v16h p = s * d->tw[k];
                a0 += __builtin_convertvector(__builtin_shufflevector(p, p, 0, 1, 2, 3, 4, 5, 6, 7), v8i);
                a1 += __builtin_convertvector(__builtin_shufflevector(p, p, 8, 9, 10, 11, 12, 13, 14, 15), v8i);
            }
            uint8_t out[16];
            const v8b o0 = requant8(a0, d->bias, d->mult, vlo, vhi, yzp);
            const v8b o1 = requant8(a1, d->bias, d->mult, vlo, vhi, yzp);
            memcpy(out, &o0, 8);
            memcpy(out + 8, &o1, 8);
            memcpy(y + oh * OW + ow, out, (size_t)(OW - ow < 16 ? OW - ow : 16));
        }
    }
}

/* Depthwise (one input channel per group): output channel m of image b, direct from a byte copy of
 * its input plane (dw_fill). */
static void dw_geom(const qconv_t *q, dw_geom_t *g) {
    const int64_t sw = q->sw;
    g->HP = (q->OH - 1) * q->sh + (q->KH - 1) * q->dh + 1;
    g->WQ = q->OW + ((q->KW - 1) * q->dw) / sw + 1;
    g->taps = q->KH * q->KW;
    for (int64_t k = 0; k < g->taps; k++) {
        const int64_t kh = k / q->KW, off = (k % q->KW) * q->dw;
        g->toff[k] = ((off % sw) * g->HP + kh * q->dh) * g->WQ + off / sw;
    }
}

static void dw_item(void *ctx, int64_t it) {
    qconv_t *q = ctx;
    const int64_t b = it / q->M, m = it % q->M, c = m / q->mg, sw = q->sw;
    dw_t d = {.g = q->dwg, .HP = q->dwg->HP, .WQ = q->dwg->WQ, .taps = q->dwg->taps, .toff = q->dwg->toff};
    const size_t bytes = (size_t)(sw * d.HP * d.WQ + 32);
    uint8_t *xp = (uint8_t *)opt_scratch(bytes / sizeof(float) + 1);
    if (!xp) {
        q->failed = 1;
        return;
    }
    const int8_t *w = q->wd + m * d.taps;
    uint32_t wsum = 0;
    for (int64_t k = 0; k < d.taps; k++) {
        d.tw[k] = w[k];
        wsum += (uint32_t)(int32_t)w[k];
    }
    /* sum((x - zp) * w) = sum(x * w) - zp * sum(w): the true total fits int32 (setup's bound), so the
     * wrapping sums below give it exactly */
    d.bias = (int32_t)((q->bias ? (uint32_t)q->bias[m] : 0u) - (uint32_t)q->xzp * wsum);
    d.mult = q->mult[m];
    dw_fill(q, &d, q->x + (b * q->C + c) * q->H * q->W, xp);
    uint8_t *y = q->y + (b * q->M + m) * q->OH * q->OW;
#ifdef QG_X86
    if (g_avx2 == 1) {
        dw_rows_avx2(q, &d, xp, y);
        return;
    }
#endif
    dw_rows_plain(q, &d, xp, y);
}

static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* geom: N, C, H, W, M, KH, KW, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW, group;
 * qp: x zero point, y zero point, qmin, qmax, x signed, y signed. */
static int setup(qconv_t *q, const int64_t *geom, const int32_t *qp) {
    int64_t *f[16] = {&q->N, &q->C, &q->H, &q->W, &q->M, &q->KH, &q->KW, &q->sh, &q->sw, &q->dh, &q->dw,
                      &q->pt, &q->pl, &q->OH, &q->OW, &q->G};
    for (int i = 0; i < 16; i++) *f[i] = geom[i];
    q->xzp = qp[0];
    q->yzp = qp[1];
    q->qmin = qp[2];
    q->qmax = qp[3];
    q->xs = qp[4] != 0;
    q->ys = qp[5] != 0;
    if (q->N < 0 || q->C < 1 || q->H < 1 || q->W < 1 || q->M < 1 || q->KH < 1 || q->KW < 1 || q->sh < 1 ||
        q->sw < 1 || q->dh < 1 || q->dw < 1 || q->pt < 0 || q->pl < 0 || q->OH < 0 || q->OW < 0 || q->G < 1 ||
        q->C % q->G || q->M % q->G)
        return OPT_EINVAL;
    const int32_t tlo = q->ys ? -128 : 0, thi = q->ys ? 127 : 255, xlo = q->xs ? -128 : 0, xhi = q->xs ? 127 : 255;
    if (q->qmin < tlo || q->qmax > thi || q->qmin > q->qmax || q->yzp < tlo || q->yzp > thi || q->xzp < xlo ||
        q->xzp > xhi)
        return OPT_EINVAL;
    q->cg = q->C / q->G;
    q->mg = q->M / q->G;
    q->K = q->cg * q->KH * q->KW;
    q->kp2 = (q->K + 1) / 2;
    q->P = q->OH * q->OW;
    if (q->K > 65536) return OPT_EINVAL; /* the int32 accumulator's bound (see the top) */
    pthread_once(&g_once, pick);
    return 0;
}

OPT_API int optcli_qconv2d_gemm(const void *x, const int32_t *wp, const int32_t *bias, const float *mult, void *y,
                                const int64_t *geom, const int32_t *qp) {
    qconv_t q = {.x = x, .wp = wp, .bias = bias, .mult = mult, .y = y};
    int rc = setup(&q, geom, qp);
    if (rc) return rc;
    if (q.N == 0 || q.P == 0) return 0;
    const int threads = optcli_get_num_threads();
    int64_t nb = PANEL_BYTES / (q.kp2 * TILE * 4) * TILE;
    if (nb < TILE) nb = TILE;
    if (nb > round_up(q.P, TILE)) nb = round_up(q.P, TILE);
    q.nb = nb;
    q.nn = (q.P + nb - 1) / nb;
    const int64_t items = q.N * q.G * q.nn, want = 4 * (int64_t)threads;
    q.mb = round_up(q.mg, MR);
    if (items < want) {
        const int64_t split = (want + items - 1) / items;
        q.mb = round_up((q.mg + split - 1) / split, MR);
    }
    q.nm = (q.mg + q.mb - 1) / q.mb;
    const int64_t macs = q.N * q.M * q.K * q.P;
    const int cap = macs < (1 << 18) ? 1 : 0;
    const int pointwise = q.KH == 1 && q.KW == 1 && q.sh == 1 && q.sw == 1 && q.pt == 0 && q.pl == 0 &&
                          q.OH == q.H && q.OW == q.W;
    if (!pointwise) {
        q.HP = (q.OH - 1) * q.sh + (q.KH - 1) * q.dh + 1;
        q.WP = (q.OW - 1) * q.sw + (q.KW - 1) * q.dw + 1;
        q.xpad = malloc((size_t)(q.N * q.C * q.HP * q.WP + 32) * sizeof(int16_t)); /* + pack_padded_avx2's overreach */
        if (!q.xpad) return OPT_ENOMEM;
        opt_parallel(pad_item, &q, q.N * q.C, cap);
    }
    opt_parallel(gemm_item, &q, items * q.nm, cap);
    free(q.xpad);
    return q.failed ? OPT_ENOMEM : 0;
}

OPT_API int optcli_qconv2d_depthwise(const void *x, const int8_t *w, const int32_t *bias, const float *mult, void *y,
                                     const int64_t *geom, const int32_t *qp) {
    qconv_t q = {.x = x, .wd = w, .bias = bias, .mult = mult, .y = y};
    int rc = setup(&q, geom, qp);
    if (rc) return rc;
    if (q.cg != 1 || q.KH * q.KW > 64) return OPT_EINVAL; /* dw_t's room; the GEMM takes larger windows */
    if (q.N == 0 || q.P == 0) return 0;
    dw_geom_t g;
    dw_geom(&q, &g);
    q.dwg = &g;
    const int64_t macs = q.N * q.M * q.KH * q.KW * q.P;
    opt_parallel(dw_item, &q, q.N * q.M, macs < (1 << 16) ? 1 : 0);
    return q.failed ? OPT_ENOMEM : 0;
}
