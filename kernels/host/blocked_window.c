/* Depthwise convolution and pooling in the channel-blocked layout NCHWc: a value of logical shape
 * [N, C, H, W] stored as [N, Cb, H, W, B] (Cb = ceil(C / B); channel c at block c / B, lane c % B),
 * fp32, on the pool.  B is the vector width: 16 (x86-64 with AVX-512), 8 (other x86-64: an AVX2
 * clone picked at load, see simd.h), 4 (aarch64: one NEON register); the caller says which.
 *
 * Work items are (image, channel block, band of output rows).  A register tile is a few output
 * pixels of one row, one vector each; per tap it loads one weight vector and one input vector per
 * pixel (blocked_window_kernel.h): no broadcasts, no stride-phase shuffles.  Taps are never
 * checked: rows of 16 output pixels or more read the input in place, except a tile's worth of
 * pixels at each padded edge, which read strips of padded copies of the edge columns (made once
 * per band), and rows whose window leaves the input at the top or bottom, which read a padded copy
 * of their tap rows; narrower rows (7x7, 14x14) read padded copies of the band's input rows (a
 * memcpy per row: rows are contiguous runs of W * B floats).  The padding is 0, or -inf for max
 * pooling.  Bias is the accumulators' start value, and the activation runs over each output row
 * while it is in L1.  Copying every row (what the NCHW kernels do) cost as much as the
 * multiply-adds on wide rows, and loads that straddle cache lines ~20%: the scratch is aligned to
 * 64 bytes, and so are the Python wrappers' outputs.
 * Pad lanes (channels >= C) compute with zero weights and bias, so they hold act(0) whatever finite
 * values the input's pad lanes hold; pooling carries the input's pad lanes through (finite in,
 * finite out, never mixed into a real channel).
 */
#include <math.h>
#include <stdlib.h>

#include "optcli_native.h"
#include "simd.h"

typedef struct {
    const float *x, *w, *bias; /* w packed [Cb][KH][KW][B], bias [Cb * B] or NULL */
    float *y;
    int64_t N, Cb, H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW, B;
    int64_t SW, RS;            /* pixels per scratch row, floats per scratch row */
    int64_t band, nbands;      /* output rows per item, items per plane */
    int direct;                /* wide rows: read the input in place, pad copies of the edges only */
    int64_t ow_lo, ow_hi;      /* the output columns whose taps are all inside the input's columns */
    int64_t left, right;       /* direct: the columns [left, right) read in place, the others from strips */
    int64_t strips;            /* direct: the padded columns of both edge strips */
    int act;
    float alpha, beta;
    int op;                    /* OP_CONV, OP_MAX, OP_AVG */
    const float *rrow, *rcol;  /* average pooling: 1 / count of each output row's and column's window */
    _Atomic int failed;
} bw_t;

typedef struct {
    const float *x;
    float *y;
    int64_t planes, hw, group;
} gap_t;

typedef struct {
    int64_t plane, oh0, oh1, rows; /* rows: the input rows the band reads */
} band_t;

enum { OP_CONV = 0, OP_MAX = 1, OP_AVG = 2 };

typedef struct {
    opt_item_fn conv3s1, conv3s2, conv5s1, conv5s2, conv_any, max3s2, max2s2, max_any, avg_any, gap;
} bw_variant_t;

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Work item it: its plane and output rows, and the calling thread's scratch: room for the padded
 * input rows they read (narrow rows: the item copies them, vector by vector, where a memset and a
 * memcpy a row, libc calls for a few hundred bytes, cost a 7x7 depthwise conv more than its
 * multiply-adds), or for a row's padded tap rows and the band's edge strips (direct).
 * NULL (and a->failed set) when no memory could be had. */
static float *bw_band(bw_t *a, int64_t it, band_t *bd) {
    bd->plane = it / a->nbands;
    bd->oh0 = it % a->nbands * a->band;
    bd->oh1 = min64(bd->oh0 + a->band, a->OH);
    int64_t rows = (bd->oh1 - 1 - bd->oh0) * a->sh + (a->KH - 1) * a->dh + 1;
    bd->rows = rows;
    float *s = opt_scratch((size_t)(a->direct ? a->KH * a->RS + rows * a->strips * a->B : rows * a->RS) + 16);
    if (!s) {
        a->failed = 1;
        return NULL;
    }
    s += (64 - (uintptr_t)s % 64) % 64 / sizeof(float); /* vectors on cache lines: a split load costs two */
    return s;
}

#define BW_V v4f
#define BW_L 4
#define BW_XT 8 /* 8 accumulators and their inputs of NEON's 32 registers */
#define BW_VMAX max4_nan
#define BW_ATTR
#define BW_TARGET
#define BW(name) bw4_##name
#include "blocked_window_kernel.h"

#define BW_V v8f
#define BW_L 8
#define BW_XT 6 /* 6 accumulators, their inputs and a weight of AVX2's 16 registers */
#define BW_VMAX vmax_nan
#define BW_ATTR HOT_CLONES
#define BW_TARGET
#define BW(name) bw8_##name
#include "blocked_window_kernel.h"

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#define HAVE_BW16 1
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define V4_ATTR __attribute__((target("arch=x86-64-v4")))
V4_ATTR ALWAYS_INLINE v16f vmax16(v16f v, v16f m) {
    v16i k = (v > m) | (v != v);
    return (v16f)((k & (v16i)v) | (~k & (v16i)m));
}
#define BW_V v16f
#define BW_L 16
#define BW_XT 8 /* 8 accumulators, up to 12 inputs (5x5) and a weight of 32 registers */
#define BW_VMAX vmax16
#define BW_ATTR V4_ATTR
#define BW_TARGET V4_ATTR
#define BW(name) bw16_##name
#include "blocked_window_kernel.h"

#endif

/* The variant of block width b, NULL where this build or CPU has none. */
static const bw_variant_t *variant_of(int64_t b) {
    if (b == 4) return &bw4_variant;
    if (b == 8) return &bw8_variant;
#ifdef HAVE_BW16
    if (b == 16 && opt_cpu_has_avx512()) return &bw16_variant;
#endif
    return NULL;
}

#define SCRATCH_BYTES (64 * 1024) /* an item's padded rows should stay in L1 / L2 */
#define LIMIT ((int64_t)1 << 40)   /* no dimension or product of the geometry beyond this */

/* Whether the product of n non-negative values stays below 2^62. */
static int product_fits(const int64_t *v, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (__builtin_mul_overflow(p, v[i], &p) || p > ((int64_t)1 << 62)) return 0;
    return 1;
}

/* Geometry from the 15 values (see optcli_native.h), validated; the item split; the items on the
 * pool.  Returns 0, OPT_EINVAL or OPT_ENOMEM. */
static int run_blocked(bw_t *a, const int64_t *g) {
    if (!g) return OPT_EINVAL;
    a->N = g[0], a->Cb = g[1], a->H = g[2], a->W = g[3], a->KH = g[4], a->KW = g[5], a->sh = g[6], a->sw = g[7];
    a->dh = g[8], a->dw = g[9], a->pt = g[10], a->pl = g[11], a->OH = g[12], a->OW = g[13], a->B = g[14];
    const bw_variant_t *v = variant_of(a->B);
    if (!v || a->N < 0 || a->Cb < 1 || a->H < 0 || a->W < 0 || a->KH < 1 || a->KW < 1 || a->sh < 1 || a->sw < 1 ||
        a->dh < 1 || a->dw < 1 || a->OH < 0 || a->OW < 0 || a->act < 0 || a->act >= ACT_COUNT ||
        a->KH > 4096 || a->KW > 4096 || a->sh > 4096 || a->sw > 4096 || a->dh > 4096 || a->dw > 4096 ||
        a->pt < -LIMIT || a->pt > LIMIT || a->pl < -LIMIT || a->pl > LIMIT || a->H > LIMIT || a->W > LIMIT ||
        a->OH > LIMIT || a->OW > LIMIT || a->N > LIMIT || a->Cb > LIMIT)
        return OPT_EINVAL;
    /* every tap of every output pixel inside the padded rows, and the padded rows no wider than needed */
    a->SW = (a->OW - 1) * a->sw + (a->KW - 1) * a->dw + 1;
    if (a->N == 0 || a->OH == 0 || a->OW == 0) return 0;
    if (a->SW > LIMIT / 64 || (a->OH - 1) * a->sh + (a->KH - 1) * a->dh + 1 > LIMIT) return OPT_EINVAL;
    /* no product of the sizes may overflow: the input's and output's floats, the multiply-adds */
    const int64_t in[] = {a->N, a->Cb, a->H, a->W, a->B}, out[] = {a->N, a->Cb, a->OH, a->OW, a->B, a->KH, a->KW};
    if (!product_fits(in, 5) || !product_fits(out, 7)) return OPT_EINVAL;
    a->RS = a->SW * a->B;

    const int64_t threads = optcli_get_num_threads(), planes = a->N * a->Cb;
    /* rows of 16 pixels or more read the input in place: the edge columns' copies cost little there,
     * and a padded copy of every row cost as much as the multiply-adds (memcpy, and a scratch past L1) */
    a->direct = a->OW >= 16;
    a->ow_lo = a->pl > 0 ? (a->pl + a->sw - 1) / a->sw : 0;
    int64_t last = a->W - 1 + a->pl - (a->KW - 1) * a->dw; /* the last padded column a window may start at */
    a->ow_hi = last < 0 ? 0 : min64(last / a->sw + 1, a->OW);
    if (a->ow_lo > a->OW) a->ow_lo = a->OW;
    if (a->ow_hi < a->ow_lo) a->ow_hi = a->ow_lo;
    const int64_t tile = a->B == 8 ? 6 : 8; /* BW_XT */
    a->left = a->ow_lo ? max64(a->ow_lo, tile) : 0;
    a->right = a->ow_hi < a->OW ? a->OW - max64(a->OW - a->ow_hi, tile) : a->OW;
    if (a->direct && a->left < a->right) {
        int64_t reach = (a->KW - 1) * a->dw + 1;
        a->strips = (a->left ? (a->left - 1) * a->sw + reach : 0) +
                    (a->right < a->OW ? (a->OW - 1) * a->sw + reach - a->right * a->sw : 0);
    }
    int64_t in_rows = SCRATCH_BYTES / (a->RS * (int64_t)sizeof(float));
    int64_t band = (in_rows - (a->KH - 1) * a->dh - 1) / a->sh + 1;
    band = band < 1 ? 1 : min64(band, a->OH);
    int64_t nbands = (a->OH + band - 1) / band;
    if (planes * nbands < 8 * threads) { /* few planes: bands enough for 8 items a thread */
        nbands = min64((8 * threads + planes - 1) / planes, a->OH);
        band = (a->OH + nbands - 1) / nbands;
        nbands = (a->OH + band - 1) / band;
    }
    a->band = band, a->nbands = nbands;

    opt_item_fn fn;
    const int unit = a->dh == 1 && a->dw == 1 && a->KH == a->KW;
    if (a->op == OP_CONV) {
        fn = v->conv_any;
        if (unit && a->KW == 3 && a->sw == 1) fn = v->conv3s1;
        if (unit && a->KW == 3 && a->sw == 2) fn = v->conv3s2;
        if (unit && a->KW == 5 && a->sw == 1) fn = v->conv5s1;
        if (unit && a->KW == 5 && a->sw == 2) fn = v->conv5s2;
    } else if (a->op == OP_MAX) {
        fn = v->max_any;
        if (unit && a->KW == 3 && a->sw == 2) fn = v->max3s2;
        if (unit && a->KW == 2 && a->sw == 2) fn = v->max2s2;
    } else {
        fn = v->avg_any;
    }
    /* a tiny job runs on the caller alone: waking a worker would cost more */
    int64_t macs = planes * a->B * a->OH * a->OW * a->KH * a->KW;
    opt_parallel(fn, a, planes * nbands, macs < (1 << 15) ? 1 : 0);
    return a->failed ? OPT_ENOMEM : 0;
}

OPT_API int optcli_dwconv2d_blocked_f32(const float *x, const float *packed, const float *bias, float *y,
                                        const int64_t *geom, int act, float alpha, float beta) {
    bw_t a = {.x = x, .w = packed, .bias = bias, .y = y, .act = act, .alpha = alpha, .beta = beta, .op = OP_CONV};
    return run_blocked(&a, geom);
}

OPT_API int optcli_pool2d_blocked_f32(const float *x, float *y, const int64_t *geom, int op, const float *rrow,
                                      const float *rcol) {
    if ((op != OP_MAX && op != OP_AVG) || (op == OP_AVG && (!rrow || !rcol))) return OPT_EINVAL;
    bw_t a = {.x = x, .y = y, .op = op, .rrow = rrow, .rcol = rcol};
    return run_blocked(&a, geom);
}

OPT_API int optcli_global_avg_blocked_f32(const float *x, float *y, int64_t n, int64_t cb, int64_t hw, int64_t b) {
    const bw_variant_t *v = variant_of(b);
    if (!v || n < 0 || cb < 1 || hw < 1 || n > LIMIT || cb > LIMIT || hw > LIMIT) return OPT_EINVAL;
    gap_t a = {.x = x, .y = y, .planes = n * cb, .hw = hw};
    a.group = max64(1, 8192 / (hw * b)); /* about 32 KiB of input per item */
    /* a sum is ~0.05 ns a float: below 4 MiB waking a worker (10-20 us) costs more than it saves */
    opt_parallel(v->gap, &a, (a.planes + a.group - 1) / a.group, a.planes * hw * b < (1 << 20) ? 1 : 0);
    return 0;
}
