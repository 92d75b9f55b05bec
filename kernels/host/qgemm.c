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
 * per group) run direct, a channel per work item (qdepthwise.c).
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
#include "qconv_kernel.h"
#include "simd.h"

#define MR 4                 /* rows per register tile */
#define PANEL_BYTES (96 * 1024) /* a band's packed columns: within the L2 beside its rows of W */

int opt_qconv_avx2 = -1;
int opt_qdw_fma = 0;
int opt_qconv_vnni512 = 0;
int opt_qconv_vnni256 = 0;
int opt_qconv_sdot = 0;
int opt_qconv_neon = 0;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
/* The Armv8.2 dot product (sdot / udot), optional before Armv8.4: asked of the kernel, not assumed. */
static int cpu_sdot(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#else
static int cpu_sdot(void) { return 0; }
#endif

#ifdef QG_X86
/* AVX-512 with VNNI (F, BW, VL, DQ, VNNI; FMA for the depthwise lanes): vpdpbusd on 16 int32 lanes. */
static int cpu_vnni512(void) {
    return opt_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2");
}

/* AVX-VNNI (the VEX vpdpbusd on 8 lanes: Intel's client CPUs from Alder Lake on, which have no AVX-512). */
static int cpu_vnni256(void) {
    return __builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

static void pick(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    opt_qconv_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    opt_qdw_fma = opt_qconv_avx2 && __builtin_cpu_supports("fma");
    opt_qconv_vnni512 = opt_qdw_fma && cpu_vnni512();
    opt_qconv_vnni256 = !opt_qconv_vnni512 && opt_qdw_fma && cpu_vnni256();
#else
    opt_qconv_avx2 = 0;
    opt_qdw_fma = 0;
    opt_qconv_vnni512 = 0;
    opt_qconv_vnni256 = 0;
#endif
    opt_qconv_sdot = cpu_sdot();
#if defined(__aarch64__)
    opt_qconv_neon = !opt_qconv_sdot; /* Advanced SIMD is part of every aarch64 CPU */
#else
    opt_qconv_neon = 0;
#endif
}

OPT_API int optcli_qgemm_variant(int which) {
    pthread_once(&g_once, pick);
    if (which == 0) {
        pick();
    } else if (which == 1) {
        opt_qconv_avx2 = 0;
        opt_qdw_fma = 0;
        opt_qconv_vnni512 = 0;
        opt_qconv_vnni256 = 0;
        opt_qconv_sdot = 0;
        opt_qconv_neon = 0;
    } else if (which == 6) {
        if (!cpu_sdot()) return -1;
        opt_qconv_sdot = 1;
        opt_qconv_neon = 0;
    } else if (which == 7) {
#if defined(__aarch64__)
        opt_qconv_sdot = 0;
        opt_qconv_neon = 1;
#else
        return -1;
#endif
    } else if (which >= 2 && which <= 5) {
#ifdef QG_X86
        if (!__builtin_cpu_supports("avx2") || (which >= 3 && !__builtin_cpu_supports("fma")) ||
            (which == 4 && !cpu_vnni512()) || (which == 5 && !cpu_vnni256()))
            return -1;
        opt_qconv_avx2 = 1;
        opt_qdw_fma = which >= 3;
        opt_qconv_vnni512 = which == 4;
        opt_qconv_vnni256 = which == 5;
#else
        return -1;
#endif
    } else if (which != -1) {
        return -1;
    }
    return opt_qconv_neon     ? 7
           : opt_qconv_sdot   ? 6
           : opt_qconv_vnni256 ? 5
           : opt_qconv_vnni512 ? 4
           : opt_qconv_avx2   ? (opt_qdw_fma ? 3 : 2)
                              : 1;
}

static inline int32_t centred(const qconv_t *q, const uint8_t *p) {
    return (q->xs ? (int32_t)(int8_t)*p : (int32_t)*p) - q->xzp;
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
        opt_requant_row(q, acc, n, m0 + r, y + r * ystride);
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
    const int avx2 = opt_qconv_avx2 == 1;
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

static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* geom: N, C, H, W, M, KH, KW, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW, group;
 * qp: x zero point, y zero point, qmin, qmax, x signed, y signed. */
int opt_qconv_setup(qconv_t *q, const int64_t *geom, const int32_t *qp) {
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
    int rc = opt_qconv_setup(&q, geom, qp);
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
