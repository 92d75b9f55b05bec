/* Dense 2-D convolution with few input channels (the stems of vision nets: 3 -> 16..64 channels,
 * 3x3 to 7x7, stride 2), NCHW, fp32, with bias and a fused activation, on the pool.
 *
 * Why not the implicit GEMM (gemm.c): with K = Cin * KH * KW = 27..147 the GEMM gathers (packs)
 * every column of its im2col matrix from the input, one float at a time, for only K multiply-adds
 * per output channel block, and the input has to be zero-padded in numpy first.  Here the
 * gathering is done once per input row instead of once per tap: a work item (image, band of output
 * rows) copies the input rows its band reads, all Cin planes, into a zero-padded scratch split by
 * column stride phase (phase p holds padded columns p, p + s, p + 2s, ...; the layout of window.c's
 * depthwise kernel), so that tap (c, kh, kw) of a run of output columns is one contiguous run of
 * the scratch at a fixed offset, whatever the stride, dilation or padding.  The item then computes
 * every output channel of its band from that scratch (the fill is shared by all of them) with
 * register tiles of several output channels x a few vectors of columns (stem_kernel.h), bias as
 * their start value, and runs the activation over the band's output while it is in cache.  Bands
 * are as tall as keeps the scratch in L1 / L2.
 *
 * The register tiles come in one vector width per host kind, as the GEMM's (gemm.c), and follow
 * the GEMM's choice (optcli_gemm_variant): 16 floats with AVX-512, 8 on other x86-64 (an AVX2+FMA
 * clone picked at load), 4 (one NEON register) elsewhere.
 */
#include <stdlib.h>

#include "optcli_native.h"
#include "simd.h"

typedef struct {
    const float *x, *xend;   /* the input; reads may run past a row, never past xend */
    const float *wp, *bp;    /* weights packed [M / MB][taps][MB] and bias [M], zero past M */
    float *y;
    int64_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
    int64_t PW, RS, PS;      /* floats per phase row, per scratch row (sw phases), per scratch plane */
    int64_t taps;            /* C * KH * KW */
    int64_t band, nbands;    /* output rows per item, bands per image */
    int64_t G, Mp;           /* conv groups (each image's groups run as images of C / G channels),
                              * packed output channels per group (M / G rounded up to whole tiles) */
    int64_t mg, mgroups;     /* output channels per item (whole register tiles), channel groups */
    const int64_t *toff;     /* per tap (c, kh, kw): offset into the scratch of the output row's first row */
    const int64_t *span;     /* per phase p: [lo, hi), the j whose column j * sw + p - pl is in [0, W) */
    int act;
    float alpha, beta;
    _Atomic int failed;
} stem_t;

typedef struct {
    int64_t n, oh0, oh1, m0, m1; /* an item's image (a group of one: see stem_t.G), output rows and channels */
    int64_t wo;                  /* its group's first packed output channel (weights and bias) */
} band_t;

static inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Padded rows [r0, r0 + rows) of one plane into its scratch plane s, phase by phase: the input's
 * values, and zeros around them (only there: zeroing the whole scratch cost as much as the copy). */
ALWAYS_INLINE void fill_plane(const stem_t *a, const float *xin, float *s, int64_t r0, int64_t rows) {
    int64_t i0 = clamp64(a->pt - r0, 0, rows), i1 = clamp64(a->H + a->pt - r0, i0, rows);
    const int64_t sw = a->sw, PW = a->PW;
    if (i0 > 0) memset(s, 0, (size_t)(i0 * a->RS) * sizeof(float));
    if (i1 < rows) memset(s + i1 * a->RS, 0, (size_t)((rows - i1) * a->RS) * sizeof(float));
    for (int64_t i = i0; i < i1; i++) {
        float *dst = s + i * a->RS;
        const float *src = xin + (r0 + i - a->pt) * a->W;
        for (int64_t p = 0; p < sw; p++) {
            float *d = dst + p * PW;
            int64_t j = a->span[2 * p], hi = a->span[2 * p + 1];
            for (int64_t k = 0; k < j; k++) d[k] = 0.0f;
            for (int64_t k = hi; k < PW; k++) d[k] = 0.0f;
            const float *sp = src + p - a->pl; /* scratch column j of phase p reads sp[j * sw] */
            if (sw == 1) {
                if (hi > j) memcpy(d + j, sp + j, (size_t)(hi - j) * sizeof(float));
                continue;
            }
#ifdef HAVE_SHUFFLE
            if (sw == 2) /* 16 floats in, the even 8 out, while the 16 stay inside x */
                for (; j + VL <= hi && sp + 2 * j + 2 * VL <= a->xend; j += VL) vstore(d + j, vload_even(sp + 2 * j));
#endif
            for (; j < hi; j++) d[j] = sp[j * sw];
        }
    }
}

/* Work item it: image bd->n, output rows [oh0, oh1), and the calling thread's scratch holding the
 * padded input rows they read, every plane.  NULL (and a->failed set) when no memory could be had.
 * Inlined into each variant's item, so the copies run in its instruction set too. */
ALWAYS_INLINE float *stem_band(stem_t *a, int64_t it, band_t *bd) {
    int64_t g = it % a->mgroups, b = it / a->mgroups % a->nbands; /* an image's groups, then its bands */
    bd->n = it / a->mgroups / a->nbands;
    bd->wo = bd->n % a->G * a->Mp;
    bd->m0 = g * a->mg;
    bd->m1 = bd->m0 + a->mg < a->M ? bd->m0 + a->mg : a->M;
    bd->oh0 = b * a->band;
    bd->oh1 = bd->oh0 + a->band < a->OH ? bd->oh0 + a->band : a->OH;
    int64_t r0 = bd->oh0 * a->sh, rows = (bd->oh1 - 1 - bd->oh0) * a->sh + (a->KH - 1) * a->dh + 1;
    float *s = opt_scratch((size_t)(a->C * a->PS));
    if (!s) {
        a->failed = 1;
        return NULL;
    }
    for (int64_t c = 0; c < a->C; c++)
        fill_plane(a, a->x + (bd->n * a->C + c) * a->H * a->W, s + c * a->PS, r0, rows);
    return s;
}

#define SK_V v4f
#define SK_L 4
#define SK_SPLAT(a) {a, a, a, a}
#define SK_MB 4 /* 4 channels x 4 vectors: 16 accumulators, 4 inputs and a broadcast of NEON's 32 registers */
#define SK_NV 4
#define SK_ATTR
#define SK(name) sk4_##name
#include "stem_kernel.h"

#define SK_V v8f
#define SK_L 8
#define SK_SPLAT(a) {a, a, a, a, a, a, a, a}
#define SK_MB 4 /* 4 channels x 3 vectors: 12 accumulators, 3 inputs and a broadcast of AVX2's 16 registers */
#define SK_NV 3
#define SK_ATTR HOT_CLONES
#define SK(name) sk8_##name
#include "stem_kernel.h"

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#define HAVE_SK16 1
typedef float v16f __attribute__((vector_size(64)));
#define SK_V v16f
#define SK_L 16
#define SK_SPLAT(a) {a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}
#define SK_MB 8 /* 8 channels x 3 vectors: 24 accumulators of 32 registers */
#define SK_NV 3
#define SK_ATTR __attribute__((target("arch=x86-64-v4")))
#define SK(name) sk16_##name
#include "stem_kernel.h"
#endif

#define SCRATCH_BYTES (48 * 1024) /* an item's scratch (all its planes) should stay in L1 / L2 */

OPT_API int optcli_stem_conv2d_f32(const float *x, const float *w, const float *bias, float *y, const int64_t *g,
                                   int act, float alpha, float beta) {
    return optcli_stem_conv2d_grouped_f32(x, w, bias, y, g, 1, act, alpha, beta);
}

OPT_API int optcli_stem_conv2d_grouped_f32(const float *x, const float *w, const float *bias, float *y,
                                           const int64_t *g, int64_t conv_groups, int act, float alpha, float beta) {
    if (!g || conv_groups < 1 || conv_groups > ((int64_t)1 << 24)) return OPT_EINVAL;
    stem_t a = {.x = x, .y = y, .act = act, .alpha = alpha, .beta = beta, .G = conv_groups};
    a.N = g[0], a.C = g[1], a.H = g[2], a.W = g[3], a.M = g[4], a.KH = g[5], a.KW = g[6];
    a.sh = g[7], a.sw = g[8], a.dh = g[9], a.dw = g[10], a.pt = g[11], a.pl = g[12], a.OH = g[13], a.OW = g[14];
    if (a.N < 0 || a.C < 1 || a.H < 0 || a.W < 0 || a.M < 1 || a.KH < 1 || a.KW < 1 || a.sh < 1 || a.sw < 1 ||
        a.dh < 1 || a.dw < 1 || a.OH < 0 || a.OW < 0 || act < 0 || act >= ACT_COUNT || a.C % a.G || a.M % a.G ||
        a.N > ((int64_t)1 << 40) / a.G || a.C / a.G * a.KH * a.KW > (1 << 16) || a.sw > 4096)
        return OPT_EINVAL;
    if (a.N == 0 || a.OH == 0 || a.OW == 0) return 0;
    a.xend = x + a.N * a.C * a.H * a.W;
    /* An image's groups as images of their own: x and y are [N * G, C / G, ...] in memory */
    a.N *= a.G, a.C /= a.G, a.M /= a.G;

    /* the register tiles of the vector width the GEMM uses */
    int lanes = optcli_gemm_variant(-1);
    opt_item_fn fn = sk4_item;
    int64_t L = 4, MB = 4;
    if (lanes == 8) fn = sk8_item, L = 8, MB = 4;
#ifdef HAVE_SK16
    if (lanes == 16) fn = sk16_item, L = 16, MB = 8;
#endif

    a.taps = a.C * a.KH * a.KW;
    a.PW = (a.OW + L - 1) / L * L + (a.KW - 1) * a.dw / a.sw;
    a.RS = a.sw * a.PW;
    /* Bands: enough rows to amortise the halo, few enough for the scratch to stay in cache, and
     * about 8 items per thread (a thread that is not scheduled leaves its share to the others);
     * rows of one vector take tiles of NV rows, so their bands are no shorter. */
    int64_t threads = optcli_get_num_threads(), NV = L == 4 ? 4 : 3;
    int64_t in_rows = SCRATCH_BYTES / (a.C * a.RS * (int64_t)sizeof(float));
    int64_t band = (in_rows - (a.KH - 1) * a.dh - 1) / a.sh + 1;
    if (band < 2) band = 2;
    int64_t want = (8 * threads + a.N - 1) / a.N, nb = (a.OH + band - 1) / band;
    if (nb < want) band = (a.OH + want - 1) / want;
    if (a.OW <= L && band < NV) band = NV;
    if (band > a.OH) band = a.OH;
    a.band = band;
    a.nbands = (a.OH + band - 1) / band;
    a.PS = ((band - 1) * a.sh + (a.KH - 1) * a.dh + 1) * a.RS;
    /* Still too few items (small maps): the output channels split too, in whole register tiles;
     * each group fills its own scratch, a small cost beside its channels' multiply-adds. */
    int64_t Mp = (a.M + MB - 1) / MB * MB, tiles = Mp / MB, groups = 1;
    if (a.nbands < want) groups = (want + a.nbands - 1) / a.nbands;
    if (groups > tiles) groups = tiles;
    a.mg = (tiles + groups - 1) / groups * MB;
    a.mgroups = (a.M + a.mg - 1) / a.mg;
    a.Mp = Mp;

    /* weights as [M / MB][taps][MB] (a tile's broadcasts, tap by tap, are consecutive), bias as [M]:
     * both zero past M, so the last channel block computes zeros it does not store */
    int64_t *toff = malloc((size_t)(a.taps + 2 * a.sw) * sizeof(int64_t));
    float *wp = malloc((size_t)(a.G * (Mp * a.taps + Mp)) * sizeof(float));
    if (!toff || !wp) {
        free(toff), free(wp);
        return OPT_ENOMEM;
    }
    for (int64_t gi = 0; gi < a.G; gi++) { /* each group's channels from its own rows of W */
        const float *wg = w + gi * a.M * a.taps;
        for (int64_t m0 = 0; m0 < Mp; m0 += MB) { /* written in order, read from MB rows of W at once */
            float *dst = wp + (gi * Mp + m0) * a.taps;
            for (int64_t i = 0; i < MB; i++)
                if (m0 + i >= a.M)
                    for (int64_t t = 0; t < a.taps; t++) dst[t * MB + i] = 0.0f;
            if (m0 + MB <= a.M) {
                for (int64_t t = 0; t < a.taps; t++)
                    for (int64_t i = 0; i < MB; i++) dst[t * MB + i] = wg[(m0 + i) * a.taps + t];
            } else {
                for (int64_t t = 0; t < a.taps; t++)
                    for (int64_t i = 0; i < a.M - m0; i++) dst[t * MB + i] = wg[(m0 + i) * a.taps + t];
            }
        }
    }
    float *bp = wp + a.G * Mp * a.taps;
    for (int64_t gi = 0; gi < a.G; gi++)
        for (int64_t m = 0; m < Mp; m++) bp[gi * Mp + m] = bias && m < a.M ? bias[gi * a.M + m] : 0.0f;
    a.wp = wp, a.bp = bp;
    int64_t *span = toff + a.taps;
    for (int64_t p = 0; p < a.sw; p++) {
        span[2 * p] = clamp64(ceil_div(a.pl - p, a.sw), 0, a.PW);
        span[2 * p + 1] = clamp64(floor_div(a.W - 1 - p + a.pl, a.sw) + 1, span[2 * p], a.PW);
    }
    a.span = span;
    for (int64_t c = 0; c < a.C; c++)
        for (int64_t kh = 0; kh < a.KH; kh++)
            for (int64_t kw = 0; kw < a.KW; kw++)
                toff[(c * a.KH + kh) * a.KW + kw] =
                    c * a.PS + kh * a.dh * a.RS + (kw * a.dw % a.sw) * a.PW + kw * a.dw / a.sw;
    a.toff = toff;

    /* a tiny conv runs on the caller alone: waking a worker would cost more */
    int64_t macs = a.N * a.M * a.OH * a.OW * a.taps;
    opt_parallel(fn, &a, a.N * a.nbands * a.mgroups, macs < (1 << 18) ? 1 : 0);
    free(toff), free(wp);
    return a.failed ? OPT_ENOMEM : 0;
}
