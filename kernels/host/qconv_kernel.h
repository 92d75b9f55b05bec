/* What the integer convolutions' two files share (qgemm.c: the GEMM and the dispatch; qdepthwise.c: the
 * direct depthwise kernels): the call's description, the dot-product path in use, and the vectorised
 * requantization epilogue (optcli.QConv, optcli/ops/qconv.py). */
#ifndef OPTCLI_QCONV_KERNEL_H
#define OPTCLI_QCONV_KERNEL_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QG_X86 1
#include <immintrin.h>
#endif

#define TILE 16 /* columns per register tile and per packed tile; outputs per requantized run */

struct dw_geom;

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

/* -1 unknown, 0 the portable path, 1 AVX2: picked once per process (qgemm.c), or set by optcli_qgemm_variant
 * for the tests. */
extern int opt_qconv_avx2;
/* 1 where the depthwise convs of one output channel per group run with their channels in the vector lanes,
 * summed in float32 with FMA (qdepthwise_lanes.c; AVX2 machines with FMA), 0 where they take qdepthwise.c's
 * vpmaddwd or plain path. */
extern int opt_qdw_fma;
/* 1 where the CPU has AVX-512 with VNNI (variant 4): the 1x1 convs multiply u8 by s8 with vpdpbusd, exact in
 * int32 with no weight split (qpointwise.c), and so do the channels-in-lanes depthwise convs, 16 channels and
 * four taps of a window row at a time (qdepthwise_lanes.c).  Implies opt_qconv_avx2 and opt_qdw_fma. */
extern int opt_qconv_vnni512;

/* 1 where the CPU has AVX-VNNI but not AVX-512 VNNI (variant 5): the 1x1 convs by the 8-lane vpdpbusd, whole
 * weights as on variant 4; everything else as variant 3. */
extern int opt_qconv_vnni256;
/* 1 on aarch64 CPUs with the dot product extension (variant 6): the 1x1 convs by sdot on whole weights, x read
 * as s8 (u8 inputs flipped by an xor with 0x80, 128 * sum(w) added back to each row). */
extern int opt_qconv_sdot;
/* 1 on aarch64 CPUs without it (variant 7: Cortex-A53/A55/A72/A73 class, most boards): the same tile by smull
 * and sadalp (each pair of s8 x s8 products summed into an int32 lane at once, so no int16 sum can clip), x
 * read as s8 as for sdot. */
extern int opt_qconv_neon;

#define VNNI512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"
#define VNNI256_TARGET "avxvnni,avx2,fma"

/* Whether the channels-in-lanes depthwise kernel (qdepthwise_lanes.c) takes a depthwise call, and the call:
 * 0, or OPT_ENOMEM (q->failed set where a work item's scratch was refused). */
int opt_qdw_lanes_takes(const qconv_t *q);
int opt_qdw_lanes(const qconv_t *q);

/* Fills q from a call's geometry and quantization parameters; OPT_EINVAL where they make no conv. */
int opt_qconv_setup(qconv_t *q, const int64_t *geom, const int32_t *qp);

/* n requantized values of output channel m into dst, as onnxruntime's MlasRequantizeOutput computes
 * them: float(acc + bias) * multiplier, clamped in float, rounded to nearest even (rintf in the default
 * rounding mode: one instruction where SSE4.1 or NEON has it; nearbyintf saves and restores the
 * floating-point environment, a libm call per value), plus the zero point.  The clamp sits between
 * the product and the rounding, so no FMA can fuse them. */
static inline void opt_requant_row(const qconv_t *q, const int32_t *acc, int64_t n, int64_t m, uint8_t *dst) {
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

/* n bytes from s to d in fixed-size moves that overlap at the end, inlined where a depthwise plane's short
 * rows made a libc call each; reads and writes stay within [0, n). */
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

#ifdef QG_X86
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

#endif

#endif
