/* Integer depthwise convolutions with the channels in the vector lanes (AVX2 + FMA; optcli.QConv steps whose
 * groups each hold one input and one output channel).  The NCHW kernels of qdepthwise.c run one plane at a
 * time: on the 7x7, 14x14 and 28x28 planes of a MobileNet their per-plane work (the padded copy, row ends,
 * runs of 16 lanes that a 7- or 14-wide row half fills) cost 2.2-2.5 ns an output, 3-4x a wide plane's.  Here a
 * work item is 8 channels and a band of output rows: their input rows are transposed 8 pixels by 8 channels
 * at a time into a float tile [rows][columns][8 channels] padded with the zero point, each output pixel is
 * one FMA per tap for 8 channels whatever the plane's width or the stride, and 8 pixels by 8 channels are
 * requantized together and transposed back to NCHW bytes as they are stored.
 *
 * Exact: each product of an uncentred x (|x| <= 255) and a weight (|w| <= 128) is an integer below 2**15
 * and every partial sum of at most 64 taps stays below 2**24, so float32 holds each sum exactly whatever
 * the order; zero_point * sum(w) is folded into the bias in wrapping int32 (qdepthwise.c's argument), and
 * the requantization is rq_half's (qconv_kernel.h), onnxruntime's arithmetic.
 *
 * Where the CPU has AVX-512 with VNNI (opt_qconv_vnni512, variant 4) the same walk runs 16 channels a work
 * item with vpdpbusd in place of the FMAs, summing in int32 (the section below says how). */
#include <stdlib.h>

#include "optcli_native.h"
#include "qconv_kernel.h"
#include "simd.h"

#ifdef QG_X86

#define LB 8    /* channels per block: one vector of floats */
#define LB16 16 /* the AVX-512 kernels' blocks: one zmm of floats */
#define PX 8 /* output pixels per group: 8 accumulators beside the tap's weights */
#define TILE_BYTES (64 * 1024) /* a band's float tile (in L2): 112-wide planes ran 0.92x 24 KB bands' time */
#define TILE16_BYTES (128 * 1024) /* the AVX-512 kernel's: 64 bytes a pixel, so 112-wide planes keep 15-row bands */

typedef struct {
    const qconv_t *q;
    int64_t lb;          /* channels per block: LB (AVX2, floats) or LB16 (AVX-512, quads of bytes) */
    int vbmi;            /* lanes16_fill_vbmi fills the tile */
    int64_t WF;          /* tile row width in pixels: the taps' reach and every input column */
    int64_t band, nbands, nblocks, taps; /* taps: the window's, or its quads for LB16 */
    int32_t toff[64];    /* each tap's (quad's) offset in the tile, in words */
    const int32_t *src;  /* each input pixel's tile place from padded row 0, in pixels [H * W] (W < 8 only) */
    const int32_t *dst;  /* each output pixel's first tap's tile place from padded row 0 [OH * OW] (OW < PX) */
} lanes_t;

/* 8 rows of 8 bytes (8 channels' 8 pixels) transposed: v[i] holds pixels 2i and 2i + 1, 8 channel bytes each. */
__attribute__((target("avx2"))) ALWAYS_INLINE void transpose8x8(const __m128i *r, __m128i *v) {
    const __m128i t0 = _mm_unpacklo_epi8(r[0], r[1]), t1 = _mm_unpacklo_epi8(r[2], r[3]);
    const __m128i t2 = _mm_unpacklo_epi8(r[4], r[5]), t3 = _mm_unpacklo_epi8(r[6], r[7]);
    const __m128i u0 = _mm_unpacklo_epi16(t0, t1), u1 = _mm_unpackhi_epi16(t0, t1); /* pixels 0-3, 4-7: c0-3 */
    const __m128i u2 = _mm_unpacklo_epi16(t2, t3), u3 = _mm_unpackhi_epi16(t2, t3); /* c4-7 */
    v[0] = _mm_unpacklo_epi32(u0, u2);
    v[1] = _mm_unpackhi_epi32(u0, u2);
    v[2] = _mm_unpacklo_epi32(u1, u3);
    v[3] = _mm_unpackhi_epi32(u1, u3);
}

/* 8 input pixels of 8 channel planes (8 bytes each, at p[j] + q0) transposed (transpose8x8). */
__attribute__((target("avx2"))) ALWAYS_INLINE void bytes8x8(const uint8_t *const *p, int64_t q0, __m128i *v) {
    __m128i r[8];
    for (int j = 0; j < 8; j++) r[j] = _mm_loadl_epi64((const __m128i *)(p[j] + q0));
    transpose8x8(r, v);
}

/* 8 input pixels of 8 channel planes (8 bytes each, at p[j] + q0) as 8 vectors of 8 channels, floats,
 * stored at out[i] (i the pixel). */
__attribute__((target("avx2"))) ALWAYS_INLINE void lanes_in8(const uint8_t *const *p, int64_t q0, int xs,
                                                          uint32_t *const *out) {
    __m128i v[4];
    bytes8x8(p, q0, v);
    for (int i = 0; i < 4; i++) {
        const __m128i lo = v[i], hi = _mm_srli_si128(v[i], 8);
        const __m256i a = xs ? _mm256_cvtepi8_epi32(lo) : _mm256_cvtepu8_epi32(lo);
        const __m256i b = xs ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepu8_epi32(hi);
        _mm256_storeu_ps((float *)out[2 * i], _mm256_cvtepi32_ps(a));
        _mm256_storeu_ps((float *)out[2 * i + 1], _mm256_cvtepi32_ps(b));
    }
}

/* 8 input pixels of lb channel planes (at p[j] + q0) as 8 vectors of lb 32-bit words (floats, or the quad
 * kernel's bytes), at out[i]. */
typedef void (*put8_fn)(const uint8_t *const *p, int64_t q0, int xs, uint32_t *const *out);

/* One input value as a tile word: its float's bits, or for the quad kernel the byte read as u8 (s8 flipped
 * by 0x80, as the xor of lanesq_in8). */
static inline uint32_t tile_word(const qconv_t *q, uint8_t x, int quad) {
    if (quad) return (uint32_t)(uint8_t)(x ^ (q->xs ? 0x80 : 0));
    const float f = q->xs ? (float)(int8_t)x : (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The band's tile: pad rows and columns set to the zero point, the input rows it covers transposed in (lb
 * channels a pixel, 8 pixels at a time by put8).  Inlined into each kernel's target. */
ALWAYS_INLINE void fill_body(const lanes_t *L, const uint8_t *const *plane, int64_t pr0, int64_t R, uint32_t *F,
                             const int64_t lb, put8_fn put8, const int quad) {
    const qconv_t *q = L->q;
    const int64_t WF = L->WF, H = q->H, W = q->W, pt = q->pt, pl = q->pl;
    uint32_t zp;
    if (quad) {
        zp = (uint32_t)(q->xzp + (q->xs ? 128 : 0));
    } else {
        const float f = (float)q->xzp;
        memcpy(&zp, &f, sizeof zp);
    }
    for (int64_t r = 0; r < R; r++) {
        const int64_t pr = pr0 + r;
        uint32_t *row = F + r * WF * lb;
        const int inside = pr >= pt && pr < pt + H;
        for (int64_t j = 0; j < WF; j++) {
            if (inside && j == pl) j = pl + W; /* the input's columns: transposed below */
            if (j < WF)
                for (int64_t l = 0; l < lb; l++) row[j * lb + l] = zp;
        }
    }
    const int64_t ih0 = pr0 - pt < 0 ? 0 : pr0 - pt, ih1 = pr0 + R - pt > H ? H : pr0 + R - pt;
    if (ih1 <= ih0) return;
    const int64_t qa = ih0 * W, qb = ih1 * W, base = pr0 * WF;
    const int32_t *src = L->src;
    if (qb - qa < 8) { /* fewer than 8 input pixels: one at a time */
        for (int64_t i = qa; i < qb; i++)
            for (int64_t j = 0; j < lb; j++)
                F[((i / W + pt) * WF + i % W + pl - base) * lb + j] = tile_word(q, plane[j][i], quad);
        return;
    }
    if (W >= 8) { /* row by row: 8 columns at a time, the last 8 overlapping the ones before */
        for (int64_t ih = ih0; ih < ih1; ih++) {
            uint32_t *row = F + ((ih + pt) * WF + pl - base) * lb;
            for (int64_t iw = 0;; iw += 8) {
                const int last = iw + 8 >= W;
                if (last) iw = W - 8;
                uint32_t *out[8];
                for (int i = 0; i < 8; i++) out[i] = row + (iw + i) * lb;
                put8(plane, ih * W + iw, q->xs, out);
                if (last) break;
            }
        }
        return;
    }
    for (int64_t q0 = qa;; q0 += 8) { /* rows under 8 wide: 8 pixels of the plane at a time, across rows */
        const int last = q0 + 8 >= qb;
        if (last) q0 = qb - 8; /* the last 8 overlap the ones before: the same values again */
        uint32_t *out[8];
        for (int i = 0; i < 8; i++) out[i] = F + (src[q0 + i] - base) * lb;
        put8(plane, q0, q->xs, out);
        if (last) break;
    }
}

__attribute__((target("avx2"))) static void lanes_fill(const lanes_t *L, const uint8_t *const *plane, int64_t pr0,
                                                       int64_t R, float *F) {
    fill_body(L, plane, pr0, R, (uint32_t *)F, LB, lanes_in8, 0);
}

/* A block's parameters in plain arrays, lb channels from c0 of image b: its planes, each tap's weights
 * w[t * lb + j], the bias less zero_point * sum(w) (int32, wrapping) and as a float, the multipliers; lanes
 * past the last channel repeat it with weights 0 (computed, never stored).  exact: float32 holds every
 * partial sum started at the bias. */
typedef struct {
    const uint8_t *plane[LB16];
    uint8_t *y[LB16];
    float w[64 * LB16], fb[LB16], ml[LB16];
    int32_t bi[LB16];
    int nc, exact;
} blkp_t;

static void block_params(const lanes_t *L, int64_t b, int64_t c0, blkp_t *p) {
    const qconv_t *q = L->q;
    const int64_t lb = L->lb, taps = L->taps, P = q->OH * q->OW;
    p->nc = q->C - c0 < lb ? (int)(q->C - c0) : (int)lb;
    int64_t big = 0;
    for (int64_t j = 0; j < lb; j++) {
        const int64_t c = c0 + (j < p->nc ? j : p->nc - 1);
        p->plane[j] = q->x + (b * q->C + c) * q->H * q->W;
        p->y[j] = q->y + (b * q->M + c) * P;
        uint32_t wsum = 0;
        for (int64_t t = 0; t < taps; t++) {
            const int8_t v = j < p->nc ? q->wd[c * taps + t] : 0;
            p->w[t * lb + j] = (float)v;
            wsum += (uint32_t)(int32_t)v;
        }
        p->bi[j] = (int32_t)((q->bias ? (uint32_t)q->bias[c] : 0u) - (uint32_t)q->xzp * wsum);
        p->fb[j] = (float)p->bi[j];
        p->ml[j] = q->mult[c];
        const int64_t a = p->bi[j] < 0 ? -(int64_t)p->bi[j] : p->bi[j];
        big = a > big ? a : big;
    }
    p->exact = big + taps * 255 * 128 < ((int64_t)1 << 24); /* every partial sum with the bias in float32 */
}

/* Work item it's place: image b, first channel c0, output rows [oh0, oh1), padded rows [pr0, pr0 + R). */
typedef struct {
    int64_t b, c0, oh0, oh1, pr0, R;
} place_t;

static place_t item_place(const lanes_t *L, int64_t it) {
    const qconv_t *q = L->q;
    const int64_t per_image = L->nblocks * L->nbands, blk = it % per_image / L->nbands;
    place_t p = {.b = it / per_image, .c0 = blk * L->lb, .oh0 = it % L->nbands * L->band};
    p.oh1 = p.oh0 + L->band < q->OH ? p.oh0 + L->band : q->OH;
    p.pr0 = p.oh0 * q->sh;
    p.R = (p.oh1 - 1) * q->sh + (q->KH - 1) * q->dh + 1 - p.pr0;
    return p;
}

/* One block's channels: each tap's 8 weights, the bias, the multiplier, the output planes. */
typedef struct {
    __m256 wv[64];
    __m256 init;    /* the accumulators' start: the bias where float32 holds every partial sum with it, else 0 */
    __m256i bias;   /* the bias added in int32 where it is not in init */
    __m256 mul;
    rq_t rq;        /* the requantization's bounds and zero point */
    uint8_t *y[LB];
    int nc, exact;  /* channels in use; whether init holds the bias */
} blk_t;

/* 8 pixels' accumulators (8 channels each) requantized, transposed to 8 channels' 8 bytes and stored at
 * y[j] + p0 for the block's channels (n < 8 pixels: only those). */
__attribute__((target("avx2"))) static inline void lanes_store(const rq_t *rq, const __m256 *acc, const blk_t *k,
                                                               int64_t p0, int64_t n) {
    __m256i h[8];
    for (int i = 0; i < 8; i++)
        h[i] = k->exact ? _mm256_cvtps_epi32(_mm256_min_ps(_mm256_mul_ps(acc[i], k->mul), rq->hi))
                        : rq_half(rq, _mm256_cvtps_epi32(acc[i]), k->bias, k->mul);
    const __m256i p01 = _mm256_adds_epi16(_mm256_packs_epi32(h[0], h[1]), rq->zp); /* h0 c0-3, h1 c0-3 | c4-7 */
    const __m256i p23 = _mm256_adds_epi16(_mm256_packs_epi32(h[2], h[3]), rq->zp);
    const __m256i p45 = _mm256_adds_epi16(_mm256_packs_epi32(h[4], h[5]), rq->zp);
    const __m256i p67 = _mm256_adds_epi16(_mm256_packs_epi32(h[6], h[7]), rq->zp);
    __m256i t0 = rq->ys ? _mm256_packs_epi16(p01, p23) : _mm256_packus_epi16(p01, p23); /* pixels 0-3, c0-3 | c4-7 */
    __m256i t1 = rq->ys ? _mm256_packs_epi16(p45, p67) : _mm256_packus_epi16(p45, p67); /* pixels 4-7 */
    if (rq->ys) {
        t0 = _mm256_max_epi8(_mm256_min_epi8(t0, rq->hi8), rq->lo8);
        t1 = _mm256_max_epi8(_mm256_min_epi8(t1, rq->hi8), rq->lo8);
    } else {
        t0 = _mm256_max_epu8(_mm256_min_epu8(t0, rq->hi8), rq->lo8);
        t1 = _mm256_max_epu8(_mm256_min_epu8(t1, rq->hi8), rq->lo8);
    }
    const __m256i sel = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9,
                                         13, 2, 6, 10, 14, 3, 7, 11, 15); /* 4 pixels x 4 channels to channel-major */
    t0 = _mm256_shuffle_epi8(t0, sel);
    t1 = _mm256_shuffle_epi8(t1, sel);
    const __m256i u = _mm256_unpacklo_epi32(t0, t1), v = _mm256_unpackhi_epi32(t0, t1); /* c0 c1 | c4 c5; c2 c3 | c6 c7 */
    const __m128i c01 = _mm256_castsi256_si128(u), c45 = _mm256_extracti128_si256(u, 1);
    const __m128i c23 = _mm256_castsi256_si128(v), c67 = _mm256_extracti128_si256(v, 1);
    if (n == PX && k->nc == LB) {
        _mm_storel_epi64((__m128i *)(k->y[0] + p0), c01);
        _mm_storel_epi64((__m128i *)(k->y[1] + p0), _mm_unpackhi_epi64(c01, c01));
        _mm_storel_epi64((__m128i *)(k->y[2] + p0), c23);
        _mm_storel_epi64((__m128i *)(k->y[3] + p0), _mm_unpackhi_epi64(c23, c23));
        _mm_storel_epi64((__m128i *)(k->y[4] + p0), c45);
        _mm_storel_epi64((__m128i *)(k->y[5] + p0), _mm_unpackhi_epi64(c45, c45));
        _mm_storel_epi64((__m128i *)(k->y[6] + p0), c67);
        _mm_storel_epi64((__m128i *)(k->y[7] + p0), _mm_unpackhi_epi64(c67, c67));
        return;
    }
    uint8_t ch[8][16];
    _mm_storeu_si128((__m128i *)ch[0], c01);
    _mm_storeu_si128((__m128i *)ch[2], c23);
    _mm_storeu_si128((__m128i *)ch[4], c45);
    _mm_storeu_si128((__m128i *)ch[6], c67);
    for (int j = 0; j < k->nc; j++) memcpy(k->y[j] + p0, j % 2 ? ch[j - 1] + 8 : ch[j], (size_t)n);
}

/* A group's output pixels, for group_fn: each one's first tap's place in the tile. */
typedef void (*group_fn)(const lanes_t *L, const void *k, const uint32_t *const *b, int64_t p0, int64_t n,
                         int64_t taps);

/* One band of one block, output rows [oh0, oh1), PX output pixels at a time (group: their sums, requantized
 * and stored from output p0, n of them).  Rows of PX or more go PX columns at a time (the last PX
 * overlapping the ones before), narrower ones PX pixels of the plane at a time across rows (their places
 * from L->dst).  lb, sw and taps constants where the kernels' common windows inline them (the loops
 * unrolled, the pixels' offsets immediates); inlined into each kernel's target, group with it. */
ALWAYS_INLINE void walk_groups(const lanes_t *L, const void *k, const uint32_t *F, int64_t oh0, int64_t oh1,
                               const int64_t lb, const int64_t sw, const int64_t taps, group_fn group) {
    const qconv_t *q = L->q;
    const int64_t OW = q->OW;
    const uint32_t *b[PX];
    if (OW >= PX) {
        for (int64_t oh = oh0; oh < oh1; oh++) {
            const uint32_t *row = F + (oh - oh0) * q->sh * L->WF * lb;
            for (int64_t ow = 0;; ow += PX) {
                const int last = ow + PX >= OW;
                if (last) ow = OW - PX;
                for (int i = 0; i < PX; i++) b[i] = row + (ow + i) * sw * lb;
                group(L, k, b, oh * OW + ow, PX, taps);
                if (last) break;
            }
        }
        return;
    }
    const int64_t pa = oh0 * OW, pb = oh1 * OW, n = pb - pa < PX ? pb - pa : PX, base = oh0 * q->sh * L->WF;
    for (int64_t p0 = pa;; p0 += PX) {
        const int last = p0 + PX >= pb;
        if (last && n == PX) p0 = pb - PX;
        for (int i = 0; i < PX; i++) b[i] = F + (L->dst[p0 + i < pb ? p0 + i : pb - 1] - base) * lb;
        group(L, k, b, p0, n, taps);
        if (last) break;
    }
}

/* 8 pixels of 8 channels: one FMA a tap and pixel. */
__attribute__((target("avx2,fma"))) ALWAYS_INLINE void lanes_group(const lanes_t *L, const void *kv,
                                                                    const uint32_t *const *b, int64_t p0, int64_t n,
                                                                    int64_t taps) {
    const blk_t *k = kv;
    __m256 acc[PX];
    for (int i = 0; i < PX; i++) acc[i] = k->init;
    for (int64_t t = 0; t < taps; t++) {
        const __m256 w = k->wv[t];
        for (int i = 0; i < PX; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(b[i] + L->toff[t])), w, acc[i]);
    }
    lanes_store(&k->rq, acc, k, p0, n);
}

#define LANES_ROWS(name, TAPS, SW)                                                                                     \
    __attribute__((target("avx2,fma"))) static void name(const lanes_t *L, const blk_t *k, const float *F, int64_t oh0, \
                                                         int64_t oh1) {                                                \
        walk_groups(L, k, (const uint32_t *)F, oh0, oh1, LB, SW ? SW : L->q->sw, TAPS ? TAPS : L->taps, lanes_group); \
    }
LANES_ROWS(lanes_rows9s1, 9, 1)
LANES_ROWS(lanes_rows9s2, 9, 2)
LANES_ROWS(lanes_rows25s1, 25, 1)
LANES_ROWS(lanes_rows25s2, 25, 2)
LANES_ROWS(lanes_rowsn, 0, 0)

__attribute__((target("avx2,fma"))) static void lanes_item(void *ctx, int64_t it) {
    const lanes_t *L = ctx;
    qconv_t *q = (qconv_t *)L->q;
    const place_t pl = item_place(L, it);
    float *F = opt_scratch((size_t)(pl.R * L->WF * LB));
    if (!F) {
        q->failed = 1;
        return;
    }
    blkp_t p;
    block_params(L, pl.b, pl.c0, &p);
    blk_t k;
    k.nc = p.nc;
    k.exact = p.exact;
    for (int j = 0; j < LB; j++) k.y[j] = p.y[j];
    const int64_t taps = L->taps;
    for (int64_t t = 0; t < taps; t++) k.wv[t] = _mm256_loadu_ps(p.w + t * LB);
    k.init = k.exact ? _mm256_loadu_ps(p.fb) : _mm256_setzero_ps();
    k.bias = _mm256_loadu_si256((const __m256i *)p.bi);
    k.mul = _mm256_loadu_ps(p.ml);
    k.rq = rq_init(q);
    lanes_fill(L, p.plane, pl.pr0, pl.R, F);
    const int64_t sw = q->sw, oh0 = pl.oh0, oh1 = pl.oh1;
    if (taps == 9 && sw == 1) lanes_rows9s1(L, &k, F, oh0, oh1);
    else if (taps == 9 && sw == 2) lanes_rows9s2(L, &k, F, oh0, oh1);
    else if (taps == 25 && sw == 1) lanes_rows25s1(L, &k, F, oh0, oh1);
    else if (taps == 25 && sw == 2) lanes_rows25s2(L, &k, F, oh0, oh1);
    else lanes_rowsn(L, &k, F, oh0, oh1);
}

/* AVX-512 with VNNI (variant 4): blocks of 16 channels, and vpdpbusd instead of FMAs, four taps of a window
 * row at a time.  The tile is bytes widened to int32 words: word j of tile pixel (r, c) holds channel j's
 * u8 inputs at columns c, c + dw, c + 2 dw, c + 3 dw (a "quad"), so one vpdpbusd against a quad of weights
 * (w[kh][kw0 .. kw0 + 3], zero past KW) adds four products to each channel's int32 sum, exact with no
 * float bound (a 3x3 window is 3 vpdpbusd a pixel where the float sums took 9 FMAs, a 5x5 one 10 for 25).
 * s8 inputs are flipped to u8 by an xor with 0x80 and their zero point moved by 128 (qpointwise.c's
 * argument); pads hold that zero point; the sums start at the bias less zero_point * sum(w), in wrapping
 * int32.  Per layer on this project's AMD EPYC (Zen 5) 0.56-0.73x the 8-lane float kernel's time at
 * stride 1, 0.7-0.9x at stride 2 (docs/quantization.md). */

/* 8 input pixels of 16 channel planes (at p[j] + q0; only the first w < 8 read where w < 8, by masked loads:
 * a 7-wide plane's rows one at a time), two 8 x 8 byte transposes: pixel i's 16 bytes, s8 flipped to u8
 * where xs. */
__attribute__((target(VNNI512_TARGET))) ALWAYS_INLINE void bytes16x8(const uint8_t *const *p, int64_t q0, int xs,
                                                                  int64_t w, __m128i *px) {
    __m128i r[16], v[4], u[4];
    const __mmask16 m = (__mmask16)(w < 8 ? (1u << w) - 1u : 0xFFu);
    for (int j = 0; j < 16; j++)
        r[j] = w < 8 ? _mm_maskz_loadu_epi8(m, p[j] + q0) : _mm_loadl_epi64((const __m128i *)(p[j] + q0));
    transpose8x8(r, v);
    transpose8x8(r + 8, u);
    const __m128i flip = _mm_set1_epi8(xs ? (char)0x80 : 0);
    for (int i = 0; i < 4; i++) {
        px[2 * i] = _mm_xor_si128(_mm_unpacklo_epi64(v[i], u[i]), flip);
        px[2 * i + 1] = _mm_xor_si128(_mm_unpackhi_epi64(v[i], u[i]), flip);
    }
}

/* The same pixels widened to u8 words at out[i]. */
__attribute__((target(VNNI512_TARGET))) ALWAYS_INLINE void lanes16_in8(const uint8_t *const *p, int64_t q0, int xs,
                                                                    uint32_t *const *out) {
    __m128i px[8];
    bytes16x8(p, q0, xs, 8, px);
    for (int i = 0; i < 8; i++) _mm512_storeu_si512(out[i], _mm512_cvtepu8_epi32(px[i]));
}

/* A word of quads from the single-byte words a, b, c, d: a | b << 8 | c << 16 | d << 24. */
__attribute__((target(VNNI512_TARGET))) ALWAYS_INLINE __m512i join4(__m512i a, __m512i b, __m512i c, __m512i d) {
    const __m512i hi = _mm512_or_si512(_mm512_slli_epi32(c, 16), _mm512_slli_epi32(d, 24));
    return _mm512_ternarylogic_epi32(a, _mm512_slli_epi32(b, 8), hi, 0xFE); /* a | b | hi */
}

/* The band's tile of quads where lanes16_fill_vbmi does not take it (dilated windows; CPUs without VBMI):
 * the words filled as fill_body does, then each word's bytes 1-3 set from the words dw, 2 dw and 3 dw
 * columns on (left to right, so those still hold one byte; past the row's end 0: they meet the weights
 * past KW, which are 0).  Quads start at columns ow * sw + 4 dw i only: where those are all multiples of
 * sw (stride 2) only those columns are joined. */
__attribute__((target(VNNI512_TARGET))) static void lanes16_fill(const lanes_t *L, const uint8_t *const *plane,
                                                                 int64_t pr0, int64_t R, uint32_t *F) {
    fill_body(L, plane, pr0, R, F, LB16, lanes16_in8, 1);
    const int64_t WF = L->WF, d = L->q->dw, step = 4 * d % L->q->sw == 0 ? L->q->sw : 1;
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < R; r++) {
        uint32_t *row = F + r * WF * LB16;
        for (int64_t j = 0; j < WF; j += step) {
            __m512i x[4];
            for (int i = 0; i < 4; i++) x[i] = j + i * d < WF ? _mm512_loadu_si512(row + (j + i * d) * LB16) : zero;
            _mm512_storeu_si512(row + j * LB16, join4(x[0], x[1], x[2], x[3]));
        }
    }
}

#define VBMI_TARGET VNNI512_TARGET ",avx512vbmi"

/* lanes16_fill for undilated windows where the CPU has AVX512-VBMI (every AVX-512 CPU with VNNI but Cascade
 * Lake): each input row is transposed into a row of bytes brow (16 channels a
 * pixel, the zero point's byte in its pads; WF + 3 pixels), and each tile word of quads is one vpermb of the
 * 4 pixels from its column (byte 16 l + c to 4 c + l): no widened words to join.  Pad rows are the zero
 * point's byte throughout.  0.76-0.9x lanes16_fill's layer times (stride 2: 0.76-0.79x). */
__attribute__((target(VBMI_TARGET))) static void lanes16_fill_vbmi(const lanes_t *L, const uint8_t *const *plane,
                                                                   int64_t pr0, int64_t R, uint32_t *F,
                                                                   uint8_t *brow) {
    const qconv_t *q = L->q;
    const int64_t WF = L->WF, H = q->H, W = q->W, pt = q->pt, pl = q->pl, step = 4 % q->sw == 0 ? q->sw : 1;
    const uint8_t zp = (uint8_t)(q->xzp + (q->xs ? 128 : 0));
    const __m512i zq = _mm512_set1_epi8((char)zp);
    const __m128i z16 = _mm_set1_epi8((char)zp);
    __m512i idx;
    {
        uint8_t ix[64];
        for (int c = 0; c < 16; c++)
            for (int l = 0; l < 4; l++) ix[4 * c + l] = (uint8_t)(16 * l + c);
        idx = _mm512_loadu_si512(ix);
    }
    for (int64_t j = 0; j < pl; j++) _mm_storeu_si128((__m128i *)(brow + 16 * j), z16);
    for (int64_t j = pl + W; j < WF + 3; j++) _mm_storeu_si128((__m128i *)(brow + 16 * j), z16);
    for (int64_t r = 0; r < R; r++) {
        uint32_t *row = F + r * WF * LB16;
        const int64_t ih = pr0 + r - pt;
        if (ih < 0 || ih >= H) {
            for (int64_t j = 0; j < WF; j++) _mm512_storeu_si512(row + j * LB16, zq);
            continue;
        }
        for (int64_t iw = 0;; iw += 8) { /* the last 8 overlapping the ones before; a row under 8: its own */
            const int last = iw + 8 >= W;
            if (last && W >= 8) iw = W - 8;
            __m128i px[8];
            bytes16x8(plane, ih * W + iw, q->xs, W - iw, px);
            for (int i = 0; i < 8 && i < W; i++) _mm_storeu_si128((__m128i *)(brow + 16 * (pl + iw + i)), px[i]);
            if (last) break;
        }
        for (int64_t j = 0; j < WF; j += step)
            _mm512_storeu_si512(row + j * LB16, _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(brow + 16 * j)));
    }
}

/* One block's channels: each quad's weights (4 bytes a channel), the sums' start, the multipliers. */
typedef struct {
    __m512i wq[64];
    __m512i bias;       /* the bias less zero_point * sum(w) (the u8 inputs' zero point), wrapping int32 */
    __m512 mul, lo, hi; /* lo, hi: the output's bounds less its zero point */
    __m128i zp;         /* the output's zero point, 8 int16 */
    uint8_t *y[LB16];
    int nc, ys;
} blk16_t;

/* The block of 16 channels from c0 of image b: its planes (lanes past the last channel repeat it, with
 * weights 0: computed, never stored), each quad's weights (4 bytes of a window row read from a copy of the
 * block's [channel][tap] bytes, zero past the last channel, with room for the last 4-byte read; the bytes
 * past KW masked off) summed by vpdpbusd against ones for the zero point's term, the bias and multipliers
 * under the channels' mask.  Per block, so cheap: 25 gathers and a division a tap (as floats, this once
 * was) took a quarter of a 7x7 layer's time. */
__attribute__((target(VNNI512_TARGET))) static void block16_params(const lanes_t *L, int64_t b, int64_t c0,
                                                                   blk16_t *k, const uint8_t **plane) {
    const qconv_t *q = L->q;
    const int64_t taps = q->KH * q->KW, P = q->OH * q->OW, qw = (q->KW + 3) / 4;
    k->nc = q->C - c0 < LB16 ? (int)(q->C - c0) : LB16;
    for (int j = 0; j < LB16; j++) {
        const int64_t c = c0 + (j < k->nc ? j : k->nc - 1);
        plane[j] = q->x + (b * q->C + c) * q->H * q->W;
        k->y[j] = q->y + (b * q->M + c) * P;
    }
    uint8_t wb[64 * LB16 + 4];
    memcpy(wb, q->wd + c0 * taps, (size_t)(k->nc * taps));
    memset(wb + k->nc * taps, 0, (size_t)((LB16 - k->nc) * taps + 4));
    uint32_t wq[64][LB16];
    for (int64_t i = 0; i < L->taps; i++) {
        const int64_t kh = i / qw, kw0 = i % qw * 4, n = q->KW - kw0 < 4 ? q->KW - kw0 : 4;
        const uint32_t mask = n == 4 ? 0xFFFFFFFFu : (1u << (8 * n)) - 1u;
        for (int j = 0; j < LB16; j++) {
            uint32_t v;
            memcpy(&v, wb + j * taps + kh * q->KW + kw0, sizeof v);
            wq[i][j] = v & mask;
        }
    }
    __m512i wsum = _mm512_setzero_si512();
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t i = 0; i < L->taps; i++) {
        k->wq[i] = _mm512_loadu_si512(wq[i]);
        wsum = _mm512_dpbusd_epi32(wsum, ones, k->wq[i]);
    }
    const __mmask16 m = (__mmask16)((1u << k->nc) - 1u);
    const __m512i bias = q->bias ? _mm512_maskz_loadu_epi32(m, q->bias + c0) : _mm512_setzero_si512();
    const int32_t zp = q->xzp + (q->xs ? 128 : 0);
    k->bias = _mm512_sub_epi32(bias, _mm512_mullo_epi32(_mm512_set1_epi32(zp), wsum));
    k->mul = _mm512_maskz_loadu_ps(m, q->mult + c0);
    k->lo = _mm512_set1_ps((float)(q->qmin - q->yzp));
    k->hi = _mm512_set1_ps((float)(q->qmax - q->yzp));
    k->zp = _mm_set1_epi16((int16_t)q->yzp);
    k->ys = q->ys;
}

/* 8 pixels' sums (16 channels each) requantized as requant_row does (both clamps in float, rounded by
 * cvtps), the zero point added in int16, packed to bytes 4 pixels by 4 channels a 128-bit lane, shuffled
 * to each channel's 8 bytes and stored at y[j] + p0 for the block's channels (n < 8 pixels: only those). */
__attribute__((target(VNNI512_TARGET))) ALWAYS_INLINE void lanes16_store(const __m512i *acc, const blk16_t *k,
                                                                      int64_t p0, int64_t n) {
    __m512i h[8];
    for (int i = 0; i < 8; i++) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i]), k->mul);
        h[i] = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(f, k->hi), k->lo));
    }
    const __m512i zp = _mm512_broadcast_i32x4(k->zp);
    __m512i p[4];
    for (int i = 0; i < 4; i++) p[i] = _mm512_add_epi16(_mm512_packs_epi32(h[2 * i], h[2 * i + 1]), zp);
    /* per 128-bit lane l (channels 4l .. 4l + 3): pixels 0-3 (t0) and 4-7 (t1), 4 channels each */
    __m512i t0 = k->ys ? _mm512_packs_epi16(p[0], p[1]) : _mm512_packus_epi16(p[0], p[1]);
    __m512i t1 = k->ys ? _mm512_packs_epi16(p[2], p[3]) : _mm512_packus_epi16(p[2], p[3]);
    const __m512i sel = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    t0 = _mm512_shuffle_epi8(t0, sel); /* channel-major: 4 pixels of each channel */
    t1 = _mm512_shuffle_epi8(t1, sel);
    /* lane l: channels 4l, 4l + 1 (u) and 4l + 2, 4l + 3 (v), 8 bytes each */
    const __m512i u = _mm512_unpacklo_epi32(t0, t1), v = _mm512_unpackhi_epi32(t0, t1);
    if (n == PX && k->nc == LB16) {
        const __m128i us[4] = {_mm512_castsi512_si128(u), _mm512_extracti32x4_epi32(u, 1),
                               _mm512_extracti32x4_epi32(u, 2), _mm512_extracti32x4_epi32(u, 3)};
        const __m128i vs[4] = {_mm512_castsi512_si128(v), _mm512_extracti32x4_epi32(v, 1),
                               _mm512_extracti32x4_epi32(v, 2), _mm512_extracti32x4_epi32(v, 3)};
        for (int l = 0; l < 4; l++) {
            _mm_storel_epi64((__m128i *)(k->y[4 * l] + p0), us[l]);
            _mm_storel_epi64((__m128i *)(k->y[4 * l + 1] + p0), _mm_unpackhi_epi64(us[l], us[l]));
            _mm_storel_epi64((__m128i *)(k->y[4 * l + 2] + p0), vs[l]);
            _mm_storel_epi64((__m128i *)(k->y[4 * l + 3] + p0), _mm_unpackhi_epi64(vs[l], vs[l]));
        }
        return;
    }
    uint8_t ch[2][64]; /* u's and v's bytes: channel 4l + j at [j / 2][16 l + 8 (j % 2)] */
    _mm512_storeu_si512(ch[0], u);
    _mm512_storeu_si512(ch[1], v);
    for (int j = 0; j < k->nc; j++) memcpy(k->y[j] + p0, ch[j % 4 / 2] + 16 * (j / 4) + 8 * (j % 2), (size_t)n);
}

/* 8 pixels of 16 channels: one vpdpbusd a quad and pixel. */
__attribute__((target(VNNI512_TARGET))) ALWAYS_INLINE void lanes16_group(const lanes_t *L, const void *kv,
                                                                      const uint32_t *const *b, int64_t p0,
                                                                      int64_t n, int64_t quads) {
    const blk16_t *k = kv;
    __m512i acc[PX];
    for (int i = 0; i < PX; i++) acc[i] = k->bias;
    for (int64_t t = 0; t < quads; t++) {
        const __m512i w = k->wq[t];
        for (int i = 0; i < PX; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_loadu_si512(b[i] + L->toff[t]), w);
    }
    lanes16_store(acc, k, p0, n);
}

#define LANES16_ROWS(name, QUADS, SW)                                                                                  \
    __attribute__((target(VNNI512_TARGET))) static void name(const lanes_t *L, const blk16_t *k, const uint32_t *F,   \
                                                             int64_t oh0, int64_t oh1) {                               \
        walk_groups(L, k, F, oh0, oh1, LB16, SW ? SW : L->q->sw, QUADS ? QUADS : L->taps, lanes16_group);             \
    }
LANES16_ROWS(lanes16_rows3s1, 3, 1) /* 3x3: a quad a window row */
LANES16_ROWS(lanes16_rows3s2, 3, 2)
LANES16_ROWS(lanes16_rows10s1, 10, 1) /* 5x5: two quads a window row */
LANES16_ROWS(lanes16_rows10s2, 10, 2)
LANES16_ROWS(lanes16_rowsn, 0, 0)

__attribute__((target(VNNI512_TARGET))) static void lanes16_item(void *ctx, int64_t it) {
    const lanes_t *L = ctx;
    qconv_t *q = (qconv_t *)L->q;
    const place_t pl = item_place(L, it);
    const size_t words = (size_t)(pl.R * L->WF * LB16);
    uint32_t *F = (uint32_t *)opt_scratch(words + (size_t)(L->vbmi ? (L->WF + 3) * 4 : 0));
    if (!F) {
        q->failed = 1;
        return;
    }
    const uint8_t *plane[LB16];
    blk16_t k; /* no initializer: it would zero the 64 weight vectors first */
    block16_params(L, pl.b, pl.c0, &k, plane);
    if (L->vbmi)
        lanes16_fill_vbmi(L, plane, pl.pr0, pl.R, F, (uint8_t *)(F + words));
    else
        lanes16_fill(L, plane, pl.pr0, pl.R, F);
    const int64_t quads = L->taps, sw = q->sw, oh0 = pl.oh0, oh1 = pl.oh1;
    if (quads == 3 && sw == 1) lanes16_rows3s1(L, &k, F, oh0, oh1);
    else if (quads == 3 && sw == 2) lanes16_rows3s2(L, &k, F, oh0, oh1);
    else if (quads == 10 && sw == 1) lanes16_rows10s1(L, &k, F, oh0, oh1);
    else if (quads == 10 && sw == 2) lanes16_rows10s2(L, &k, F, oh0, oh1);
    else lanes16_rowsn(L, &k, F, oh0, oh1);
}

int opt_qdw_lanes_takes(const qconv_t *q) {
    if (!opt_qdw_fma || q->mg != 1 || q->KH * q->KW > 64) return 0;
    const int64_t WP = (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1, WF = WP > q->pl + q->W ? WP : q->pl + q->W;
    const int64_t HP = (q->OH - 1) * q->sh + (q->KH - 1) * q->dh + 1, rows = HP > q->pt + q->H ? HP : q->pt + q->H;
    return rows * WF * LB16 < ((int64_t)1 << 30); /* the tables' and offsets' int32 (for either block) */
}

int opt_qdw_lanes(const qconv_t *q) {
    const int wide = opt_qconv_vnni512 == 1;
    lanes_t L = {.q = q, .taps = q->KH * q->KW, .lb = wide ? LB16 : LB};
    L.vbmi = wide && (q->dw == 1 || q->KW == 1) && __builtin_cpu_supports("avx512vbmi");
    const int64_t WP = (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1;
    L.WF = WP > q->pl + q->W ? WP : q->pl + q->W;
    if (wide) { /* a quad a window row and 4 columns: [kh][kw / 4] */
        const int64_t qw = (q->KW + 3) / 4;
        L.taps = q->KH * qw;
        for (int64_t i = 0; i < L.taps; i++)
            L.toff[i] = (int32_t)(((i / qw) * q->dh * L.WF + (i % qw) * 4 * q->dw) * L.lb);
    } else {
        for (int64_t t = 0; t < L.taps; t++)
            L.toff[t] = (int32_t)(((t / q->KW) * q->dh * L.WF + (t % q->KW) * q->dw) * L.lb);
    }
    /* output rows per band: a tile of about TILE_BYTES, at least one row; more bands where too few items */
    const int64_t row_bytes = L.WF * L.lb * (int64_t)sizeof(float), reach = (q->KH - 1) * q->dh + 1;
    int64_t rows = (wide ? TILE16_BYTES : TILE_BYTES) / row_bytes, band = rows > reach ? (rows - reach) / q->sh + 1 : 1;
    L.nblocks = (q->C + L.lb - 1) / L.lb;
    const int64_t want = 4 * (int64_t)optcli_get_num_threads();
    if (band > q->OH) band = q->OH;
    if (q->N * L.nblocks * ((q->OH + band - 1) / band) < want) {
        const int64_t split = (want + q->N * L.nblocks - 1) / (q->N * L.nblocks);
        const int64_t b2 = (q->OH + split - 1) / split;
        if (b2 < band) band = b2 < 1 ? 1 : b2;
    }
    L.band = band;
    L.nbands = (q->OH + band - 1) / band;
    /* the places of the pixels that narrow planes take across rows (input rows under 8 wide, output rows
     * under PX): computed once per call, and only for those (a 112x112 plane's took about 5 us) */
    const int64_t nsrc = q->W < 8 ? q->H * q->W : 0, ndst = q->OW < PX ? q->OH * q->OW : 0;
    int32_t *tab = nsrc + ndst ? malloc((size_t)(nsrc + ndst) * sizeof(int32_t)) : NULL;
    if (nsrc + ndst && !tab) return OPT_ENOMEM;
    for (int64_t i = 0; i < nsrc; i++) tab[i] = (int32_t)((i / q->W + q->pt) * L.WF + i % q->W + q->pl);
    int32_t *dst = tab ? tab + nsrc : NULL;
    for (int64_t i = 0; i < ndst; i++) dst[i] = (int32_t)(i / q->OW * q->sh * L.WF + i % q->OW * q->sw);
    L.src = tab;
    L.dst = dst;
    const int64_t macs = q->N * q->M * q->KH * q->KW * q->OH * q->OW;
    opt_parallel(wide ? lanes16_item : lanes_item, &L, q->N * L.nblocks * L.nbands, macs < (1 << 16) ? 1 : 0);
    free(tab);
    return 0;
}

#else

int opt_qdw_lanes_takes(const qconv_t *q) {
    (void)q;
    return 0;
}

int opt_qdw_lanes(const qconv_t *q) {
    (void)q;
    return OPT_EINVAL;
}

#endif
