/* The channel-blocked layout's dense conv and its conversions (optcli/ops/blocked.py).
 *
 * A value of logical shape [N, C, H, W] is held as [N, ceil(C / B), H, W, B]: channel c in lane
 * c % B of block c / B, B the vector width (4, 8 or 16).  The conv is direct: a register tile of
 * output-channel vectors times output pixels, each input value broadcast to the tile's vectors,
 * so there is no im2col and no packing of the input; its input may be blocked or plain NCHW (a
 * region's first conv, the stems).  Bias, residual and activation are applied before the store.
 */
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "simd.h"

typedef struct {
    const float *x, *w, *bias, *res; /* w packed [Mb][C][KH][KW][B]; bias [Mb * B] or NULL; res as y or NULL */
    float *y;
    int64_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW, ib, B;
    int64_t Cbi, Mb, OP;          /* input blocks (ib lanes each), output blocks, output positions per plane */
    int64_t groups, cg, mgb, tpg; /* conv groups; input channels and output blocks of one; register-tile groups of one */
    int64_t wob;                  /* a tile's weights start at w + (ob0 - wob) * C * KH * KW * B (see BC(item)) */
    int64_t ow_lo, ow_hi;         /* output columns whose taps all fall inside the input's columns */
    int64_t ngroups, band, nbands;
    int groups_inner;             /* items walk the output groups within a band (see the split) */
    int64_t kc;                   /* input channels per pass over a band: their weights stay in L1 */
    int ib_shift;                 /* log2(ib) */
    int pointwise;
    int prefetch;                 /* weights past L2: each pass fetches the next pass's (BC(item)) */
    int act;
    float alpha, beta;
} bc_t;

typedef float v16f __attribute__((vector_size(64)));

#define BC_V v4f
#define BC_L 4
#define BC_SPLAT(a) {a, a, a, a}
#define BC_OB 4 /* 4 x 6 = 24 accumulators of NEON's 32 registers, or 2 x 12, or 1 x 12 */
#define BC_ACC 24
#define BC_XMAX 12
#define BC_ATTR
#define BC_TARGET
#define BC(name) bc4_##name
#include "blocked_conv_kernel.h"

#define BC_V v8f
#define BC_L 8
#define BC_SPLAT(a) {a, a, a, a, a, a, a, a}
#define BC_OB 2 /* 2 x 6 = 12 accumulators, 2 weights and a broadcast of AVX2's 16 registers, or 1 x 12 */
#define BC_ACC 12
#define BC_XMAX 12
#define BC_ATTR HOT_CLONES
#define BC_TARGET
#define BC(name) bc8_##name
#include "blocked_conv_kernel.h"

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#define HAVE_BC16 1
#define BC16_ATTR __attribute__((target("arch=x86-64-v4")))
#define BC_V v16f
#define BC_L 16
#define BC_SPLAT(a) {a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}
#define BC_OB 4 /* 4 x 6 = 24 accumulators, 4 weights and a broadcast of AVX-512's 32 registers; 3 x 8, */
#define BC_ACC 24   /* 2 x 12 and 1 x 12 for fewer output blocks */
#define BC_XMAX 12
#define BC_ATTR BC16_ATTR
#define BC_TARGET BC16_ATTR
#define BC(name) bc16_##name
#include "blocked_conv_kernel.h"
#endif

/* The item function and register-tile height of block width b; NULL where this build or CPU has none. */
static opt_item_fn variant_of(int64_t b, int64_t *ob) {
    if (b == 4) return *ob = 4, bc4_run_item;
    if (b == 8) return *ob = 2, bc8_run_item;
#ifdef HAVE_BC16
    if (b == 16 && opt_cpu_has_avx512()) return *ob = 4, bc16_run_item;
#endif
    return NULL;
}

#define LIMIT ((int64_t)1 << 40) /* no dimension of the geometry beyond this */

/* Rows this narrow or narrower take a zero-padded copy of a blocked input, so that every tile is
 * an unchecked one: a 7-pixel row was a 4- and a 1-pixel tile plus two checked edge pixels (the
 * checks cost a select per input value).  A 3x3 conv of 512 channels on 7 x 7 planes: 241 -> 192
 * us per 32 output channels (AVX2, 1 thread, weights in cache, minimums of 90); 128 channels on
 * 28 x 28 0.89x.  The copy (166 KB there) is well under 1% of the conv.  Wider rows keep the
 * checked edges, a few percent of their tiles. */
#define PAD_COPY_MAX_OW 32

/* The copy of a->x padded as the geometry asks, a->x and the geometry pointed at it; NULL (and
 * nothing changed) where the input is plain, the pads are zero or negative, the row is wider than
 * PAD_COPY_MAX_OW, or the memory is not there (the checked tiles then do the same work). */
static float *pad_narrow_rows(bc_t *a) {
    if (a->ib != a->B || a->OW > PAD_COPY_MAX_OW || a->pt < 0 || a->pl < 0) return NULL;
    const int64_t Hp = (a->OH - 1) * a->sh + (a->KH - 1) * a->dh + 1;
    const int64_t Wp = (a->OW - 1) * a->sw + (a->KW - 1) * a->dw + 1;
    if (a->pt == 0 && a->pl == 0 && Hp <= a->H && Wp <= a->W) return NULL;
    const int64_t B = a->B, planes = a->N * a->Cbi;
    size_t bytes = 0; /* a crafted geometry's product may overflow: then no copy */
    if (__builtin_mul_overflow((size_t)planes, (size_t)Hp, &bytes) || __builtin_mul_overflow(bytes, (size_t)Wp, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)B * sizeof(float), &bytes))
        return NULL;
    float *p = malloc(bytes);
    if (!p) return NULL;
    for (int64_t k = 0; k < planes; k++) {
        const float *src = a->x + k * a->H * a->W * B;
        float *dst = p + k * Hp * Wp * B;
        for (int64_t r = 0; r < Hp; r++) {
            const int64_t ih = r - a->pt;
            float *row = dst + r * Wp * B;
            if (ih < 0 || ih >= a->H) {
                memset(row, 0, (size_t)(Wp * B) * sizeof(float));
                continue;
            }
            const int64_t c0 = a->pl < Wp ? a->pl : Wp, n = a->W < Wp - c0 ? a->W : Wp - c0;
            memset(row, 0, (size_t)(c0 * B) * sizeof(float));
            memcpy(row + c0 * B, src + ih * a->W * B, (size_t)(n * B) * sizeof(float));
            memset(row + (c0 + n) * B, 0, (size_t)((Wp - c0 - n) * B) * sizeof(float));
        }
    }
    a->x = p, a->H = Hp, a->W = Wp, a->pt = 0, a->pl = 0;
    return p;
}

OPT_API int optcli_conv2d_blocked_f32(const float *x, const float *packed, const float *bias, const float *res,
                                      float *y, const int64_t *g, int act, float alpha, float beta) {
    if (!g || !x || !packed || !y) return OPT_EINVAL;
    bc_t a = {.x = x, .w = packed, .bias = bias, .res = res, .y = y, .act = act, .alpha = alpha, .beta = beta};
    a.N = g[0], a.C = g[1], a.H = g[2], a.W = g[3], a.M = g[4], a.KH = g[5], a.KW = g[6], a.sh = g[7], a.sw = g[8];
    a.dh = g[9], a.dw = g[10], a.pt = g[11], a.pl = g[12], a.OH = g[13], a.OW = g[14], a.ib = g[15], a.B = g[16];
    a.groups = g[17];
    int64_t obt = 0;
    opt_item_fn fn = variant_of(a.B, &obt);
    if (!fn || (a.ib != 1 && a.ib != a.B) || a.N < 0 || a.C < 1 || a.H < 0 || a.W < 0 || a.M < 1 || a.KH < 1 ||
        a.KW < 1 || a.sh < 1 || a.sw < 1 || a.dh < 1 || a.dw < 1 || a.OH < 0 || a.OW < 0 || act < 0 ||
        act >= ACT_COUNT || a.KH > 4096 || a.KW > 4096 || a.sh > 4096 || a.sw > 4096 || a.dh > 4096 ||
        a.dw > 4096 || a.pt < -LIMIT || a.pt > LIMIT || a.pl < -LIMIT || a.pl > LIMIT || a.H > LIMIT ||
        a.W > LIMIT || a.OH > LIMIT || a.OW > LIMIT || a.N > LIMIT || a.C > LIMIT || a.M > LIMIT)
        return OPT_EINVAL;
    /* groups: each group's input channels whole input blocks (or planes), its outputs whole output
     * blocks, so a group is a one-group conv over its own blocks (no lane mixes two groups) */
    if (a.groups < 1 || a.groups > a.C || a.C % a.groups || a.M % a.groups ||
        (a.groups > 1 && ((a.C / a.groups) % a.ib || (a.M / a.groups) % a.B)))
        return OPT_EINVAL;
    if (a.N == 0 || a.OH == 0 || a.OW == 0) return 0;
    /* every tap of every output pixel: the rows and columns a window may start at stay in range */
    if ((a.OH - 1) * a.sh + (a.KH - 1) * a.dh > LIMIT || (a.OW - 1) * a.sw + (a.KW - 1) * a.dw > LIMIT)
        return OPT_EINVAL;
    a.Cbi = (a.C + a.ib - 1) / a.ib;
    float *padded = pad_narrow_rows(&a);
    a.Mb = (a.M + a.B - 1) / a.B;
    a.pointwise = a.KH == 1 && a.KW == 1 && a.sh == 1 && a.sw == 1 && a.pt == 0 && a.pl == 0 && a.OH == a.H &&
                  a.OW == a.W;
    a.OP = a.OH * a.OW;
    /* the columns whose window lies inside the input's columns: ow * sw - pl >= 0 and
     * ow * sw - pl + (KW - 1) * dw < W */
    a.ow_lo = a.pl > 0 ? (a.pl + a.sw - 1) / a.sw : 0;
    int64_t last = a.W - 1 + a.pl - (a.KW - 1) * a.dw;
    a.ow_hi = last < 0 ? 0 : (last / a.sw + 1 < a.OW ? last / a.sw + 1 : a.OW);
    if (a.ow_lo > a.OW) a.ow_lo = a.OW;
    if (a.ow_hi < a.ow_lo) a.ow_hi = a.ow_lo;

    const int64_t threads = optcli_get_num_threads();
    a.cg = a.C / a.groups;
    a.mgb = a.groups > 1 ? a.M / a.groups / a.B : a.Mb;
    a.tpg = (a.mgb + obt - 1) / obt;
    a.ngroups = a.groups * a.tpg;
    const int64_t units = a.pointwise ? a.OP : a.OH; /* split into bands: rows, or positions */
    const int64_t want = 8 * threads, have = a.N * a.ngroups;
    int64_t nb = have >= want ? 1 : (want + have - 1) / have;
    if (a.pointwise) { /* bands of whole tiles, at least two */
        int64_t most = units / 12 > 1 ? units / 12 : 1;
        if (nb > most) nb = most;
    } else if (nb > units) {
        nb = units;
    }
    a.band = (units + nb - 1) / nb;
    /* A pointwise input bigger than L2 (MobileNetV2's 16 -> 96 expansion at 112 x 112: 800 KB) was
     * read once per output group, from L3 each time (the groups outer): bands of about 64 KB of
     * input, each taken by every output group in turn while it stays in L2 (weights are re-read per
     * band instead, where that costs less), took that conv from 1230 to 790-830 us at 1 thread
     * (onnxruntime in the model: 665). */
    const int64_t x_bytes = a.Cbi * a.ib * a.H * a.W * (int64_t)sizeof(float);
    const int64_t w_bytes = a.Mb * a.B * a.C * (int64_t)sizeof(float);
    if (a.pointwise && x_bytes > ((int64_t)256 << 10) && a.ngroups > 1 && a.groups == 1) {
        int64_t fit = ((int64_t)64 << 10) / (a.Cbi * a.ib * (int64_t)sizeof(float));
        fit = fit < 12 ? 12 : fit / 12 * 12;
        int64_t nbf = (units + fit - 1) / fit;
        if (nbf * w_bytes < a.ngroups * x_bytes) {
            if (fit < a.band) a.band = fit;
            a.groups_inner = 1;
        }
    }
    a.nbands = (units + a.band - 1) / a.band;
    /* the weights of a group's block of input channels in about 24 KiB (L1): a tile's partial sums go
     * out to y and back once a block, 2-3% of its multiply-adds; from L2 the weights cost 20% */
    a.kc = ((int64_t)24 << 10) / (obt * a.KH * a.KW * a.B * (int64_t)sizeof(float));
    if (a.kc < 4) a.kc = 4;
    if (a.ib == a.B) a.kc = a.kc < a.B ? a.B : a.kc / a.B * a.B; /* whole input blocks: see BC(tile) */
    a.ib_shift = a.ib == 16 ? 4 : a.ib == 8 ? 3 : a.ib == 4 ? 2 : 0;
    a.prefetch = !a.pointwise && a.Mb * a.B * a.cg * a.KH * a.KW * (int64_t)sizeof(float) > ((int64_t)1 << 20);
    int64_t macs = a.N * a.M * a.OP * a.cg * a.KH * a.KW;
    opt_parallel(fn, &a, a.N * a.ngroups * a.nbands, macs < (1 << 16) ? 1 : 0);
    free(padded);
    return 0;
}

/* Conversions: items are planes of the blocked side (image n, block k). */
typedef struct {
    const float *x;
    float *y;
    int64_t c, hw, b, cb;
} reorder_t;

/* Widths 8 and 16 whose real lanes fill whole groups of 8 (pad groups are stored as zeros): eight
 * positions of each group's eight planes at a time, one 8 x 8 transpose in registers per group (the
 * scalar loops below took 257 us for MobileNetV2's 32 x 112 x 112 stem output, two loads, a store
 * and the loop per float; at width 16 they took 53 us for a 16 x 112 x 112 stem output, where a copy
 * of it takes 12).  Returns the positions done (0 where a group is partly real: the scalar loops). */
#ifdef HAVE_SHUFFLE
ALWAYS_INLINE int64_t to_blocked_x8(const float *x, float *y, int64_t hw, int64_t b, int64_t lanes) {
    if ((b != 8 && b != 16) || lanes % 8) return 0;
    int64_t p = 0;
    for (; p + 8 <= hw; p += 8)
        for (int64_t g = 0; g < b; g += 8) {
            v8f r[8];
            if (g < lanes) {
                for (int l = 0; l < 8; l++) r[l] = vload(x + (g + l) * hw + p);
                transpose8(r);
            } else {
                for (int j = 0; j < 8; j++) r[j] = (v8f){0};
            }
            for (int j = 0; j < 8; j++) vstore(y + (p + j) * b + g, r[j]);
        }
    return p;
}
ALWAYS_INLINE int64_t from_blocked_x8(const float *x, float *y, int64_t hw, int64_t b, int64_t lanes) {
    if ((b != 8 && b != 16) || lanes % 8) return 0;
    int64_t p = 0;
    for (; p + 8 <= hw; p += 8)
        for (int64_t g = 0; g < lanes; g += 8) {
            v8f r[8];
            for (int j = 0; j < 8; j++) r[j] = vload(x + (p + j) * b + g);
            transpose8(r);
            for (int l = 0; l < 8; l++) vstore(y + (g + l) * hw + p, r[l]);
        }
    return p;
}
#endif

HOT_CLONES static void to_blocked_item(void *ctx, int64_t it) {
    const reorder_t *r = ctx;
    const int64_t n = it / r->cb, k = it % r->cb, b = r->b, hw = r->hw;
    const int64_t lanes = r->c - k * b < b ? r->c - k * b : b;
    const float *x = r->x + (n * r->c + k * b) * hw;
    float *y = r->y + it * hw * b;
    int64_t start = 0;
#ifdef HAVE_SHUFFLE
    start = to_blocked_x8(x, y, hw, b, lanes);
#endif
    for (int64_t p0 = start; p0 < hw; p0 += 64) { /* 64 positions of each plane at a time: all in L1 */
        int64_t p1 = p0 + 64 < hw ? p0 + 64 : hw;
        for (int64_t l = 0; l < b; l++) {
            const float *xl = x + l * hw;
            if (l < lanes)
                for (int64_t p = p0; p < p1; p++) y[p * b + l] = xl[p];
            else
                for (int64_t p = p0; p < p1; p++) y[p * b + l] = 0.0f;
        }
    }
}

HOT_CLONES static void from_blocked_item(void *ctx, int64_t it) {
    const reorder_t *r = ctx;
    const int64_t n = it / r->cb, k = it % r->cb, b = r->b, hw = r->hw;
    const int64_t lanes = r->c - k * b < b ? r->c - k * b : b;
    const float *x = r->x + it * hw * b;
    float *y = r->y + (n * r->c + k * b) * hw;
    int64_t start = 0;
#ifdef HAVE_SHUFFLE
    start = from_blocked_x8(x, y, hw, b, lanes);
#endif
    for (int64_t p0 = start; p0 < hw; p0 += 64) {
        int64_t p1 = p0 + 64 < hw ? p0 + 64 : hw;
        for (int64_t l = 0; l < lanes; l++) {
            float *yl = y + l * hw;
            for (int64_t p = p0; p < p1; p++) yl[p] = x[p * b + l];
        }
    }
}

static int reorder(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t b, opt_item_fn fn) {
    if (!x || !y || n < 0 || c < 1 || hw < 0 || (b != 4 && b != 8 && b != 16) || n > LIMIT || c > LIMIT ||
        hw > LIMIT)
        return OPT_EINVAL;
    reorder_t r = {x, y, c, hw, b, (c + b - 1) / b};
    /* below 256 KiB waking a worker costs more than it saves (the width-8 copies are in-register
     * transposes, ~0.15 ns a float; ResNet's 800 KB maps, converted around each dense conv where
     * B = 8, ran on one core of two) */
    opt_parallel(fn, &r, n * r.cb, n * r.cb * hw * b < (1 << 16) ? 1 : 0);
    return 0;
}

OPT_API int optcli_to_blocked_f32(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t b) {
    return reorder(x, y, n, c, hw, b, to_blocked_item);
}

OPT_API int optcli_from_blocked_f32(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t b) {
    return reorder(x, y, n, c, hw, b, from_blocked_item);
}
