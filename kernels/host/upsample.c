/* Upsampling by whole factors, NCHW fp32, on the pool: output pixel (i * KH + a, j * KW + b) of
 * plane p is tap (a, b) of input pixel (i, j), plus the plane's bias, through the fused activation.
 * Two ops are exactly this:
 * - a nearest Resize by integer factors: every tap is the input
 *   itself (tap stride 0), so each output row is made once and its KH - 1 copies are memcpys;
 * - a ConvTranspose whose taps never overlap (stride = kernel, no dilation: a 2x2 / 2 upsampling
 *   head), after its GEMM: the GEMM's columns [N, M, KH, KW, H, W] hold the taps, H * W apart.
 * optcli routes only the second here: numpy wrote it through strided views, one pass per tap with
 * an inner stride of KW floats, then a pass each for the bias and the activation (an FPN head's
 * 16 -> 16 2x2 / 2 at 80x80: 575 us against 359 here, 1 thread).  A nearest Resize measured no
 * faster here than numpy's two copies, so Resize keeps those; the geometry stays tested (tap stride
 * 0, the aarch64 driver's cases).  Each output row is written once, in order; with KW = 2 the two
 * taps' rows are interleaved in registers. */
#include "optcli_native.h"
#include "simd.h"

#define UP_ITEM_FLOATS 16384 /* output floats per work item: 64 KiB */

typedef struct {
    const float *src, *bias;
    float *y;
    int64_t planes, channels, H, W, KH, KW, ps, ts; /* bias of plane p: bias[p % channels] */
    int64_t rows;  /* input rows per work item */
    int64_t bands; /* work items per plane */
    int act;
    float alpha, beta;
} up_t;

/* One output row from the KW tap rows t (tap b's row at t + b * ts), plus bias. */
ALWAYS_INLINE void interleave_row(const up_t *a, const float *t, float *yr, float bias) {
    const int64_t W = a->W, KW = a->KW, ts = a->ts;
    int64_t j = 0;
    if (KW == 1) {
        for (; j + VL <= W; j += VL) vstore(yr + j, vload(t + j) + bias);
        for (; j < W; j++) yr[j] = t[j] + bias;
        return;
    }
#ifdef HAVE_SHUFFLE
    if (KW == 2) {
        const float *t1 = t + ts;
        for (; j + VL <= W; j += VL) {
            v8f v0 = vload(t + j) + bias, v1 = vload(t1 + j) + bias;
            vstore(yr + 2 * j, __builtin_shufflevector(v0, v1, 0, 8, 1, 9, 2, 10, 3, 11));
            vstore(yr + 2 * j + VL, __builtin_shufflevector(v0, v1, 4, 12, 5, 13, 6, 14, 7, 15));
        }
    }
#endif
    for (; j < W; j++)
        for (int64_t b = 0; b < KW; b++) yr[j * KW + b] = t[b * ts + j] + bias;
}

HOT_CLONES static void up_item(void *ctx, int64_t it) {
    const up_t *a = ctx;
    const int64_t p = it / a->bands, i0 = (it % a->bands) * a->rows;
    const int64_t i1 = i0 + a->rows < a->H ? i0 + a->rows : a->H, OW = a->W * a->KW;
    const float bias = a->bias ? a->bias[p % a->channels] : 0.0f;
    const float *plane = a->src + p * a->ps;
    float *yp = a->y + p * a->H * a->KH * OW;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t r = 0; r < a->KH; r++) {
            float *yr = yp + (i * a->KH + r) * OW;
            if (r && !a->ts) { /* a nearest upsample: the row just made, again */
                memcpy(yr, yr - OW, (size_t)OW * sizeof(float));
                continue;
            }
            interleave_row(a, plane + r * a->KW * a->ts + i * a->W, yr, bias);
            act_span(yr, OW, a->act, a->alpha, a->beta);
        }
}

/* g = planes, channels, H, W, KH, KW, plane stride, tap stride (in floats, of src); y is
 * [planes, H * KH, W * KW]; bias [channels] or NULL.  Returns 0 or OPT_EINVAL. */
OPT_API int optcli_upsample_taps_f32(const float *src, const float *bias, float *y, const int64_t *g, int act,
                                     float alpha, float beta) {
    up_t a = {.src = src, .bias = bias, .y = y, .planes = g[0], .channels = g[1], .H = g[2], .W = g[3], .KH = g[4],
              .KW = g[5], .ps = g[6], .ts = g[7], .act = act, .alpha = alpha, .beta = beta};
    if (a.planes < 0 || a.channels < 1 || a.H < 0 || a.W < 0 || a.KH < 1 || a.KW < 1 || a.ps < 0 || a.ts < 0 ||
        act < 0 || act >= ACT_COUNT)
        return OPT_EINVAL;
    if (!a.planes || !a.H || !a.W) return 0;
    const int64_t row_floats = a.KH * a.W * a.KW; /* the output of one input row */
    a.rows = row_floats >= UP_ITEM_FLOATS ? 1 : UP_ITEM_FLOATS / row_floats;
    a.bands = (a.H + a.rows - 1) / a.rows;
    /* below 128 KiB of output one thread: waking a worker costs more than it saves */
    opt_parallel(up_item, &a, a.planes * a.bands, a.planes * a.H * row_floats < (1 << 15) ? 1 : 0);
    return 0;
}
