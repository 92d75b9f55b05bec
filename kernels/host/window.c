/* Sliding-window kernels, NCHW, fp32, on the pool: depthwise convolution with bias and a fused
 * activation, and max / average pooling.
 *
 * Work items are (group of output planes, band of output rows).  For each item the input rows
 * the band reads are copied once into a zero-padded scratch, split by column stride phase
 * (phase p holds padded columns p, p + s, p + 2s, ...), so every kernel tap of every output
 * row is one contiguous run of the scratch whatever the stride, dilation or padding.  A tile
 * of R output rows x V vectors keeps its accumulators in registers through all the taps (bias is
 * their start value) and stores them once; the activation then runs over the band's output
 * while it is still in L1.  3x3 and 5x5 windows get their tap loops unrolled; any other window
 * takes the same code with a run-time tap count.  Pooling reads the same scratch (padded with
 * -inf for max) and combines the taps row by row: a max or a sum has no multiply to keep in
 * registers, and plain loops let the compiler pick its max instructions.  Max pooling at column
 * stride 1 or 2 reads the input rows straight instead (direct_max: a max is separable).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "optcli_native.h"
#include "simd.h"

typedef struct {
    const float *x, *w, *bias;
    const float *xend;     /* one past the input: reads may run past a row, never past this */
    float *y;
    int64_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
    int64_t mult;          /* output channels per input channel */
    int64_t band, nbands;  /* output rows per item, items per plane group */
    int64_t group, ngroups;/* planes per item, plane groups */
    int64_t OWv;           /* OW rounded up to whole vectors */
    int64_t PW, RS;        /* floats per phase row, per scratch row (sw phases) */
    int64_t taps;
    const int64_t *toff;   /* per tap: offset into the scratch of the tile's first row */
    const int64_t *span;   /* per phase p: [lo, hi), the j whose column j * sw + p - pl is in [0, W) */
    int act;
    float alpha, beta;
    int op;                /* OP_CONV, OP_MAX, OP_AVG */
    float pad;             /* the value of padding: 0, -inf for max pooling */
    const float *rrow, *rcol; /* average pooling: 1 / count of each output row's and column's window */
    _Atomic int failed;
} dw_t;

enum { OP_CONV = 0, OP_MAX = 1, OP_AVG = 2 };

/* Each thread's scratch, kept between calls and freed when the thread exits (a Python thread
 * that called in, too). */
typedef struct {
    float *p;
    size_t cap;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *v) {
    scratch_t *s = v;
    free(s->p);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

float *opt_scratch(size_t n) {
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        pthread_setspecific(scratch_key, s);
    }
    if (n > s->cap) {
        float *p = realloc(s->p, n * sizeof(float));
        if (!p) return NULL;
        s->p = p;
        s->cap = n;
    }
    return s->p;
}

static inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* The input values of padded rows [r0, r0 + rows) of one plane into the scratch, phase by phase.
 * Only the positions inside the input are written: they are the same for every plane of an item,
 * so the padding, zeroed once per item, stays zero. */
ALWAYS_INLINE void fill(const dw_t *a, const float *xin, float *s, int64_t r0, int64_t rows) {
    int64_t i0 = clamp64(a->pt - r0, 0, rows), i1 = clamp64(a->H + a->pt - r0, i0, rows);
    for (int64_t i = i0; i < i1; i++) {
        float *dst = s + i * a->RS;
        const float *src = xin + (r0 + i - a->pt) * a->W;
        for (int64_t p = 0; p < a->sw; p++) {
            float *d = dst + p * a->PW;
            int64_t lo = a->span[2 * p], hi = a->span[2 * p + 1];
            const float *sp = src + p - a->pl;
            int64_t j = lo;
            if (a->sw == 1) {
                for (; j + VL <= hi; j += VL) vstore(d + j, vload(sp + j));
                if (j < hi) copy_short(d + j, sp + j, (int)(hi - j));
            } else if (a->sw == 2) {
#ifdef HAVE_SHUFFLE
                /* 16 floats in, the even 8 out, also for the row's last few (reading on into the
                 * next row is fine while it stays inside x: only the valid lanes are stored) */
                for (; j + VL <= hi && sp + 2 * j + 2 * VL <= a->xend; j += VL) vstore(d + j, vload_even(sp + 2 * j));
                if (j < hi && sp + 2 * j + 2 * VL <= a->xend) {
                    vstore_part(d + j, vload_even(sp + 2 * j), (int)(hi - j));
                    j = hi;
                }
#endif
                for (; j < hi; j++) d[j] = sp[2 * j];
            } else {
                for (; j < hi; j++) d[j] = sp[j * a->sw];
            }
        }
    }
}

/* R output rows x V vectors starting at column ow0; s points at the first row's scratch.
 *
 * The loops over the tile's rows and vectors unrolled (the pragmas), so that the accumulators
 * are registers, and the loop over the taps kept rolled: GCC left the row and vector loops of
 * the 3x3 tiles rolled, with the accumulator array on the stack (a store and a reload per
 * multiply-add), and with the taps unrolled too it loaded all 72 inputs of a tile ahead and
 * spilled them (tests/native/test_codegen.py). */
#define DW_UNROLL _Pragma("GCC unroll 32")
ALWAYS_INLINE void tile(const dw_t *a, const float *s, const float *wk, v8f vb, float *y, int64_t ow0,
                        const int R, const int V, const int T) {
    v8f acc[4][2];
    DW_UNROLL
    for (int r = 0; r < R; r++)
        DW_UNROLL
        for (int v = 0; v < V; v++) acc[r][v] = vb;
    const int64_t rstep = a->sh * a->RS;
    _Pragma("GCC unroll 1")
    for (int t = 0; t < T; t++) {
        v8f wt = vsplat(wk[t]);
        const float *p = s + a->toff[t] + ow0;
        DW_UNROLL
        for (int r = 0; r < R; r++)
            DW_UNROLL
            for (int v = 0; v < V; v++) acc[r][v] += wt * vload(p + r * rstep + v * VL);
    }
    DW_UNROLL
    for (int r = 0; r < R; r++)
        DW_UNROLL
        for (int v = 0; v < V; v++) {
            int64_t col = ow0 + v * VL, left = a->OW - col;
            if (left > 0) vstore_part(y + r * a->OW + col, acc[r][v], (int)left);
        }
}

ALWAYS_INLINE void rows(const dw_t *a, const float *s, const float *wk, v8f vb, float *y, const int R,
                        const int T) {
    int64_t ow0 = 0;
    for (; ow0 + 2 * VL <= a->OWv; ow0 += 2 * VL) tile(a, s, wk, vb, y, ow0, R, 2, T);
    if (ow0 < a->OWv) tile(a, s, wk, vb, y, ow0, R, 1, T);
}

/* The rows of work item `it` (a group of planes x a band of output rows): its output rows
   [oh0, oh1), the first input row r0, and a scratch band of nrows padded rows filled with the
   padding value.  NULL (and a->failed set) when no scratch memory could be had. */
typedef struct {
    int64_t g, oh0, oh1, r0, nrows;
} band_t;

static float *band_scratch(dw_t *a, int64_t it, band_t *bd) {
    int64_t b = it % a->nbands;
    bd->g = it / a->nbands;
    bd->oh0 = b * a->band;
    bd->oh1 = bd->oh0 + a->band < a->OH ? bd->oh0 + a->band : a->OH;
    bd->r0 = bd->oh0 * a->sh;
    bd->nrows = (bd->oh1 - 1 - bd->oh0) * a->sh + (a->KH - 1) * a->dh + 1;
    float *s = opt_scratch((size_t)(bd->nrows * a->RS));
    if (!s) {
        a->failed = 1;
        return NULL;
    }
    if (a->pad == 0.0f) {
        memset(s, 0, (size_t)(bd->nrows * a->RS) * sizeof(float));
    } else {
        for (int64_t i = 0; i < bd->nrows * a->RS; i++) s[i] = a->pad;
    }
    return s;
}

ALWAYS_INLINE void item(dw_t *a, int64_t it, const int T) {
    band_t bd;
    float *s = band_scratch(a, it, &bd);
    if (!s) return;
    const int64_t g = bd.g, oh0 = bd.oh0, oh1 = bd.oh1, r0 = bd.r0, nrows = bd.nrows;
    int64_t p1 = (g + 1) * a->group < a->N * a->M ? (g + 1) * a->group : a->N * a->M;
    for (int64_t plane = g * a->group; plane < p1; plane++) {
        int64_t n = plane / a->M, m = plane % a->M, c = m / a->mult;
        const float *wk = a->w + m * a->taps;
        v8f vb = vsplat(a->bias ? a->bias[m] : 0.0f);
        float *yp = a->y + plane * a->OH * a->OW;
        fill(a, a->x + (n * a->C + c) * a->H * a->W, s, r0, nrows);
        /* tiles of 4 rows, then 2, then 1: as many independent accumulators as the rows allow */
        int64_t oh = oh0;
        for (; oh + 4 <= oh1; oh += 4) rows(a, s + (oh - oh0) * a->sh * a->RS, wk, vb, yp + oh * a->OW, 4, T);
        if (oh + 2 <= oh1) {
            rows(a, s + (oh - oh0) * a->sh * a->RS, wk, vb, yp + oh * a->OW, 2, T);
            oh += 2;
        }
        if (oh < oh1) rows(a, s + (oh - oh0) * a->sh * a->RS, wk, vb, yp + oh * a->OW, 1, T);
        act_span(yp + oh0 * a->OW, (oh1 - oh0) * a->OW, a->act, a->alpha, a->beta);
    }
}

/* Small planes (up to 16x16 outputs: the late stages of a MobileNet), channels across the lanes.
 * In NCHW a 7x7 plane fills one 8-float vector per row 7/8 full, and every plane pays its own
 * scratch fill, tile set-up and activation pass: ~500 cycles for 441 multiply-adds.  Here an item
 * takes 8 planes at a time: their padded inputs are transposed into a scratch of [row][col][8
 * planes], where every tap of every output pixel is one aligned vector and each lane has its own
 * plane's weight; four pixels of a row go through the taps together (four independent chains),
 * and the outputs are transposed back into their planes. */
#define SMALL_PIXELS 256

/* The small paths' results, out[pixel][lane] for the eight planes from p0 (lanes of them real),
 * stored into those planes of y. */
ALWAYS_INLINE void store_planes(dw_t *a, const float *out, int64_t p0, int lanes, int64_t npx) {
#ifdef HAVE_SHUFFLE
    for (int64_t k0 = 0; k0 < npx; k0 += VL) { /* eight pixels of eight planes, turned into planes */
        v8f r[VL];
        for (int i = 0; i < VL; i++) r[i] = vload(out + (k0 + i) * VL); /* past npx: unused lanes */
        transpose8(r);
        int n = npx - k0 < VL ? (int)(npx - k0) : VL;
        for (int l = 0; l < lanes; l++) vstore_part(a->y + (p0 + l) * npx + k0, r[l], n);
    }
#else
    for (int l = 0; l < lanes; l++) {
        float *y = a->y + (p0 + l) * npx;
        for (int64_t k = 0; k < npx; k++) y[k] = out[k * VL + l];
    }
#endif
}

/* The eight planes xin[] side by side in the lanes of the small paths' scratch s (SH x SW pixels of
 * VL floats, the padding already written): input row i sits at scratch row i + pt, column j at
 * j + pl (rows and columns outside the scratch: cropped by negative pads). */
ALWAYS_INLINE void gather_planes(const dw_t *a, const float *const xin[VL], float *s, int64_t SH, int64_t SW) {
    int64_t i0 = a->pt < 0 ? -a->pt : 0, i1 = SH - a->pt < a->H ? SH - a->pt : a->H;
    int64_t j0 = a->pl < 0 ? -a->pl : 0, j1 = SW - a->pl < a->W ? SW - a->pl : a->W;
    for (int64_t i = i0; i < i1; i++) {
        float *dst = s + ((i + a->pt) * SW + a->pl) * VL;
        const int64_t off = i * a->W;
        for (int64_t j = j0; j < j1; j++) {
            v8f v = {xin[0][off + j], xin[1][off + j], xin[2][off + j], xin[3][off + j],
                     xin[4][off + j], xin[5][off + j], xin[6][off + j], xin[7][off + j]};
            vstore(dst + j * VL, v);
        }
    }
}

ALWAYS_INLINE void small_group(dw_t *a, float *s, int64_t p0, const int T) {
    const int64_t planes = a->N * a->M, KH = a->KH, KW = a->KW, OH = a->OH, OW = a->OW;
    const int64_t SH = (OH - 1) * a->sh + (KH - 1) * a->dh + 1, SW = (OW - 1) * a->sw + (KW - 1) * a->dw + 1;
    const int lanes = planes - p0 < VL ? (int)(planes - p0) : VL;
    memset(s, 0, (size_t)(SH * SW * VL) * sizeof(float));
    /* Lanes past the last plane read the first plane again (with zero weights, never stored).  The
     * transposes build whole vectors from eight scalars and store those: eight scalar stores
     * read back at once as one vector cannot be forwarded from the store buffer and stall. */
    const float *xin[VL], *wk[VL];
    float bias[VL];
    const int64_t taps = T ? T : a->taps;
    for (int l = 0; l < VL; l++) {
        int64_t plane = p0 + (l < lanes ? l : 0), n = plane / a->M, m = plane % a->M, c = m / a->mult;
        xin[l] = a->x + (n * a->C + c) * a->H * a->W;
        wk[l] = a->w + m * taps;
        bias[l] = l < lanes && a->bias ? a->bias[m] : 0.0f;
    }
    float wt[1024 * VL] __attribute__((aligned(32)));
    for (int64_t t = 0; t < taps; t++) {
        v8f v = {wk[0][t], wk[1][t], wk[2][t], wk[3][t], wk[4][t], wk[5][t], wk[6][t], wk[7][t]};
        for (int l = lanes; l < VL; l++) v[l] = 0.0f;
        vstore(wt + t * VL, v);
    }
    gather_planes(a, xin, s, SH, SW);
    float out[(SMALL_PIXELS + VL) * VL] __attribute__((aligned(32))); /* whole groups of 8 pixels */
    const v8f vb = vload(bias);
    const int64_t rs = SW * VL, hstep = a->dh * rs, wstep = a->dw * VL;
    const int64_t KHc = T ? (T == 9 ? 3 : 5) : KH, KWc = T ? (T == 9 ? 3 : 5) : KW; /* constants when T is */
    const int U = OW >= 4 ? 4 : 1; /* pixels per pass: four independent chains of multiply-adds */
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *row = s + oh * a->sh * rs;
        float *o = out + oh * OW * VL;
        for (int64_t ow = 0; ow < OW; ow += U) {
            int64_t at = ow + U <= OW ? ow : OW - U; /* the last pass overlaps the one before: same values */
            const float *px = row + at * a->sw * VL;
            if (U == 4) { /* two copies, each with a constant pixel count: the accumulators stay in registers */
                const int64_t step = a->sw * VL;
                v8f c0 = vb, c1 = vb, c2 = vb, c3 = vb;
                for (int64_t kh = 0; kh < KHc; kh++)
                    for (int64_t kw = 0; kw < KWc; kw++) {
                        v8f w = vload(wt + (kh * KWc + kw) * VL);
                        const float *q = px + kh * hstep + kw * wstep;
                        c0 += w * vload(q);
                        c1 += w * vload(q + step);
                        c2 += w * vload(q + 2 * step);
                        c3 += w * vload(q + 3 * step);
                    }
                vstore(o + at * VL, c0);
                vstore(o + (at + 1) * VL, c1);
                vstore(o + (at + 2) * VL, c2);
                vstore(o + (at + 3) * VL, c3);
            } else {
                v8f c0 = vb;
                for (int64_t kh = 0; kh < KHc; kh++)
                    for (int64_t kw = 0; kw < KWc; kw++)
                        c0 += vload(wt + (kh * KWc + kw) * VL) * vload(px + kh * hstep + kw * wstep);
                vstore(o + at * VL, c0);
            }
        }
    }
    const int64_t npx = OH * OW;
    act_span(out, npx * VL, a->act, a->alpha, a->beta);
    store_planes(a, out, p0, lanes, npx);
}



/* np.maximum lane by lane (the larger, or a NaN of either) as one 8-lane compare and select: in
 * the AVX2 clone a cmpps pair, an or and a blendvps, where vmax_nan's 4-lane halves took twice the
 * instructions (a pool's taps are nothing but this: the 2x2 / 2 pool of P-net's 10 x 118 x 118 map
 * 20.5 -> 14.9 us through ctypes, 1 thread, minimum of 400, the two builds interleaved). */
ALWAYS_INLINE v8f pool_max(v8f v, v8f acc) {
    v8i m = (v > acc) | (v != v);
    return (v8f)((m & (v8i)v) | (~m & (v8i)acc));
}

/* Pooling: the taps of each output row combined in place (a NaN wins, as with np.maximum). */
ALWAYS_INLINE void pool_item(dw_t *a, int64_t it, const int op) {
    band_t bd;
    float *s = band_scratch(a, it, &bd);
    if (!s) return;
    const int64_t g = bd.g, oh0 = bd.oh0, oh1 = bd.oh1, r0 = bd.r0, nrows = bd.nrows;
    int64_t p1 = (g + 1) * a->group < a->N * a->M ? (g + 1) * a->group : a->N * a->M;
    const int64_t OW = a->OW;
    for (int64_t plane = g * a->group; plane < p1; plane++) {
        float *yp = a->y + plane * a->OH * OW;
        fill(a, a->x + plane * a->H * a->W, s, r0, nrows);
        for (int64_t oh = oh0; oh < oh1; oh++) {
            float *y = yp + oh * OW;
            const float *row = s + (oh - oh0) * a->sh * a->RS;
            memcpy(y, row + a->toff[0], (size_t)OW * sizeof(float));
            for (int64_t t = 1; t < a->taps; t++) {
                const float *src = row + a->toff[t];
                int64_t j = 0;
                if (op == OP_MAX) {
                    for (; j + VL <= OW; j += VL) vstore(y + j, pool_max(vload(src + j), vload(y + j)));
                    for (; j < OW; j++) {
                        float v = src[j], m = y[j];
                        y[j] = (v > m || v != v) ? v : m;
                    }
                } else {
                    for (; j + VL <= OW; j += VL) vstore(y + j, vload(y + j) + vload(src + j));
                    for (; j < OW; j++) y[j] += src[j];
                }
            }
            if (op == OP_AVG) {
                float rr = a->rrow[oh];
                for (int64_t j = 0; j < OW; j++) y[j] *= rr * a->rcol[j];
            }
        }
    }
}

/* Pooling of small planes (OH * OW <= SMALL_PIXELS), eight planes in the lanes of a vector as
 * small_group does for depthwise convolution: MTCNN's 3x3 / 2 max pools of 28 x 22 x 22 maps took
 * ~30 us row by row (pool_item), mostly copying 11-wide rows into its scratch and running one
 * vector and three scalars per tap.  Padding is a->pad (-inf for max, 0 for average); a NaN wins,
 * as with np.maximum; average pools multiply each window's sum by rrow[oh] * rcol[ow]. */
ALWAYS_INLINE void small_pool_group(dw_t *a, float *s, int64_t p0, const int op) {
    const int64_t planes = a->N * a->M, KH = a->KH, KW = a->KW, OH = a->OH, OW = a->OW;
    const int64_t SH = (OH - 1) * a->sh + (KH - 1) * a->dh + 1, SW = (OW - 1) * a->sw + (KW - 1) * a->dw + 1;
    const int lanes = planes - p0 < VL ? (int)(planes - p0) : VL;
    const v8f pad = vsplat(a->pad);
    for (int64_t i = 0; i < SH * SW; i++) vstore(s + i * VL, pad);
    const float *xin[VL];
    for (int l = 0; l < VL; l++) { /* lanes past the last plane read the first plane again, never stored */
        int64_t plane = p0 + (l < lanes ? l : 0), n = plane / a->M, c = (plane % a->M) / a->mult;
        xin[l] = a->x + (n * a->C + c) * a->H * a->W;
    }
    gather_planes(a, xin, s, SH, SW);
    float out[(SMALL_PIXELS + VL) * VL] __attribute__((aligned(32))); /* whole groups of 8 pixels */
    const int64_t rs = SW * VL, hstep = a->dh * rs, wstep = a->dw * VL;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *row = s + oh * a->sh * rs;
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *px = row + ow * a->sw * VL;
            v8f acc = vload(px);
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = kh ? 0 : 1; kw < KW; kw++) {
                    v8f v = vload(px + kh * hstep + kw * wstep);
                    acc = op == OP_MAX ? pool_max(v, acc) : acc + v;
                }
            if (op == OP_AVG) acc *= vsplat(a->rrow[oh] * a->rcol[ow]);
            vstore(out + (oh * OW + ow) * VL, acc);
        }
    }
    store_planes(a, out, p0, lanes, OH * OW);
}

/* Item `it` of the small paths: `group` x 8 planes, a depthwise convolution of T taps (0: any) or a
 * pooling (op). */
ALWAYS_INLINE void small_item(dw_t *a, int64_t it, const int T, const int op) {
    const int64_t SH = (a->OH - 1) * a->sh + (a->KH - 1) * a->dh + 1, SW = (a->OW - 1) * a->sw + (a->KW - 1) * a->dw + 1;
    float *s = opt_scratch((size_t)(SH * SW * VL));
    if (!s) {
        a->failed = 1;
        return;
    }
    int64_t planes = a->N * a->M, p1 = (it + 1) * a->group * VL < planes ? (it + 1) * a->group * VL : planes;
    for (int64_t p0 = it * a->group * VL; p0 < p1; p0 += VL) {
        if (op == OP_CONV)
            small_group(a, s, p0, T);
        else
            small_pool_group(a, s, p0, op);
    }
}

#ifdef HAVE_SHUFFLE
/* 2x2 max pooling with stride 2 and no padding (BlazeFace's, and many detectors'): each output row
 * is the max of two input rows' even and odd columns, read straight from the input, no scratch.
 * Items are (plane group, band) as for the other window ops; only whole windows are read (the
 * caller checks 2 * OH <= H and 2 * OW <= W). */
HOT_CLONES static void item_max_2x2(void *ctx, int64_t it) {
    const dw_t *a = ctx;
    int64_t b = it % a->nbands, g = it / a->nbands, W = a->W, OW = a->OW;
    int64_t oh0 = b * a->band, oh1 = oh0 + a->band < a->OH ? oh0 + a->band : a->OH;
    int64_t p1 = (g + 1) * a->group < a->N * a->M ? (g + 1) * a->group : a->N * a->M;
    for (int64_t plane = g * a->group; plane < p1; plane++) {
        for (int64_t oh = oh0; oh < oh1; oh++) {
            const float *r0 = a->x + (plane * a->H + 2 * oh) * W, *r1 = r0 + W;
            float *y = a->y + (plane * a->OH + oh) * OW;
            int64_t j = 0;
            for (; j + VL <= OW; j += VL) {
                v8f top = pool_max(vload_even(r0 + 2 * j), vload_odd(r0 + 2 * j));
                v8f bottom = pool_max(vload_even(r1 + 2 * j), vload_odd(r1 + 2 * j));
                vstore(y + j, pool_max(top, bottom));
            }
            for (; j < OW; j++) {
                float m = r0[2 * j];
                const float v[3] = {r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
                for (int i = 0; i < 3; i++) m = (v[i] > m || v[i] != v[i]) ? v[i] : m;
                y[j] = m;
            }
        }
    }
}
#endif

/* Max pooling at column stride 1 or 2, read straight from the input: a max is separable, so each
 * output row is the max of its window's input rows (vectors along the row, into a row buffer
 * padded with -inf on both sides), then of that row's KW taps at the column stride (stride 2: the
 * even lanes of 16 floats).  No scratch of planes, no transposes.  The old and new library's C
 * function interleaved in one process (ctypes, ~3.5 us of it the call; 1 thread, minimum of 400):
 * 3x3 / 2 over 28 x 22 x 22 (MTCNN R-net) 11.6 -> 9.7 us, 32 x 46 x 46 (O-net) 53.6 -> 20.2,
 * 64 x 56 x 56 120 -> 47, 3x3 / 1 over 16 x 64 x 64 85.6 -> 28.0. */
ALWAYS_INLINE void direct_max(const dw_t *a, int64_t it, const int64_t sw) {
    const int64_t H = a->H, W = a->W, OH = a->OH, OW = a->OW, KW = a->KW, dw = a->dw, pl = a->pl;
    const int64_t b = it % a->nbands, g = it / a->nbands;
    const int64_t oh0 = b * a->band, oh1 = oh0 + a->band < OH ? oh0 + a->band : OH;
    const int64_t p1 = (g + 1) * a->group < a->N * a->M ? (g + 1) * a->group : a->N * a->M;
    const int64_t OWv = (OW + VL - 1) / VL * VL, reach = (OWv - 1) * sw + (KW - 1) * dw + 2 * VL;
    const int64_t Wv = (W + VL - 1) / VL * VL, BW = (pl + Wv > reach ? pl + Wv : reach) + VL;
    float *buf = opt_scratch((size_t)BW);
    if (!buf) {
        ((dw_t *)a)->failed = 1;
        return;
    }
    const v8f lowest = vsplat(-INFINITY);
    for (int64_t i = 0; i < BW; i++) buf[i] = -INFINITY; /* only mid[0, W) is written below */
    float *mid = buf + pl;
    for (int64_t plane = g * a->group; plane < p1; plane++) {
        const float *xp = a->x + plane * H * W;
        float *yp = a->y + plane * OH * OW;
        for (int64_t oh = oh0; oh < oh1; oh++) {
            int rows = 0;
            for (int64_t kh = 0; kh < a->KH; kh++) {
                const int64_t ih = oh * a->sh - a->pt + kh * a->dh;
                if (ih < 0 || ih >= H) continue;
                /* whole vectors, past the row's end while that stays inside x (the lanes past W
                 * are set back to -inf below); the input's last row ends in scalars */
                const float *r = xp + ih * W;
                const int64_t whole = r + Wv <= a->xend ? Wv : W / VL * VL;
                int64_t j = 0;
                if (rows++ == 0) {
                    for (; j < whole; j += VL) vstore(mid + j, vload(r + j));
                    for (; j < W; j++) mid[j] = r[j];
                } else {
                    for (; j < whole; j += VL) vstore(mid + j, pool_max(vload(r + j), vload(mid + j)));
                    for (; j < W; j++) mid[j] = (r[j] > mid[j] || r[j] != r[j]) ? r[j] : mid[j];
                }
            }
            if (rows == 0) /* a window of padding rows only (dilated windows): -inf, as the padded input */
                for (int64_t j = 0; j < W; j++) mid[j] = -INFINITY;
            vstore(mid + W, lowest); /* the right padding again, where whole vectors ran past W */
            float *y = yp + oh * OW;
            for (int64_t j = 0; j < OW; j += VL) {
                v8f acc = lowest;
                for (int64_t kw = 0; kw < KW; kw++) {
                    const float *src = buf + j * sw + kw * dw;
#ifdef HAVE_SHUFFLE
                    v8f v = sw == 1 ? vload(src) : vload_even(src);
#else
                    v8f v;
                    for (int l = 0; l < VL; l++) v[l] = src[l * sw];
#endif
                    acc = pool_max(v, acc);
                }
                if (j + VL <= OW || oh + 1 < oh1) /* past OW: the next row of this item, written after */
                    vstore(y + j, acc);
                else
                    vstore_part(y + j, acc, (int)(OW - j));
            }
        }
    }
}

HOT_CLONES static void item_max_direct1(void *ctx, int64_t it) { direct_max(ctx, it, 1); }
HOT_CLONES static void item_max_direct2(void *ctx, int64_t it) { direct_max(ctx, it, 2); }
HOT_CLONES static void item_max(void *ctx, int64_t it) { pool_item(ctx, it, OP_MAX); }
HOT_CLONES static void small_max(void *ctx, int64_t it) { small_item(ctx, it, 0, OP_MAX); }
HOT_CLONES static void small_avg(void *ctx, int64_t it) { small_item(ctx, it, 0, OP_AVG); }
HOT_CLONES static void item_avg(void *ctx, int64_t it) { pool_item(ctx, it, OP_AVG); }
HOT_CLONES static void item_3x3(void *ctx, int64_t it) { item(ctx, it, 9); }
HOT_CLONES static void item_5x5(void *ctx, int64_t it) { item(ctx, it, 25); }
HOT_CLONES static void item_any(void *ctx, int64_t it) { item(ctx, it, (int)((dw_t *)ctx)->taps); }
HOT_CLONES static void small_3x3(void *ctx, int64_t it) { small_item(ctx, it, 9, OP_CONV); }
HOT_CLONES static void small_5x5(void *ctx, int64_t it) { small_item(ctx, it, 25, OP_CONV); }
HOT_CLONES static void small_any(void *ctx, int64_t it) { small_item(ctx, it, 0, OP_CONV); }

#define SCRATCH_BYTES (32 * 1024) /* an item's scratch should stay in L1/L2 */

/* Geometry from the 15 values (see optcli_native.h), scratch layout, tap offsets and the split
 * into items; then the items on the pool.  Returns 0, OPT_EINVAL or OPT_ENOMEM. */
static int run_window(dw_t *a, const int64_t *g, opt_item_fn (*pick)(const dw_t *)) {
    a->N = g[0], a->C = g[1], a->H = g[2], a->W = g[3], a->M = g[4], a->KH = g[5], a->KW = g[6];
    a->xend = a->x + a->N * a->C * a->H * a->W;
    a->sh = g[7], a->sw = g[8], a->dh = g[9], a->dw = g[10], a->pt = g[11], a->pl = g[12];
    a->OH = g[13], a->OW = g[14];
    if (a->N < 0 || a->C < 1 || a->H < 0 || a->W < 0 || a->M < 1 || a->M % a->C || a->KH < 1 || a->KW < 1 ||
        a->sh < 1 || a->sw < 1 || a->dh < 1 || a->dw < 1 || a->OH < 0 || a->OW < 0 || a->act < 0 ||
        a->act >= ACT_COUNT || a->KH * a->KW > (1 << 20) || a->sw > 4096)
        return OPT_EINVAL;
    if (a->N == 0 || a->OH == 0 || a->OW == 0) return 0;
    a->mult = a->M / a->C;
    a->taps = a->KH * a->KW;
    a->OWv = (a->OW + VL - 1) / VL * VL;
    a->PW = a->OWv + (a->KW - 1) * a->dw / a->sw;
    a->RS = a->sw * a->PW;
    int64_t *toff = malloc((size_t)(a->taps + 2 * a->sw) * sizeof(int64_t));
    if (!toff) return OPT_ENOMEM;
    int64_t *span = toff + a->taps;
    for (int64_t p = 0; p < a->sw; p++) {
        span[2 * p] = clamp64(ceil_div(a->pl - p, a->sw), 0, a->PW);
        span[2 * p + 1] = clamp64(floor_div(a->W - 1 - p + a->pl, a->sw) + 1, span[2 * p], a->PW);
    }
    a->span = span;
    for (int64_t kh = 0; kh < a->KH; kh++)
        for (int64_t kw = 0; kw < a->KW; kw++)
            toff[kh * a->KW + kw] = kh * a->dh * a->RS + (kw * a->dw % a->sw) * a->PW + kw * a->dw / a->sw;
    a->toff = toff;

    /* Bands: enough rows to amortise the halo, few enough for the scratch to stay in cache,
     * and enough items for every thread when there are few planes (one channel, a huge image). */
    int64_t threads = optcli_get_num_threads(), planes = a->N * a->M;
    int64_t in_rows = SCRATCH_BYTES / (a->RS * (int64_t)sizeof(float));
    int64_t band = (in_rows - (a->KH - 1) * a->dh - 1) / a->sh + 1;
    band = band < 4 ? 4 : band / 4 * 4;
    if (band > a->OH) band = a->OH;
    int64_t nbands = (a->OH + band - 1) / band;
    if (planes * nbands < 4 * threads) {
        nbands = (4 * threads + planes - 1) / planes;
        if (nbands > a->OH) nbands = a->OH;
        band = (a->OH + nbands - 1) / nbands;
        nbands = (a->OH + band - 1) / band;
    }
    a->band = band, a->nbands = nbands;
    /* Several small planes per item (the 7x7 layers) so an item is worth taking. */
    int64_t work = a->OH * a->OW * a->taps;
    int64_t group = work >= 16384 || nbands > 1 ? 1 : 16384 / (work ? work : 1);
    int64_t most = planes / (8 * threads);
    if (group > most) group = most;
    a->group = group < 1 ? 1 : group;
    a->ngroups = (planes + a->group - 1) / a->group;

    opt_item_fn fn = pick(a);
    int64_t nitems = a->ngroups * a->nbands;
    if (fn == small_3x3 || fn == small_5x5 || fn == small_any || fn == small_max || fn == small_avg) {
        /* items of `group` x 8 planes */
        int64_t octets = (planes + VL - 1) / VL, per = octets / (4 * threads);
        a->group = per < 1 ? 1 : per;
        nitems = (octets + a->group - 1) / a->group;
    }
    /* a tiny window op runs on the caller alone: waking a worker would cost more */
    int64_t macs = planes * a->OH * a->OW * a->taps;
    opt_parallel(fn, a, nitems, macs < (1 << 15) ? 1 : 0);
    free(toff);
    return a->failed ? OPT_ENOMEM : 0;
}

static opt_item_fn pick_conv(const dw_t *a) {
    int small = a->OH * a->OW <= SMALL_PIXELS && a->taps <= 1024;
    if (a->taps == 9 && a->KW == 3) return small ? small_3x3 : item_3x3;
    if (a->taps == 25 && a->KW == 5) return small ? small_5x5 : item_5x5;
    return small ? small_any : item_any;
}

static opt_item_fn pick_pool(const dw_t *a) {
#ifdef HAVE_SHUFFLE
    if (a->op == OP_MAX && a->KH == 2 && a->KW == 2 && a->sh == 2 && a->sw == 2 && a->dh == 1 && a->dw == 1 &&
        a->pt == 0 && a->pl == 0 && 2 * a->OH <= a->H && 2 * a->OW <= a->W)
        return item_max_2x2;
#endif
    /* rows of a vector or more read straight (direct_max); shorter ones of small planes, eight planes
     * a vector (48 planes of 4 x 4 outputs: 6.1 us through ctypes, 7.4 row by row) */
    if (a->op == OP_MAX && (a->sw == 1 || a->sw == 2) && (a->OW >= VL || a->OH * a->OW > SMALL_PIXELS))
        return a->sw == 1 ? item_max_direct1 : item_max_direct2;
    if (a->OH * a->OW <= SMALL_PIXELS)
        return a->op == OP_MAX ? small_max : small_avg;
    return a->op == OP_MAX ? item_max : item_avg;
}

OPT_API int optcli_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y,
                                const int64_t *g, int act, float alpha, float beta) {
    dw_t a = {.x = x, .w = w, .bias = bias, .y = y, .act = act, .alpha = alpha, .beta = beta, .op = OP_CONV};
    return run_window(&a, g, pick_conv);
}

OPT_API int optcli_pool2d_f32(const float *x, float *y, const int64_t *g, int op, const float *rrow,
                              const float *rcol) {
    if ((op != OP_MAX && op != OP_AVG) || (op == OP_AVG && (!rrow || !rcol)) || g[1] != g[4]) return OPT_EINVAL;
    dw_t a = {.x = x, .y = y, .op = op, .pad = op == OP_MAX ? -INFINITY : 0.0f, .rrow = rrow, .rcol = rcol};
    return run_window(&a, g, pick_pool);
}
