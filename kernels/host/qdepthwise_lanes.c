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
 * the requantization is rq_half's (qconv_kernel.h), onnxruntime's arithmetic. */
#include <stdlib.h>

#include "optcli_native.h"
#include "qconv_kernel.h"
#include "simd.h"

#ifdef QG_X86

#define LB 8 /* channels per block: one vector of floats */
#define PX 8 /* output pixels per group: 8 accumulators beside the tap's weights */
#define TILE_BYTES (64 * 1024) /* a band's float tile (in L2): 112-wide planes ran 0.92x 24 KB bands' time */

typedef struct {
    const qconv_t *q;
    int64_t WF;          /* tile row width in pixels: the taps' reach and every input column */
    int64_t band, nbands, nblocks, taps;
    int32_t toff[64];    /* each tap's offset in the tile, in floats */
    const int32_t *src;  /* each input pixel's tile place from padded row 0, in pixels [H * W] */
    const int32_t *dst;  /* each output pixel's first tap's tile place from padded row 0 [OH * OW] */
} lanes_t;

/* 8 input pixels of 8 channel planes (8 bytes each, at p[j] + q0) as 8 vectors of 8 channels, floats,
 * stored at out[i] (i the pixel), or one after the other from row where it is not NULL. */
__attribute__((target("avx2"))) ALWAYS_INLINE void lanes_in8(const uint8_t *const *p, int64_t q0, int xs,
                                                          float *const *out, float *row) {
    __m128i r[8];
    for (int j = 0; j < 8; j++) r[j] = _mm_loadl_epi64((const __m128i *)(p[j] + q0));
    const __m128i t0 = _mm_unpacklo_epi8(r[0], r[1]), t1 = _mm_unpacklo_epi8(r[2], r[3]);
    const __m128i t2 = _mm_unpacklo_epi8(r[4], r[5]), t3 = _mm_unpacklo_epi8(r[6], r[7]);
    const __m128i u0 = _mm_unpacklo_epi16(t0, t1), u1 = _mm_unpackhi_epi16(t0, t1); /* pixels 0-3, 4-7: c0-3 */
    const __m128i u2 = _mm_unpacklo_epi16(t2, t3), u3 = _mm_unpackhi_epi16(t2, t3); /* c4-7 */
    __m128i v[4] = {_mm_unpacklo_epi32(u0, u2), _mm_unpackhi_epi32(u0, u2), _mm_unpacklo_epi32(u1, u3),
                    _mm_unpackhi_epi32(u1, u3)}; /* pixels 0-1, 2-3, 4-5, 6-7: 8 channels each */
    for (int i = 0; i < 4; i++) {
        const __m128i lo = v[i], hi = _mm_srli_si128(v[i], 8);
        const __m256i a = xs ? _mm256_cvtepi8_epi32(lo) : _mm256_cvtepu8_epi32(lo);
        const __m256i b = xs ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepu8_epi32(hi);
        _mm256_storeu_ps(row ? row + 2 * i * LB : out[2 * i], _mm256_cvtepi32_ps(a));
        _mm256_storeu_ps(row ? row + (2 * i + 1) * LB : out[2 * i + 1], _mm256_cvtepi32_ps(b));
    }
}

/* The band's tile: pad rows and columns set to the zero point, the input rows it covers transposed in. */
__attribute__((target("avx2"))) static void lanes_fill(const lanes_t *L, const uint8_t *const *plane, int64_t pr0,
                                                       int64_t R, float *F) {
    const qconv_t *q = L->q;
    const int64_t WF = L->WF, H = q->H, W = q->W, pt = q->pt, pl = q->pl;
    const __m256 zp = _mm256_set1_ps((float)q->xzp);
    for (int64_t r = 0; r < R; r++) {
        const int64_t pr = pr0 + r;
        float *row = F + r * WF * LB;
        const int inside = pr >= pt && pr < pt + H;
        for (int64_t j = 0; j < WF; j++) {
            if (inside && j == pl) j = pl + W; /* the input's columns: transposed below */
            if (j < WF) _mm256_storeu_ps(row + j * LB, zp);
        }
    }
    const int64_t ih0 = pr0 - pt < 0 ? 0 : pr0 - pt, ih1 = pr0 + R - pt > H ? H : pr0 + R - pt;
    if (ih1 <= ih0) return;
    const int64_t qa = ih0 * W, qb = ih1 * W, base = pr0 * WF;
    const int32_t *src = L->src;
    if (qb - qa < 8) { /* fewer than 8 input pixels: one at a time */
        for (int64_t i = qa; i < qb; i++)
            for (int j = 0; j < LB; j++)
                F[(src[i] - base) * LB + j] = q->xs ? (float)(int8_t)plane[j][i] : (float)plane[j][i];
        return;
    }
    if (W >= 8) { /* row by row: 8 columns at a time, the last 8 overlapping the ones before */
        for (int64_t ih = ih0; ih < ih1; ih++) {
            float *row = F + (src[ih * W] - base) * LB;
            for (int64_t iw = 0;; iw += 8) {
                const int last = iw + 8 >= W;
                if (last) iw = W - 8;
                lanes_in8(plane, ih * W + iw, q->xs, NULL, row + iw * LB);
                if (last) break;
            }
        }
        return;
    }
    for (int64_t q0 = qa;; q0 += 8) { /* rows under 8 wide: 8 pixels of the plane at a time, across rows */
        const int last = q0 + 8 >= qb;
        if (last) q0 = qb - 8; /* the last 8 overlap the ones before: the same values again */
        float *out[8];
        for (int i = 0; i < 8; i++) out[i] = F + (src[q0 + i] - base) * LB;
        lanes_in8(plane, q0, q->xs, out, NULL);
        if (last) break;
    }
}

/* One block's channels: each tap's 8 weights, the bias, the multiplier, the output planes. */
typedef struct {
    __m256 wv[64];
    __m256 init;    /* the accumulators' start: the bias where float32 holds every partial sum with it, else 0 */
    __m256i bias;   /* the bias added in int32 where it is not in init */
    __m256 mul;
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

/* One band of one block, output rows [oh0, oh1): 8 output pixels at a time, each tap one FMA per pixel.
 * Rows of 8 or more go 8 columns at a time (the last 8 overlapping the ones before), narrower ones 8
 * pixels of the plane at a time across rows (their places from L->dst).  TAPS and SW constants where the
 * common windows inline them (the loops unrolled, the pixels' offsets immediates), 0 for the call's own. */
__attribute__((target("avx2,fma"))) ALWAYS_INLINE void lanes_rows(const lanes_t *L, const blk_t *k, const float *F,
                                                                   int64_t oh0, int64_t oh1, const int TAPS,
                                                                   const int SW) {
    const qconv_t *q = L->q;
    const rq_t rq = rq_init(q);
    const int64_t taps = TAPS ? TAPS : L->taps, sw = SW ? SW : q->sw, OW = q->OW;
    const int32_t *toff = L->toff;
    if (OW >= PX) {
        for (int64_t oh = oh0; oh < oh1; oh++) {
            const float *row = F + (oh - oh0) * q->sh * L->WF * LB;
            for (int64_t ow = 0;; ow += PX) {
                const int last = ow + PX >= OW;
                if (last) ow = OW - PX;
                const float *b = row + ow * sw * LB;
                __m256 acc[PX];
                for (int i = 0; i < PX; i++) acc[i] = k->init;
                for (int64_t t = 0; t < taps; t++) {
                    const __m256 w = k->wv[t];
                    const float *bt = b + toff[t];
                    for (int i = 0; i < PX; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(bt + i * sw * LB), w, acc[i]);
                }
                lanes_store(&rq, acc, k, oh * OW + ow, PX);
                if (last) break;
            }
        }
        return;
    }
    const int64_t pa = oh0 * OW, pb = oh1 * OW, n = pb - pa < PX ? pb - pa : PX, base = oh0 * q->sh * L->WF;
    for (int64_t p0 = pa;; p0 += PX) {
        const int last = p0 + PX >= pb;
        if (last && n == PX) p0 = pb - PX;
        const float *b[PX];
        for (int i = 0; i < PX; i++) b[i] = F + (L->dst[p0 + i < pb ? p0 + i : pb - 1] - base) * LB;
        __m256 acc[PX];
        for (int i = 0; i < PX; i++) acc[i] = k->init;
        for (int64_t t = 0; t < taps; t++) {
            const __m256 w = k->wv[t];
            for (int i = 0; i < PX; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(b[i] + toff[t]), w, acc[i]);
        }
        lanes_store(&rq, acc, k, p0, n);
        if (last) break;
    }
}

#define LANES_ROWS(name, TAPS, SW)                                                                                     \
    __attribute__((target("avx2,fma"))) static void name(const lanes_t *L, const blk_t *k, const float *F, int64_t oh0, \
                                                         int64_t oh1) {                                                \
        lanes_rows(L, k, F, oh0, oh1, TAPS, SW);                                                                       \
    }
LANES_ROWS(lanes_rows9s1, 9, 1)
LANES_ROWS(lanes_rows9s2, 9, 2)
LANES_ROWS(lanes_rows25s1, 25, 1)
LANES_ROWS(lanes_rows25s2, 25, 2)
LANES_ROWS(lanes_rowsn, 0, 0)

__attribute__((target("avx2,fma"))) static void lanes_item(void *ctx, int64_t it) {
    const lanes_t *L = ctx;
    qconv_t *q = (qconv_t *)L->q;
    const int64_t per_image = L->nblocks * L->nbands, b = it / per_image, blk = it % per_image / L->nbands;
    const int64_t oh0 = it % L->nbands * L->band, oh1 = oh0 + L->band < q->OH ? oh0 + L->band : q->OH;
    const int64_t c0 = blk * LB, taps = L->taps, P = q->OH * q->OW;
    const int64_t pr0 = oh0 * q->sh, R = (oh1 - 1) * q->sh + (q->KH - 1) * q->dh + 1 - pr0;
    float *F = opt_scratch((size_t)(R * L->WF * LB));
    if (!F) {
        q->failed = 1;
        return;
    }
    blk_t k;
    k.nc = q->C - c0 < LB ? (int)(q->C - c0) : LB;
    const uint8_t *plane[LB];
    float w[64][LB], ml[LB], fb[LB];
    int32_t bi[LB];
    int64_t big = 0;
    for (int j = 0; j < LB; j++) {
        const int64_t c = c0 + (j < k.nc ? j : k.nc - 1); /* lanes past the last channel repeat it, weight 0 */
        plane[j] = q->x + (b * q->C + c) * q->H * q->W;
        k.y[j] = q->y + (b * q->M + c) * P;
        uint32_t wsum = 0;
        for (int64_t t = 0; t < taps; t++) {
            const int8_t v = j < k.nc ? q->wd[c * taps + t] : 0;
            w[t][j] = (float)v;
            wsum += (uint32_t)(int32_t)v;
        }
        bi[j] = (int32_t)((q->bias ? (uint32_t)q->bias[c] : 0u) - (uint32_t)q->xzp * wsum);
        fb[j] = (float)bi[j];
        ml[j] = q->mult[c];
        const int64_t a = bi[j] < 0 ? -(int64_t)bi[j] : bi[j];
        big = a > big ? a : big;
    }
    for (int64_t t = 0; t < taps; t++) k.wv[t] = _mm256_loadu_ps(w[t]);
    k.exact = big + taps * 255 * 128 < ((int64_t)1 << 24); /* every partial sum with the bias in float32 */
    k.init = k.exact ? _mm256_loadu_ps(fb) : _mm256_setzero_ps();
    k.bias = _mm256_loadu_si256((const __m256i *)bi);
    k.mul = _mm256_loadu_ps(ml);
    lanes_fill(L, plane, pr0, R, F);
    const int64_t sw = q->sw;
    if (taps == 9 && sw == 1) lanes_rows9s1(L, &k, F, oh0, oh1);
    else if (taps == 9 && sw == 2) lanes_rows9s2(L, &k, F, oh0, oh1);
    else if (taps == 25 && sw == 1) lanes_rows25s1(L, &k, F, oh0, oh1);
    else if (taps == 25 && sw == 2) lanes_rows25s2(L, &k, F, oh0, oh1);
    else lanes_rowsn(L, &k, F, oh0, oh1);
}

int opt_qdw_lanes_takes(const qconv_t *q) {
    if (!opt_qdw_fma || q->mg != 1 || q->KH * q->KW > 64) return 0;
    const int64_t WP = (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1, WF = WP > q->pl + q->W ? WP : q->pl + q->W;
    const int64_t HP = (q->OH - 1) * q->sh + (q->KH - 1) * q->dh + 1, rows = HP > q->pt + q->H ? HP : q->pt + q->H;
    return rows * WF * LB < ((int64_t)1 << 30); /* the tables' and offsets' int32 */
}

int opt_qdw_lanes(const qconv_t *q) {
    lanes_t L = {.q = q, .taps = q->KH * q->KW};
    const int64_t WP = (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1;
    L.WF = WP > q->pl + q->W ? WP : q->pl + q->W;
    for (int64_t t = 0; t < L.taps; t++)
        L.toff[t] = (int32_t)(((t / q->KW) * q->dh * L.WF + (t % q->KW) * q->dw) * LB);
    /* output rows per band: a tile of about TILE_BYTES, at least one row; more bands where too few items */
    const int64_t row_bytes = L.WF * LB * (int64_t)sizeof(float), reach = (q->KH - 1) * q->dh + 1;
    int64_t rows = TILE_BYTES / row_bytes, band = rows > reach ? (rows - reach) / q->sh + 1 : 1;
    L.nblocks = (q->C + LB - 1) / LB;
    const int64_t want = 4 * (int64_t)optcli_get_num_threads();
    if (band > q->OH) band = q->OH;
    if (q->N * L.nblocks * ((q->OH + band - 1) / band) < want) {
        const int64_t split = (want + q->N * L.nblocks - 1) / (q->N * L.nblocks);
        const int64_t b2 = (q->OH + split - 1) / split;
        if (b2 < band) band = b2 < 1 ? 1 : b2;
    }
    L.band = band;
    L.nbands = (q->OH + band - 1) / band;
    int32_t *tab = malloc((size_t)(q->H * q->W + q->OH * q->OW) * sizeof(int32_t));
    if (!tab) return OPT_ENOMEM;
    for (int64_t ih = 0; ih < q->H; ih++)
        for (int64_t iw = 0; iw < q->W; iw++) tab[ih * q->W + iw] = (int32_t)((ih + q->pt) * L.WF + iw + q->pl);
    int32_t *dst = tab + q->H * q->W;
    for (int64_t oh = 0; oh < q->OH; oh++)
        for (int64_t ow = 0; ow < q->OW; ow++) dst[oh * q->OW + ow] = (int32_t)(oh * q->sh * L.WF + ow * q->sw);
    L.src = tab;
    L.dst = dst;
    const int64_t macs = q->N * q->M * L.taps * q->OH * q->OW;
    opt_parallel(lanes_item, &L, q->N * L.nblocks * L.nbands, macs < (1 << 16) ? 1 : 0);
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
