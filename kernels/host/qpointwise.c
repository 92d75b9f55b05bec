/* Integer 1x1 convolutions (unit strides, no padding: the pointwise convs of MobileNets and
 * EfficientNets) by vpmaddubsw: u8 activations times s8 weights, four k at a time, exact.
 *
 * Why a second GEMM beside qgemm.c's: vpmaddubsw multiplies 32 byte pairs an instruction where
 * vpmaddwd multiplies 16 int16 pairs, and on AVX2 CPUs without VNNI the sequence vpmaddubsw,
 * vpmaddwd(ones), vpaddd (onnxruntime's MLAS kernels) sums 32 products in three instructions where
 * vpmaddwd, vpaddd need four: measured 1.5x the multiply-adds a second on this project's AMD EPYC.
 * The pack is bytes too (K per column where qgemm.c writes 2K).
 *
 * Why exact: vpmaddubsw sums two u8 x s8 products into a saturating int16.  x is read as it lies
 * (u8; s8 inputs flipped to u8 by an xor with 0x80, their zero point moved by 128), so a pair's sum
 * lies within 255 * (w_a+ + w_b+) and -255 * (w_a- + w_b-) (the positive and negative parts): it
 * cannot clip where w_a+ + w_b+ <= 128 and w_a- + w_b- <= 128.  The weights come split (the wrapper,
 * optcli/native/qgemm.py: pack_quads) into a main part whose pairs all meet that, and a sparse
 * residual (each pair of an unsafe pair's excess, per row and group of four k, meeting it too) added
 * to the row's accumulators after the main loop: the sum of both is the exact integer sum.  The zero
 * point's term -x_zp * sum(w) is in the bias the wrapper passes, and every step wraps modulo 2^32, so
 * the int32 result equals qgemm.c's.
 *
 * Layout: X packed once per call (every tile of every image and group, over the pool), 16 columns a
 * tile, [tile][k / 4][16 columns][4 k] bytes (the columns' quads: one vpmaddubsw operand per 8 columns
 * and 4 k); the weights [M][Q] int32, each the 4 bytes of w[m, 4q .. 4q + 3] (Q = ceil(K / 4), zeros
 * past K), broadcast; 4 rows x 16 columns a register tile; qgemm.c's requantization epilogue.
 *
 * On CPUs with AVX-512 VNNI the weights come whole and vpdpbusd runs 8 rows x 32 columns (vnni_body), and the
 * same GEMM takes the dense convs too (optcli_qconv2d_dense, at the end: any window, stride, dilation,
 * padding, group), their columns packed per work item from a padded u8 copy of the input.
 */
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "qconv_kernel.h"

#define PW_MR 4
#define PW_PANEL (96 * 1024) /* a band's packed columns */
/* Items of at least this many rows pack their band of columns themselves even where other items share it (more
 * threads than bands: the late layers of a mobile net, 49 columns and hundreds of rows, split by rows): a band
 * packed again costs about 4 / rows of the item's products (16 bytes a cycle packed, 64 products a cycle by
 * vpdpbusd), a few percent, where packing once in a pass of its own costs a second hand-off to the pool. */
#define PW_REPACK_ROWS 32

typedef struct {
    qconv_t q;
    int whole;           /* the blob's format: 1 the whole weights (no residual), 0 split for vpmaddubsw */
    int sdot;            /* aarch64's sdot path: x packed as s8 (see opt_qconv_sdot), wsum added per row */
    int neon;            /* aarch64's path without the dot product (opt_qconv_neon): x as s8 too, wsum added */
    int32_t *wsum;       /* sdot, neon: 128 * sum(w[m]), the flip's correction (wraps as the sums do) */
    const int32_t *wq;   /* [M][Q] main weights, 4 bytes each */
    const int32_t *rptr; /* [M + 1]: row m's residual entries are rent[2 * rptr[m] .. 2 * rptr[m + 1]) */
    const int32_t *rent; /* (quad index, 4 residual weight bytes) pairs */
    uint8_t *xq;         /* the packed input [N * G][tiles][Q][64] (1x1 convs: packed once per call) */
    int64_t Q, tiles, tstride; /* quads per column, tiles per image and group, bytes per tile */
    /* dense convs (optcli_qconv2d_dense): packed per work item from a padded u8 copy of the input */
    const uint8_t *xpad; /* [N * C][HP][sw phases][WS]: column x of a padded row at phase x % sw, index x / sw */
    const int64_t *koff; /* [4 * Q]: k = (c, kh, kw)'s offset from its group's first plane; 0 past K (where
                          * every weight is 0: any byte will do) */
    int64_t WS, rs, ps;  /* a phase's width, a padded row's bytes (sw * WS), a plane's (HP * rs) */
} pw_t;

static inline int64_t pw_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Quad q of the 16-column tile at column c (n columns valid) into dst (64 bytes), portable. */
static void pack_quad_plain(const pw_t *p, const uint8_t *xg, int64_t hw, int64_t c, int64_t n, int64_t qd,
                            uint8_t *dst) {
    /* u8 for the x86 paths, s8 for aarch64's */
    const uint8_t flip = (p->q.xs ? 0x80 : 0) ^ (p->sdot || p->neon ? 0x80 : 0);
    memset(dst, 0, 64);
    for (int i = 0; i < 4; i++) {
        const int64_t k = 4 * qd + i;
        if (k >= p->q.K) break;
        const uint8_t *src = xg + k * hw + c;
        for (int64_t j = 0; j < n; j++) dst[4 * j + i] = (uint8_t)(src[j] ^ flip);
    }
}

#ifdef QG_X86
/* The same quad from four rows of 16 bytes, interleaved by two rounds of unpacks. */
__attribute__((target("avx2"))) static void pack_quad_avx2(const pw_t *p, const uint8_t *xg, int64_t hw, int64_t c,
                                                           int64_t n, int64_t qd, uint8_t *dst) {
    __m128i r[4];
    const __m128i flip = _mm_set1_epi8(p->q.xs ? (char)0x80 : 0);
    for (int i = 0; i < 4; i++) {
        const int64_t k = 4 * qd + i;
        if (k >= p->q.K) {
            r[i] = _mm_setzero_si128();
            continue;
        }
        const uint8_t *src = xg + k * hw + c;
        if (n == TILE) {
            r[i] = _mm_loadu_si128((const __m128i *)src);
        } else {
            uint8_t tmp[TILE] = {0};
            memcpy(tmp, src, (size_t)n);
            r[i] = _mm_loadu_si128((const __m128i *)tmp);
        }
        r[i] = _mm_xor_si128(r[i], flip);
    }
    const __m128i a = _mm_unpacklo_epi8(r[0], r[1]), b = _mm_unpackhi_epi8(r[0], r[1]);
    const __m128i cc = _mm_unpacklo_epi8(r[2], r[3]), d = _mm_unpackhi_epi8(r[2], r[3]);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(a, cc));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(a, cc));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(b, d));
    _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(b, d));
}
#endif

/* Tile i of the pack (image and group i / tiles, tile i % tiles), all its quads, into dst. */
static void pack_tile(const pw_t *p, int64_t i, uint8_t *dst) {
    const qconv_t *q = &p->q;
    const int64_t bg = i / p->tiles, t = i % p->tiles, b = bg / q->G, g = bg % q->G, hw = q->H * q->W;
    const uint8_t *xg = q->x + (b * q->C + g * q->cg) * hw;
    const int64_t c = t * TILE, n = pw_min(TILE, q->P - c);
    for (int64_t qd = 0; qd < p->Q; qd++, dst += 64) {
#ifdef QG_X86
        if (opt_qconv_avx2 == 1) {
            pack_quad_avx2(p, xg, hw, c, n, qd, dst);
            continue;
        }
#endif
        pack_quad_plain(p, xg, hw, c, n, qd, dst);
    }
}

/* Work item i of the pack: one tile into the call's packed input. */
static void pack_item(void *ctx, int64_t i) {
    pw_t *p = ctx;
    pack_tile(p, i, p->xq + i * p->tstride);
}

#ifdef QG_X86
/* Rows m and m + 1 (the second only where rows > 1) of 16 accumulators each, requantized and stored. */
__attribute__((target("avx2"), always_inline)) static inline void pw_store2(const qconv_t *q, const rq_t *rq,
                                                                           int64_t m, int rows, __m256i r0a,
                                                                           __m256i r0b, __m256i r1a, __m256i r1b,
                                                                           uint8_t *y, int64_t ystride, int64_t n) {
    const __m256i v0 = rq_16(rq, r0a, r0b, q->bias[m], q->mult[m]);
    const __m256i v1 = rows > 1 ? rq_16(rq, r1a, r1b, q->bias[m + 1], q->mult[m + 1]) : v0;
    rq_store2(rq, v0, v1, y, rows > 1 ? y + ystride : NULL, n, 0);
}

/* Rows [m0, m0 + rows) (rows <= 4) by one packed tile: the main products, the rows' residuals, the
 * requantized bytes.  `half`: only the tile's first 8 columns (n <= 8, a row's last columns: 7x7 planes end
 * in a tile of one column), half the instructions. */
__attribute__((target("avx2"), always_inline)) static inline void tile_body(const pw_t *p, int64_t m0, int rows,
                                                                            const uint8_t *xp, uint8_t *y,
                                                                            int64_t ystride, int64_t n,
                                                                            const int half) {
    const qconv_t *q = &p->q;
    const int64_t Q = p->Q;
    const int32_t *w0 = p->wq + m0 * Q, *w1 = w0 + (rows > 1 ? Q : 0), *w2 = w0 + (rows > 2 ? 2 * Q : 0),
                  *w3 = w0 + (rows > 3 ? 3 * Q : 0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
            a31 = a00;
#define PW_STEP(w, acc0, acc1)                                                                                   \
    do {                                                                                                       \
        const __m256i s = _mm256_set1_epi32(w);                                                                \
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(b0, s), ones));                   \
        if (!half) acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(b1, s), ones));        \
    } while (0)
    const uint8_t *x = xp;
    for (int64_t qd = 0; qd < Q; qd++, x += 64) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)x);
        const __m256i b1 = half ? b0 : _mm256_loadu_si256((const __m256i *)(x + 32));
        PW_STEP(w0[qd], a00, a01);
        PW_STEP(w1[qd], a10, a11);
        PW_STEP(w2[qd], a20, a21);
        PW_STEP(w3[qd], a30, a31);
    }
    /* each row's residuals summed apart and added to its accumulators (an array of them indexed by the row
     * would live on the stack next to the products) */
    for (int r = 0; r < rows; r++) {
        const int32_t *e = p->rent + 2 * (int64_t)p->rptr[m0 + r], *end = p->rent + 2 * (int64_t)p->rptr[m0 + r + 1];
        if (e == end) continue;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        for (; e < end; e += 2) {
            const uint8_t *xr = xp + (int64_t)e[0] * 64;
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)xr);
            const __m256i b1 = half ? b0 : _mm256_loadu_si256((const __m256i *)(xr + 32));
            PW_STEP(e[1], s0, s1);
        }
        switch (r) {
        case 0: a00 = _mm256_add_epi32(a00, s0), a01 = _mm256_add_epi32(a01, s1); break;
        case 1: a10 = _mm256_add_epi32(a10, s0), a11 = _mm256_add_epi32(a11, s1); break;
        case 2: a20 = _mm256_add_epi32(a20, s0), a21 = _mm256_add_epi32(a21, s1); break;
        default: a30 = _mm256_add_epi32(a30, s0), a31 = _mm256_add_epi32(a31, s1); break;
        }
    }
#undef PW_STEP
    const rq_t rq = rq_init(q);
    pw_store2(q, &rq, m0, rows, a00, half ? a00 : a01, a10, half ? a10 : a11, y, ystride, n);
    if (rows > 2) pw_store2(q, &rq, m0 + 2, rows - 2, a20, half ? a20 : a21, a30, half ? a30 : a31, y + 2 * ystride,
                            ystride, n);
}

__attribute__((target("avx2"), noinline)) static void pw_tile_avx2(const pw_t *p, int64_t m0, int rows,
                                                                   const uint8_t *xp, uint8_t *y, int64_t ystride,
                                                                   int64_t n) {
    tile_body(p, m0, rows, xp, y, ystride, n, 0);
}

__attribute__((target("avx2"), noinline)) static void pw_tile8_avx2(const pw_t *p, int64_t m0, int rows,
                                                                    const uint8_t *xp, uint8_t *y, int64_t ystride,
                                                                    int64_t n) {
    tile_body(p, m0, rows, xp, y, ystride, n, 1);
}
#endif

#ifdef QG_X86
/* The requantization of 16 accumulators of one output channel in a zmm, the same integers as rq_16 and
 * rq_store2: float(acc + bias) * multiplier clamped in float to [qmin - zp, qmax - zp] (both ends: a value
 * past int32 converts to INT32_MIN, which adding a negative zero point would wrap), rounded to nearest even
 * by cvtps, the zero point added and the low bytes of the n <= 16 first stored (vpmovdb). */
typedef struct {
    __m512 lo, hi;
    __m512i zp;
} rq512_t;

__attribute__((target(VNNI512_TARGET), always_inline)) static inline void rq512_store(const rq512_t *r, __m512i acc,
                                                                                    int32_t b, float m, uint8_t *dst,
                                                                                    int64_t n) {
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, _mm512_set1_epi32(b))), _mm512_set1_ps(m));
    const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(f, r->hi), r->lo)), r->zp);
    _mm512_mask_cvtepi32_storeu_epi8(dst, (__mmask16)(n >= TILE ? 0xFFFF : (1u << n) - 1u), v);
}

/* Rows [m0, m0 + rows) (rows <= 8) by T (1 or 2, a constant) packed tiles (xa, and xa + tstride) of na and nb
 * columns, the whole weights: vpdpbusd adds the four u8 x s8 products of a quad to each int32 lane exactly
 * (no int16 step, so no split).  8 rows x 2 tiles of accumulators: 16 of the 32 zmm registers. */
__attribute__((target(VNNI512_TARGET), always_inline)) static inline void vnni_body(const pw_t *p, int64_t m0, int rows,
                                                                                  const uint8_t *xa, uint8_t *y,
                                                                                  int64_t ystride, int64_t na,
                                                                                  int64_t nb, const int T) {
    const qconv_t *q = &p->q;
    const int64_t Q = p->Q, ts = p->tstride;
    const int32_t *w0 = p->wq + m0 * Q;
    int64_t off[8]; /* each row's weights from row 0's (a missing row repeats row 0: computed, never stored) */
    for (int r = 0; r < 8; r++) off[r] = r < rows ? r * Q : 0;
    const int32_t *w1 = w0 + off[1], *w2 = w0 + off[2], *w3 = w0 + off[3], *w4 = w0 + off[4], *w5 = w0 + off[5],
                  *w6 = w0 + off[6], *w7 = w0 + off[7];
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512i b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
#define VN_STEP(w, a, b)                                                                                         \
    do {                                                                                                       \
        const __m512i s = _mm512_set1_epi32(w[qd]);                                                            \
        a = _mm512_dpbusd_epi32(a, x0, s);                                                                     \
        if (T == 2) b = _mm512_dpbusd_epi32(b, x1, s);                                                         \
    } while (0)
    for (int64_t qd = 0; qd < Q; qd++) {
        const __m512i x0 = _mm512_loadu_si512((const void *)(xa + qd * 64));
        const __m512i x1 = T == 2 ? _mm512_loadu_si512((const void *)(xa + ts + qd * 64)) : x0;
        VN_STEP(w0, a0, b0);
        VN_STEP(w1, a1, b1);
        VN_STEP(w2, a2, b2);
        VN_STEP(w3, a3, b3);
        VN_STEP(w4, a4, b4);
        VN_STEP(w5, a5, b5);
        VN_STEP(w6, a6, b6);
        VN_STEP(w7, a7, b7);
    }
#undef VN_STEP
    const rq512_t rq = {.lo = _mm512_set1_ps((float)(q->qmin - q->yzp)), .hi = _mm512_set1_ps((float)(q->qmax - q->yzp)),
                        .zp = _mm512_set1_epi32(q->yzp)};
    const __m512i as[8] = {a0, a1, a2, a3, a4, a5, a6, a7}, bs[8] = {b0, b1, b2, b3, b4, b5, b6, b7};
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        rq512_store(&rq, as[r], q->bias[m], q->mult[m], y + r * ystride, na);
        if (T == 2) rq512_store(&rq, bs[r], q->bias[m], q->mult[m], y + r * ystride + TILE, nb);
    }
}

__attribute__((target(VNNI512_TARGET), noinline)) static void vnni_tile2(const pw_t *p, int64_t m0, int rows,
                                                                         const uint8_t *xa, uint8_t *y,
                                                                         int64_t ystride, int64_t na, int64_t nb) {
    vnni_body(p, m0, rows, xa, y, ystride, na, nb, 2);
}

__attribute__((target(VNNI512_TARGET), noinline)) static void vnni_tile1(const pw_t *p, int64_t m0, int rows,
                                                                         const uint8_t *xa, uint8_t *y,
                                                                         int64_t ystride, int64_t na) {
    vnni_body(p, m0, rows, xa, y, ystride, na, 0, 1);
}
#endif

#ifdef QG_X86
/* Rows [m0, m0 + rows) (rows <= 6) by one packed tile of n columns, the whole weights, on CPUs with AVX-VNNI and
 * no AVX-512: the 8-lane vpdpbusd (exact, as vnni_body), each 64-byte quad two ymm operands (columns 0-7 and
 * 8-15), 6 rows x 16 columns of accumulators (12 of the 16 ymm registers). */
__attribute__((target(VNNI256_TARGET), noinline)) static void vnni256_tile(const pw_t *p, int64_t m0, int rows,
                                                                          const uint8_t *xp, uint8_t *y,
                                                                          int64_t ystride, int64_t n) {
    const qconv_t *q = &p->q;
    const int64_t Q = p->Q;
    const int32_t *w0 = p->wq + m0 * Q;
    int64_t off[6];
    for (int r = 0; r < 6; r++) off[r] = r < rows ? r * Q : 0;
    const int32_t *w1 = w0 + off[1], *w2 = w0 + off[2], *w3 = w0 + off[3], *w4 = w0 + off[4], *w5 = w0 + off[5];
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
#define V8_STEP(w, a, b)                                                                                         \
    do {                                                                                                       \
        const __m256i s = _mm256_set1_epi32(w[qd]);                                                            \
        a = _mm256_dpbusd_avx_epi32(a, x0, s);                                                                 \
        b = _mm256_dpbusd_avx_epi32(b, x1, s);                                                                 \
    } while (0)
    for (int64_t qd = 0; qd < Q; qd++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xp + qd * 64));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xp + qd * 64 + 32));
        V8_STEP(w0, a0, b0);
        V8_STEP(w1, a1, b1);
        V8_STEP(w2, a2, b2);
        V8_STEP(w3, a3, b3);
        V8_STEP(w4, a4, b4);
        V8_STEP(w5, a5, b5);
    }
#undef V8_STEP
    const rq_t rq = rq_init(q);
    pw_store2(q, &rq, m0, rows, a0, b0, a1, b1, y, ystride, n);
    if (rows > 2) pw_store2(q, &rq, m0 + 2, rows - 2, a2, b2, a3, b3, y + 2 * ystride, ystride, n);
    if (rows > 4) pw_store2(q, &rq, m0 + 4, rows - 4, a4, b4, a5, b5, y + 4 * ystride, ystride, n);
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
/* Rows [m0, m0 + rows) (rows <= 4) by one packed tile, whole weights, on aarch64 with the dot product: x packed
 * as s8 (x - 128 for u8 inputs), so each sdot adds the four s8 x s8 products of a quad to a lane exactly; a
 * 64-byte quad is four vectors of 4 columns; 128 * sum(w[m]) puts back what the flip took.  The plain
 * epilogue. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static void sdot_tile(const pw_t *p, int64_t m0, int rows, const uint8_t *xp,
                                                         uint8_t *y, int64_t ystride, int64_t n) {
    const int64_t Q = p->Q;
    const int32_t *w[4];
    for (int r = 0; r < 4; r++) w[r] = p->wq + (m0 + (r < rows ? r : 0)) * Q;
    int32x4_t acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = vdupq_n_s32(0);
    for (int64_t qd = 0; qd < Q; qd++) {
        const int8_t *x = (const int8_t *)(xp + qd * 64);
        const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16), x2 = vld1q_s8(x + 32), x3 = vld1q_s8(x + 48);
        for (int r = 0; r < 4; r++) {
            const int8x16_t wv = vreinterpretq_s8_s32(vdupq_n_s32(w[r][qd]));
            acc[r][0] = vdotq_s32(acc[r][0], x0, wv);
            acc[r][1] = vdotq_s32(acc[r][1], x1, wv);
            acc[r][2] = vdotq_s32(acc[r][2], x2, wv);
            acc[r][3] = vdotq_s32(acc[r][3], x3, wv);
        }
    }
    for (int r = 0; r < rows; r++) {
        int32_t sums[TILE];
        const int32x4_t corr = vdupq_n_s32(p->wsum[m0 + r]);
        for (int v = 0; v < 4; v++) vst1q_s32(sums + 4 * v, vaddq_s32(acc[r][v], corr));
        opt_requant_row(&p->q, sums, n, m0 + r, y + r * ystride);
    }
}


/* The same rows by one packed tile on aarch64 without the dot product: smull multiplies 8 s8 pairs into int16
 * (|product| <= 2^14, exact) and sadalp adds each pair of neighbouring products into an int32 lane, so nothing
 * is summed in int16; a lane holds half a column's quad, and a final pairwise add makes the 16 columns.  Two
 * rows at a time (16 accumulators beside the 4 x vectors and the products, in the 32 registers). */
static void neon_tile(const pw_t *p, int64_t m0, int rows, const uint8_t *xp, uint8_t *y, int64_t ystride,
                      int64_t n) {
    const int64_t Q = p->Q;
    for (int r0 = 0; r0 < rows; r0 += 2) {
        const int pair = rows - r0 >= 2 ? 2 : 1;
        const int32_t *w[2] = {p->wq + (m0 + r0) * Q, p->wq + (m0 + r0 + pair - 1) * Q};
        int32x4_t acc[2][8];
        for (int r = 0; r < 2; r++)
            for (int v = 0; v < 8; v++) acc[r][v] = vdupq_n_s32(0);
        for (int64_t qd = 0; qd < Q; qd++) {
            const int8_t *x = (const int8_t *)(xp + qd * 64);
            int8x16_t xv[4];
            for (int v = 0; v < 4; v++) xv[v] = vld1q_s8(x + 16 * v);
            for (int r = 0; r < 2; r++) {
                const int8x16_t wv = vreinterpretq_s8_s32(vdupq_n_s32(w[r][qd]));
                for (int v = 0; v < 4; v++) {
                    acc[r][2 * v] = vpadalq_s16(acc[r][2 * v], vmull_s8(vget_low_s8(xv[v]), vget_low_s8(wv)));
                    acc[r][2 * v + 1] = vpadalq_s16(acc[r][2 * v + 1], vmull_high_s8(xv[v], wv));
                }
            }
        }
        for (int r = 0; r < pair; r++) {
            int32_t sums[TILE];
            const int32x4_t corr = vdupq_n_s32(p->wsum[m0 + r0 + r]);
            for (int v = 0; v < 4; v++)
                vst1q_s32(sums + 4 * v, vaddq_s32(vpaddq_s32(acc[r][2 * v], acc[r][2 * v + 1]), corr));
            opt_requant_row(&p->q, sums, n, m0 + r0 + r, y + (r0 + r) * ystride);
        }
    }
}
#endif

/* The plain C tile: the same integers (main and residual weights summed per quad) and epilogue. */
static void tile_plain(const pw_t *p, int64_t m0, int rows, const uint8_t *xp, uint8_t *y, int64_t ystride,
                       int64_t n) {
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        uint32_t acc[TILE] = {0};
        const int32_t *w = p->wq + m * p->Q;
        for (int64_t qd = 0; qd < p->Q; qd++) {
            const uint8_t *x = xp + qd * 64;
            const uint32_t wv = (uint32_t)w[qd];
            for (int i = 0; i < 4; i++) {
                const int32_t wi = (int8_t)(uint8_t)(wv >> (8 * i));
                for (int j = 0; j < TILE; j++) acc[j] += (uint32_t)(wi * (int32_t)x[4 * j + i]);
            }
        }
        for (int64_t e = p->rptr[m]; e < p->rptr[m + 1]; e++) {
            const uint8_t *x = xp + (int64_t)p->rent[2 * e] * 64;
            const uint32_t wv = (uint32_t)p->rent[2 * e + 1];
            for (int i = 0; i < 4; i++) {
                const int32_t wi = (int8_t)(uint8_t)(wv >> (8 * i));
                for (int j = 0; j < TILE; j++) acc[j] += (uint32_t)(wi * (int32_t)x[4 * j + i]);
            }
        }
        int32_t sacc[TILE];
        for (int j = 0; j < TILE; j++) sacc[j] = (int32_t)acc[j];
        opt_requant_row(&p->q, sacc, n, m, y + r * ystride);
    }
}

/* The rows [mbase, mbase + mrows) of one image and group by nc columns packed at xb (tiles tstride apart),
 * requantized into yb (row stride P). */
static void run_band(const pw_t *p, int64_t mbase, int64_t mrows, const uint8_t *xb, uint8_t *yb, int64_t nc) {
    const qconv_t *q = &p->q;
#ifdef QG_X86
    if (opt_qconv_vnni512 == 1 && p->whole) { /* two tiles at a time, 8 rows */
        for (int64_t t = 0; t * TILE < nc; t += 2) {
            const int64_t na = pw_min(TILE, nc - t * TILE), nb = pw_min(TILE, nc - (t + 1) * TILE);
            const uint8_t *xa = xb + t * p->tstride;
            for (int64_t r = 0; r < mrows; r += 8) {
                const int rows = (int)pw_min(8, mrows - r);
                uint8_t *dst = yb + r * q->P + t * TILE;
                if (nb > 0)
                    vnni_tile2(p, mbase + r, rows, xa, dst, q->P, na, nb);
                else
                    vnni_tile1(p, mbase + r, rows, xa, dst, q->P, na);
            }
        }
        return;
    }
    if (opt_qconv_vnni256 == 1 && p->whole) { /* 6 rows of one tile */
        for (int64_t t = 0; t * TILE < nc; t++) {
            const int64_t n = pw_min(TILE, nc - t * TILE);
            for (int64_t r = 0; r < mrows; r += 6)
                vnni256_tile(p, mbase + r, (int)pw_min(6, mrows - r), xb + t * p->tstride, yb + r * q->P + t * TILE,
                             q->P, n);
        }
        return;
    }
    const int avx2 = opt_qconv_avx2 == 1 && !p->whole; /* the whole weights would clip vpmaddubsw's sums */
#endif
#if defined(__aarch64__)
    if (p->sdot || p->neon) {
        for (int64_t t = 0; t * TILE < nc; t++)
            for (int64_t r = 0; r < mrows; r += PW_MR)
                (p->sdot ? sdot_tile : neon_tile)(p, mbase + r, (int)pw_min(PW_MR, mrows - r), xb + t * p->tstride,
                                                  yb + r * q->P + t * TILE, q->P, pw_min(TILE, nc - t * TILE));
        return;
    }
#endif
    for (int64_t t = 0; t * TILE < nc; t++) {
        const int64_t n = pw_min(TILE, nc - t * TILE);
        const uint8_t *xp = xb + t * p->tstride;
        for (int64_t r = 0; r < mrows; r += PW_MR) {
            const int rows = (int)pw_min(PW_MR, mrows - r);
            uint8_t *dst = yb + r * q->P + t * TILE;
#ifdef QG_X86
            if (avx2) {
                (n > 8 ? pw_tile_avx2 : pw_tile8_avx2)(p, mbase + r, rows, xp, dst, q->P, n);
                continue;
            }
#endif
            tile_plain(p, mbase + r, rows, xp, dst, q->P, n);
        }
    }
}

/* A work item's place: image and group bg, columns [c0, c0 + nc), rows [m0, m0 + mrows) of the group;
 * 0 where it is empty. */
static int item_place(const qconv_t *q, int64_t it, int64_t *bg, int64_t *c0, int64_t *nc, int64_t *m0,
                      int64_t *mrows) {
    const int64_t jm = it % q->nm, jn = (it / q->nm) % q->nn;
    *bg = it / (q->nm * q->nn);
    *c0 = jn * q->nb;
    *nc = pw_min(q->P - *c0, q->nb);
    *m0 = jm * q->mb;
    *mrows = pw_min(q->mg - *m0, q->mb);
    return *nc > 0 && *mrows > 0;
}

/* Work item: (image and group, band of columns, band of rows) of the packed input. */
static void gemm_item(void *ctx, int64_t it) {
    pw_t *p = ctx;
    const qconv_t *q = &p->q;
    int64_t bg, c0, nc, m0, mrows;
    if (!item_place(q, it, &bg, &c0, &nc, &m0, &mrows)) return;
    const int64_t b = bg / q->G, g = bg % q->G, mbase = g * q->mg + m0;
    run_band(p, mbase, mrows, p->xq + (bg * p->tiles + c0 / TILE) * p->tstride, q->y + (b * q->M + mbase) * q->P + c0,
             nc);
}

/* Work item of a call whose bands of columns each take all the rows (nm == 1), or whose items have rows enough
 * that packing their band again costs less than a pass of its own (PW_REPACK_ROWS): its band packed into the
 * thread's scratch, then its rows.  One hand-off to the pool instead of two (pack, then GEMM): most of a mobile
 * net's 1x1 convs take 5-30 us, and the second hand-off was a visible part of that at 2 threads. */
static void packed_gemm_item(void *ctx, int64_t it) {
    pw_t *p = ctx;
    qconv_t *q = &p->q;
    int64_t bg, c0, nc, m0, mrows;
    if (!item_place(q, it, &bg, &c0, &nc, &m0, &mrows)) return;
    const int64_t tiles = (nc + TILE - 1) / TILE, t0 = c0 / TILE;
    uint8_t *buf = (uint8_t *)opt_scratch((size_t)(tiles * p->tstride + 3) / 4);
    if (!buf) {
        q->failed = 1;
        return;
    }
    for (int64_t t = 0; t < tiles; t++) pack_tile(p, bg * p->tiles + t0 + t, buf + t * p->tstride);
    const int64_t b = bg / q->G, g = bg % q->G, mbase = g * q->mg + m0;
    run_band(p, mbase, mrows, buf, q->y + (b * q->M + mbase) * q->P + c0, nc);
}

/* The weight blob (see optcli_native.h): its format word, the main quads, the residual lists in order
 * (checked first: their ends bound what the second loop reads), each entry's quad within K. */
static int read_blob(pw_t *p, const int32_t *wq) {
    const qconv_t *q = &p->q;
    p->Q = (q->K + 3) / 4;
    if (wq[0] != 0 && wq[0] != 1) return OPT_EINVAL;
    p->whole = wq[0];
    p->wq = wq + 1;
    p->rptr = p->wq + q->M * p->Q;
    p->rent = p->rptr + q->M + 1;
    if (p->rptr[0] != 0 || (p->whole && p->rptr[q->M] != 0)) return OPT_EINVAL;
    for (int64_t m = 0; m < q->M; m++)
        if (p->rptr[m + 1] < p->rptr[m]) return OPT_EINVAL;
    for (int64_t e = 0; e < p->rptr[q->M]; e++)
        if (p->rent[2 * e] < 0 || p->rent[2 * e] >= p->Q) return OPT_EINVAL;
    return 0;
}

/* Bands of columns (nb, a multiple of `unit` columns whose packed quads fit `panel` bytes) and, with more
 * threads than bands, of rows (each re-reads or re-packs its band's columns). */
static void plan_items(pw_t *p, int64_t panel, int64_t unit, int cap) {
    qconv_t *q = &p->q;
    const int threads = optcli_get_num_threads();
    const int64_t want = cap || threads == 1 ? 1 : 4 * (int64_t)threads;
    int64_t nb = panel / (p->tstride * (unit / TILE)) * unit;
    if (nb < unit) nb = unit;
    if (nb > p->tiles * TILE) nb = p->tiles * TILE;
    /* With too few bands for the threads, more (narrower) bands first: a band of columns packs only its own,
     * where bands of rows each pack their band again (a 112x112 map of 8 channels was 2 bands, one of 256
     * columns: 1.09x from the second thread).  Then bands of equal width, not full panels and a remainder. */
    int64_t nn = (q->P + nb - 1) / nb;
    const int64_t units = (q->P + unit - 1) / unit;
    if (q->N * q->G * nn < want) {
        int64_t more = (want + q->N * q->G - 1) / (q->N * q->G);
        if (more > units) more = units;
        if (more > nn) nn = more;
    }
    nb = ((q->P + nn - 1) / nn + unit - 1) / unit * unit;
    q->nb = nb;
    q->nn = (q->P + nb - 1) / nb;
    /* bands of rows only where there are fewer than two bands of columns a thread: they cost a pack each */
    const int64_t items = q->N * q->G * q->nn;
    const int64_t split = items < want && items < 2 * (int64_t)threads ? (want + items - 1) / items : 1;
    q->mb = (q->mg + split - 1) / split;
    const int64_t mr = !p->whole ? PW_MR : opt_qconv_vnni512 == 1 ? 8 : opt_qconv_vnni256 == 1 ? 6 : PW_MR; /* rows */
    q->mb = (q->mb + mr - 1) / mr * mr;
    q->nm = (q->mg + q->mb - 1) / q->mb;
}

OPT_API int optcli_qconv2d_pointwise(const void *x, const int32_t *wq, const int32_t *bias, const float *mult, void *y,
                                     const int64_t *geom, const int32_t *qp) {
    pw_t p = {.q = {.x = x, .bias = bias, .mult = mult, .y = y}};
    qconv_t *q = &p.q;
    int rc = opt_qconv_setup(q, geom, qp);
    if (rc) return rc;
    if (!bias || q->KH != 1 || q->KW != 1 || q->sh != 1 || q->sw != 1 || q->pt || q->pl || q->OH != q->H ||
        q->OW != q->W)
        return OPT_EINVAL;
    if ((rc = read_blob(&p, wq))) return rc;
    if (q->N == 0 || q->P == 0) return 0;
    p.tiles = (q->P + TILE - 1) / TILE;
    p.tstride = p.Q * 64;
    p.sdot = opt_qconv_sdot == 1 && p.whole;
    p.neon = opt_qconv_neon == 1 && p.whole;
    if (p.sdot || p.neon) { /* the flip's correction per row: 128 * the sum of its weight bytes */
        p.wsum = malloc((size_t)q->M * sizeof(int32_t));
        if (!p.wsum) return OPT_ENOMEM;
        for (int64_t m = 0; m < q->M; m++) {
            uint32_t sum = 0;
            for (int64_t qd = 0; qd < p.Q; qd++) {
                const uint32_t v = (uint32_t)p.wq[m * p.Q + qd];
                for (int i = 0; i < 4; i++) sum += (uint32_t)(int32_t)(int8_t)(uint8_t)(v >> (8 * i));
            }
            p.wsum[m] = (int32_t)(sum * 128u);
        }
    }
    const int64_t macs = q->N * q->M * q->K * q->P;
    const int cap = macs < (1 << 18) ? 1 : 0;
    plan_items(&p, PW_PANEL, TILE, cap);
    if (q->nm == 1 || q->mb >= PW_REPACK_ROWS) { /* each item packs its own band (see PW_REPACK_ROWS) */
        opt_parallel(packed_gemm_item, &p, q->N * q->G * q->nn * q->nm, cap);
        free(p.wsum);
        return q->failed ? OPT_ENOMEM : 0;
    }
    p.xq = malloc((size_t)(q->N * q->G * p.tiles * p.tstride));
    if (!p.xq) {
        free(p.wsum);
        return OPT_ENOMEM;
    }
    opt_parallel(pack_item, &p, q->N * q->G * p.tiles, cap);
    opt_parallel(gemm_item, &p, q->N * q->G * q->nn * q->nm, cap);
    free(p.xq);
    free(p.wsum);
    return 0;
}

/* ---- Dense convs: any window, strides, dilations, padding, groups (optcli_qconv2d_dense) ----
 *
 * The same GEMM over K = (c, kh, kw) in the model's order (the weights as pack_quads packs them, so a quad
 * is four consecutive k of that order), its columns packed per work item from a padded u8 copy of the
 * input: its padding holds the (flipped) zero point, whose products the bias's -x_zp' * sum(w) cancels
 * exactly, as it does for every other tap.  The copy keeps a padded row's columns by phase (x % sw), so
 * that the columns a tap reads along an output row, x = ow * sw + kw * dw, lie side by side at any stride:
 * each k row of a 16-column tile is one or a few contiguous runs of bytes (one per output row the tile
 * touches), loaded whole or masked (AVX-512 BW) and interleaved four k at a time by two rounds of unpacks. */

/* n bytes of s, their top bits flipped by `flip` (0 or 0x80), to d[0], d[step], ...: plain loops over
 * restrict pointers, which the compiler vectorises (a loop through the item's struct reloaded its pointers
 * every byte and took a fifth of a ResNet's dense conv time). */
static void flip_copy(uint8_t *restrict d, const uint8_t *restrict s, int64_t n, uint8_t flip) {
    for (int64_t i = 0; i < n; i++) d[i] = s[i] ^ flip;
}

static void flip_split2(uint8_t *restrict d0, uint8_t *restrict d1, const uint8_t *restrict s, int64_t n,
                        uint8_t flip) {
    for (int64_t i = 0; i < n; i++) {
        d0[i] = s[2 * i] ^ flip;
        d1[i] = s[2 * i + 1] ^ flip;
    }
}

/* Plane i of the input (image-major), flipped to u8, into its padded copy; the rest the zero point. */
static void dense_pad_item(void *ctx, int64_t i) {
    const pw_t *p = ctx;
    const qconv_t *q = &p->q;
    const int64_t sw = q->sw, HP = p->ps / p->rs, WP = (q->OW - 1) * sw + (q->KW - 1) * q->dw + 1, WS = p->WS;
    const int64_t pl = q->pl, rs = p->rs, W = q->W;
    const uint8_t flip = q->xs ? 0x80 : 0, fill = (uint8_t)((q->xzp + (q->xs ? 128 : 0)) & 0xff);
    uint8_t *dst = (uint8_t *)p->xpad + i * p->ps;
    const uint8_t *src = q->x + i * q->H * W;
    const int64_t n = pw_min(W, WP - pl), rows = pw_min(q->H, HP - q->pt); /* the input's columns and rows kept */
    if (sw != 1 || n <= 0 || rows <= 0) {
        memset(dst, fill, (size_t)p->ps);
    } else { /* only what the input leaves: the rows above and below, each row's margins */
        memset(dst, fill, (size_t)(q->pt * rs));
        for (int64_t r = q->pt; r < q->pt + rows; r++) {
            memset(dst + r * rs, fill, (size_t)pl);
            memset(dst + r * rs + pl + n, fill, (size_t)(rs - pl - n));
        }
        memset(dst + (q->pt + rows) * rs, fill, (size_t)((HP - q->pt - rows) * rs));
    }
    for (int64_t ih = 0; ih < q->H && ih + q->pt < HP; ih++) {
        uint8_t *row = dst + (ih + q->pt) * rs;
        const uint8_t *s = src + ih * W;
        if (sw == 1) {
            flip_copy(row + pl, s, n, flip);
            continue;
        }
        for (int64_t ph = 0; ph < sw; ph++) { /* phase ph: the input columns iw with (pl + iw) % sw == ph */
            const int64_t first = ((ph - pl) % sw + sw) % sw;
            if (sw == 2 && ph == 0) { /* both phases at once: pairs of columns */
                const int64_t pairs = (n - first) / 2, i0 = (pl + first) / 2;
                flip_split2(row + i0, row + WS + (pl + first + 1) / 2, s + first, pairs, flip);
                for (int64_t iw = first + 2 * pairs; iw < n; iw++)
                    row[(pl + iw) % 2 * WS + (pl + iw) / 2] = s[iw] ^ flip;
                if (first && n > 0) row[WS + pl / 2] = s[0] ^ flip; /* column 0 at phase 1 */
                break;
            }
            uint8_t *d = row + ph * WS + (pl + first) / sw;
            for (int64_t iw = first; iw < n; iw += sw) *d++ = s[iw] ^ flip;
        }
    }
}

/* A tile's columns [c, c + n) by output row: run r covers the tile's columns [j0, j0 + n), which read the
 * bytes at off + (k's offset) + [0, n) of their image and group's planes. */
typedef struct {
    int64_t j0, n, off;
} run_t;

static int tile_runs(const pw_t *p, int64_t c, int64_t n, run_t *runs) {
    const qconv_t *q = &p->q;
    int nr = 0;
    for (int64_t j = 0; j < n;) {
        const int64_t col = c + j, oh = col / q->OW, ow = col % q->OW, len = pw_min(q->OW - ow, n - j);
        runs[nr++] = (run_t){j, len, oh * q->sh * p->rs + ow};
        j += len;
    }
    return nr;
}

/* One tile's quads [Q][16 columns][4 k] from the padded copy of its image and group (xg), portable. */
static void dense_pack_plain(const pw_t *p, const uint8_t *xg, const run_t *runs, int nr, uint8_t *dst) {
    memset(dst, 0, (size_t)p->tstride);
    for (int64_t k = 0; k < p->q.K; k++) {
        uint8_t *d = dst + (k / 4) * 64 + (k & 3);
        for (int r = 0; r < nr; r++) {
            const uint8_t *s = xg + p->koff[k] + runs[r].off;
            for (int64_t j = 0; j < runs[r].n; j++) d[4 * (runs[r].j0 + j)] = s[j];
        }
    }
}

#ifdef QG_X86
/* Four k rows of 16 bytes as a quad: [16 columns][4 k] by two rounds of unpacks. */
__attribute__((target(VNNI512_TARGET), always_inline)) static inline void store_quad(uint8_t *dst, __m128i v0,
                                                                                   __m128i v1, __m128i v2,
                                                                                   __m128i v3) {
    const __m128i a = _mm_unpacklo_epi8(v0, v1), b = _mm_unpackhi_epi8(v0, v1);
    const __m128i c = _mm_unpacklo_epi8(v2, v3), d = _mm_unpackhi_epi8(v2, v3);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(a, c));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(a, c));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(b, d));
    _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(b, d));
}

/* The same quads by vectors: each k row one load of 16 bytes (a tile within one output row), or a masked
 * load per run (columns past the tile's n zero).  Past K any bytes (koff 0): their weights are 0. */
__attribute__((target(VNNI512_TARGET))) static void dense_pack_vnni(const pw_t *p, const uint8_t *xg,
                                                                   const run_t *runs, int nr, uint8_t *dst) {
    const int64_t *ko = p->koff;
    if (nr == 1 && runs[0].n == TILE) {
        const uint8_t *x = xg + runs[0].off;
        for (int64_t qd = 0; qd < p->Q; qd++, dst += 64, ko += 4)
            store_quad(dst, _mm_loadu_si128((const __m128i *)(x + ko[0])),
                       _mm_loadu_si128((const __m128i *)(x + ko[1])), _mm_loadu_si128((const __m128i *)(x + ko[2])),
                       _mm_loadu_si128((const __m128i *)(x + ko[3])));
        return;
    }
    __mmask16 mask[TILE];
    const uint8_t *base[TILE]; /* (each run's address less its j0: the masked lanes are not read) */
    for (int r = 0; r < nr; r++) {
        mask[r] = (__mmask16)(((1u << runs[r].n) - 1u) << runs[r].j0);
        base[r] = xg + runs[r].off - runs[r].j0;
    }
    for (int64_t qd = 0; qd < p->Q; qd++, dst += 64, ko += 4) {
        __m128i v[4];
        for (int i = 0; i < 4; i++) {
            __m128i t = _mm_maskz_loadu_epi8(mask[0], base[0] + ko[i]);
            for (int r = 1; r < nr; r++) t = _mm_mask_loadu_epi8(t, mask[r], base[r] + ko[i]);
            v[i] = t;
        }
        store_quad(dst, v[0], v[1], v[2], v[3]);
    }
}
#endif

/* Tiles [t0, t0 + tiles) of image and group bg packed into dst. */
static void dense_pack(const pw_t *p, int64_t bg, int64_t t0, int64_t tiles, uint8_t *dst) {
    const qconv_t *q = &p->q;
    const uint8_t *xg = p->xpad + (bg / q->G * q->C + bg % q->G * q->cg) * p->ps;
    for (int64_t t = t0; t < t0 + tiles; t++, dst += p->tstride) {
        run_t runs[TILE];
        const int nr = tile_runs(p, t * TILE, pw_min(TILE, q->P - t * TILE), runs);
#ifdef QG_X86
        if (opt_qconv_vnni512 == 1) {
            dense_pack_vnni(p, xg, runs, nr, dst);
            continue;
        }
#endif
        dense_pack_plain(p, xg, runs, nr, dst);
    }
}

/* Work item of the pack made once per call: one tile of one image and group. */
static void dense_pack_item(void *ctx, int64_t i) {
    pw_t *p = ctx;
    dense_pack(p, i / p->tiles, i % p->tiles, 1, p->xq + i * p->tstride);
}

/* Work item: its band of columns (packed once per call, or now into the thread's scratch), then its rows
 * over them. */
static void dense_item(void *ctx, int64_t it) {
    pw_t *p = ctx;
    qconv_t *q = &p->q;
    int64_t bg, c0, nc, m0, mrows;
    if (!item_place(q, it, &bg, &c0, &nc, &m0, &mrows)) return;
    const int64_t b = bg / q->G, g = bg % q->G, mbase = g * q->mg + m0, tiles = (nc + TILE - 1) / TILE;
    const uint8_t *xb;
    if (p->xq) {
        xb = p->xq + (bg * p->tiles + c0 / TILE) * p->tstride;
    } else {
        uint8_t *buf = (uint8_t *)opt_scratch((size_t)(tiles * p->tstride + 3) / 4);
        if (!buf) {
            q->failed = 1;
            return;
        }
        dense_pack(p, bg, c0 / TILE, tiles, buf);
        xb = buf;
    }
    run_band(p, mbase, mrows, xb, q->y + (b * q->M + mbase) * q->P + c0, nc);
}

#define DENSE_PREPACK PW_PANEL /* the most packed bytes made once per call, where bands of rows share them: past
                               * the L2 share a panel has, 2 threads measured slower than packing per band */
#define DENSE_SLACK 64 /* bytes before and after the padded copy: a masked load's address may start before it */

OPT_API int optcli_qconv2d_dense(const void *x, const int32_t *wq, const int32_t *bias, const float *mult, void *y,
                                 const int64_t *geom, const int32_t *qp) {
    pw_t p = {.q = {.x = x, .bias = bias, .mult = mult, .y = y}};
    qconv_t *q = &p.q;
    int rc = opt_qconv_setup(q, geom, qp);
    if (rc) return rc;
    if (!bias) return OPT_EINVAL;
    if ((rc = read_blob(&p, wq))) return rc;
    if (q->N == 0 || q->P == 0) return 0;
    const int64_t HP = (q->OH - 1) * q->sh + (q->KH - 1) * q->dh + 1;
    const int64_t WP = (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1;
    p.WS = (WP + q->sw - 1) / q->sw;
    p.rs = q->sw * p.WS;
    p.ps = HP * p.rs;
    p.tiles = (q->P + TILE - 1) / TILE;
    p.tstride = p.Q * 64;
    int64_t *koff = malloc((size_t)(4 * p.Q) * sizeof(int64_t));
    uint8_t *xpad = malloc((size_t)(q->N * q->C * p.ps + 2 * DENSE_SLACK));
    if (!koff || !xpad) {
        free(koff), free(xpad);
        return OPT_ENOMEM;
    }
    for (int64_t k = 0, c = 0, kh = 0, kw = 0; k < 4 * p.Q; k++) { /* (counters: a division per k showed) */
        const int64_t kx = kw * q->dw;
        koff[k] = k < q->K ? c * p.ps + kh * q->dh * p.rs + (kx % q->sw) * p.WS + kx / q->sw : 0;
        if (++kw == q->KW) {
            kw = 0;
            if (++kh == q->KH) kh = 0, c++;
        }
    }
    p.koff = koff;
    p.xpad = xpad + DENSE_SLACK;
    const int64_t macs = q->N * q->M * q->K * q->P;
    const int cap = macs < (1 << 18) ? 1 : 0;
    opt_parallel(dense_pad_item, &p, q->N * q->C, cap);
    plan_items(&p, PW_PANEL, 2 * TILE, cap);
    uint8_t *xq = NULL;
    const int64_t packed = q->N * q->G * p.tiles * p.tstride;
    if (q->nm > 1 && packed <= DENSE_PREPACK) { /* bands of rows: each would pack its columns again */
        if ((xq = malloc((size_t)packed))) {
            p.xq = xq;
            opt_parallel(dense_pack_item, &p, q->N * q->G * p.tiles, cap);
        }
    }
    opt_parallel(dense_item, &p, q->N * q->G * q->nn * q->nm, cap);
    free(koff), free(xpad), free(xq);
    return q->failed ? OPT_ENOMEM : 0;
}
