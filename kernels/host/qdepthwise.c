/* Integer depthwise convolutions (optcli.QConv steps whose groups each hold one input channel), direct: a
 * work item is one output channel of one image.  The arithmetic is qgemm.c's (exact int32 sums, the same
 * requantization); see there for why it is exact.  On AVX2 CPUs with FMA the calls with one output channel
 * per group go to qdepthwise_lanes.c (channels in the vector lanes) instead; these kernels take the rest
 * and every other CPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "qconv_kernel.h"
#include "simd.h"


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
    int64_t HP, WQ, taps;
    const int64_t *toff;
    int16_t tw[64];     /* each tap's weight */
    int32_t bias;       /* the bias less x_zero_point * sum(w): the sums below read x uncentred */
    float mult;
} dw_t;

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
    const int64_t sw = q->sw, HP = d->HP, WQ = d->WQ, W = q->W, rows = q->H < HP - q->pt ? q->H : HP - q->pt;
    memset(xp, (int)(uint8_t)q->xzp, (size_t)(sw * HP * WQ + 32));
    xp += q->pt * WQ; /* input row ih is padded row ih + pt of each phase */
    if (sw == 2) {    /* input column i goes to phase (i + pl) % 2, place (i + pl) / 2 */
        const int64_t je = q->pl / 2, jo = (1 + q->pl) / 2;
        uint8_t *ev = xp + (q->pl % 2) * HP * WQ + je, *od = xp + ((1 + q->pl) % 2) * HP * WQ + jo;
        const int64_t ne = WQ - je < (W + 1) / 2 ? WQ - je : (W + 1) / 2, no = WQ - jo < W / 2 ? WQ - jo : W / 2;
        for (int64_t ih = 0; ih < rows; ih++, ev += WQ, od += WQ) {
            const uint8_t *src = plane + ih * W;
#ifdef QG_X86
            if (opt_qconv_avx2 == 1 && W >= 32 && ne == (W + 1) / 2 && no == W / 2) { /* every byte lands in its row */
                split2_avx2(src, W, ev, od);
                continue;
            }
#endif
            for (int64_t j = 0; j < ne; j++) ev[j] = src[2 * j];
            for (int64_t j = 0; j < no; j++) od[j] = src[2 * j + 1];
        }
        return;
    }
    /* each phase's bounds once per plane, not per row: a division per row was a 7x7 plane's largest cost */
    for (int64_t a = 0; a < sw; a++) { /* phase a: padded columns a + j * sw, input columns that - pl */
        const int64_t first = a - q->pl;                           /* input column of j = 0 */
        const int64_t j0 = first >= 0 ? 0 : (-first + sw - 1) / sw; /* first j inside the input */
        int64_t j1 = first >= W ? 0 : (W - 1 - first) / sw + 1;    /* past the last one */
        if (j1 > WQ) j1 = WQ;
        if (j1 <= j0) continue;
        uint8_t *dst = xp + a * HP * WQ + j0;
        const uint8_t *src = plane + first + j0 * sw;
        for (int64_t ih = 0; ih < rows; ih++, dst += WQ, src += W) {
            if (sw == 1) {
                copy_bytes(dst, src, j1 - j0);
            } else {
                for (int64_t j = 0; j < j1 - j0; j++) dst[j] = src[j * sw];
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
__attribute__((target("avx2"))) static void dw_rows2_avx2(const qconv_t *q, const dw_t *d, const uint8_t *xp,
                                                          uint8_t *y, const int32_t *wpair, const int64_t *off);

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
    if (OW <= 8) {
        dw_rows2_avx2(q, d, xp, y, wpair, off);
        return;
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

/* dw_rows_avx2 for rows of at most 8 outputs (7x7 planes: 16 lanes held 7 outputs): a run of 16 is two
 * output rows, each tap's 8 bytes of one row beside the next row's; four rows stored at a time. */
__attribute__((target("avx2"))) static void dw_rows2_avx2(const qconv_t *q, const dw_t *d, const uint8_t *xp,
                                                          uint8_t *y, const int32_t *wpair, const int64_t *off) {
    const int64_t OW = q->OW, OH = q->OH, pairs = (d->taps + 1) / 2, step = q->sh * d->WQ;
    const int xs = q->xs;
    const rq_t rq = rq_init(q);
    __m256i v[2];
    for (int64_t oh = 0; oh < OH; oh += 4) {
        for (int h = 0; h < 2; h++) {
            const int64_t r0 = oh + 2 * h < OH ? oh + 2 * h : OH - 1, r1 = r0 + 1 < OH ? r0 + 1 : r0;
            const uint8_t *b0 = xp + r0 * step, *b1 = xp + r1 * step; /* (a missing row reads a real one) */
            __m256i alo = _mm256_setzero_si256(), ahi = alo;
            for (int64_t p = 0; p < pairs; p++) {
                const __m128i ra = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b0 + off[2 * p])),
                                                      _mm_loadl_epi64((const __m128i *)(b1 + off[2 * p])));
                const __m128i rb = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b0 + off[2 * p + 1])),
                                                      _mm_loadl_epi64((const __m128i *)(b1 + off[2 * p + 1])));
                const __m256i a = xs ? _mm256_cvtepi8_epi16(ra) : _mm256_cvtepu8_epi16(ra);
                const __m256i b = xs ? _mm256_cvtepi8_epi16(rb) : _mm256_cvtepu8_epi16(rb);
                const __m256i w = _mm256_set1_epi32(wpair[p]);
                alo = _mm256_add_epi32(alo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
                ahi = _mm256_add_epi32(ahi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
            }
            v[h] = rq_16(&rq, alo, ahi, d->bias, d->mult);
        }
        uint8_t rows[4 * 8];
        rq_store2(&rq, v[0], v[1], rows, rows + 16, 16, 1); /* rows oh .. oh + 3, 8 bytes each */
        for (int64_t r = 0; r < 4 && oh + r < OH; r++) copy_bytes(y + (oh + r) * OW, rows + 8 * r, OW);
    }
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
    /* (one image and one channel per group are the common case: divisions cost a small plane dearly) */
    const int64_t b = q->N == 1 ? 0 : it / q->M, m = q->N == 1 ? it : it % q->M, c = q->mg == 1 ? m : m / q->mg;
    const int64_t sw = q->sw;
    dw_t d = {.HP = q->dwg->HP, .WQ = q->dwg->WQ, .taps = q->dwg->taps, .toff = q->dwg->toff};
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
    const uint8_t *plane = q->x + (b * q->C + c) * q->H * q->W;
    uint8_t *y = q->y + (b * q->M + m) * q->OH * q->OW;
    dw_fill(q, &d, plane, xp);
#ifdef QG_X86
    if (opt_qconv_avx2 == 1) {
        dw_rows_avx2(q, &d, xp, y);
        return;
    }
#endif
    dw_rows_plain(q, &d, xp, y);
}

OPT_API int optcli_qconv2d_depthwise(const void *x, const int8_t *w, const int32_t *bias, const float *mult, void *y,
                                     const int64_t *geom, const int32_t *qp) {
    qconv_t q = {.x = x, .wd = w, .bias = bias, .mult = mult, .y = y};
    int rc = opt_qconv_setup(&q, geom, qp);
    if (rc) return rc;
    if (q.cg != 1 || q.KH * q.KW > 64) return OPT_EINVAL; /* dw_t's room; the GEMM takes larger windows */
    if (q.N == 0 || q.P == 0) return 0;
    if (opt_qdw_lanes_takes(&q)) {
        rc = opt_qdw_lanes(&q);
        return rc ? rc : q.failed ? OPT_ENOMEM : 0;
    }
    dw_geom_t g;
    dw_geom(&q, &g);
    q.dwg = &g;
    const int64_t macs = q.N * q.M * q.KH * q.KW * q.P;
    opt_parallel(dw_item, &q, q.N * q.M, macs < (1 << 16) ? 1 : 0);
    return q.failed ? OPT_ENOMEM : 0;
}
