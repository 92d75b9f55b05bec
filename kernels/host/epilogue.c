/* Per-channel epilogues in one pass: y = act(x * scale[c] + shift[c]) over [N, C, HW].
 * The GEMM convs (1x1, im2col, ConvTranspose) finish with it in place (no scale, the bias as the
 * shift) instead of numpy's pass per operation; a stand-alone BatchNormalization (ChannelAffine)
 * is the same map with a scale. */
#include "optcli_native.h"
#include "simd.h"

typedef struct {
    const float *x;
    float *y;
    const float *scale, *shift;
    int64_t c, hw, group;
    int act;
    float alpha, beta;
} ep_t;

#define CHUNK 512 /* floats per affine-then-activation step: the activation reads them from L1 */

ALWAYS_INLINE void plane(const ep_t *a, int64_t p) {
    const float *x = a->x + p * a->hw;
    float *y = a->y + p * a->hw;
    int64_t ch = p % a->c;
    v8f vs = vsplat(a->scale ? a->scale[ch] : 1.0f);
    v8f vb = vsplat(a->shift ? a->shift[ch] : 0.0f);
    for (int64_t c0 = 0; c0 < a->hw; c0 += CHUNK) {
        int64_t c1 = c0 + CHUNK < a->hw ? c0 + CHUNK : a->hw, i = c0;
        if (a->scale) {
            for (; i + VL <= c1; i += VL) vstore(y + i, vload(x + i) * vs + vb);
        } else {
            for (; i + VL <= c1; i += VL) vstore(y + i, vload(x + i) + vb);
        }
        if (i < c1) {
            float tmp[VL] = {0};
            int left = (int)(c1 - i);
            copy_short(tmp, x + i, left);
            vstore_part(y + i, a->scale ? vload(tmp) * vs + vb : vload(tmp) + vb, left);
        }
        act_span(y + c0, c1 - c0, a->act, a->alpha, a->beta);
    }
}

HOT_CLONES static void ep_item(void *ctx, int64_t it) {
    const ep_t *a = ctx;
    for (int64_t p = it * a->group, end = p + a->group; p < end; p++) plane(a, p);
}

OPT_API int optcli_channel_affine_f32(const float *x, float *y, const float *scale, const float *shift, int64_t n,
                                      int64_t c, int64_t hw, int act, float alpha, float beta) {
    if (n < 0 || c < 1 || hw < 0 || act < 0 || act >= ACT_COUNT) return OPT_EINVAL;
    if (n == 0 || hw == 0) return 0;
    int64_t planes = n * c;
    /* about 8 KiB of output per item: small enough to balance, big enough to be worth a take */
    ep_t a = {.x = x, .y = y, .scale = scale, .shift = shift, .c = c, .hw = hw, .act = act, .alpha = alpha,
              .beta = beta};
    a.group = hw >= 2048 ? 1 : 2048 / hw;
    int64_t whole = planes / a.group;
    /* below 256 KiB of output, waking a worker costs more than it saves */
    opt_parallel(ep_item, &a, whole, planes * hw < (1 << 16) ? 1 : 0);
    for (int64_t p = whole * a.group; p < planes; p++) plane(&a, p); /* the last, partial group */
    return 0;
}

/* PRelu with a slope per channel: y = x >= 0 ? x : x * slope[...] over x laid out [N, C, HW, lanes],
 * slope [C * lanes] (lanes 1: NCHW, one slope per plane; lanes B: the blocked layout, a slope per
 * block and lane; C 1, HW rows and lanes N: a FullyConnected's [rows, N] with a slope per column).
 * Face detectors (MTCNN, BlazeFace) put one after every conv and dense layer of small maps, where
 * numpy's product and max took 5-11 us a step for a few KB.  A NaN x stays NaN; -0 stays -0. */
typedef struct {
    const float *x;
    float *y;
    const float *slope;
    int64_t c, hw, lanes, group;
} pr_t;

/* x >= 0 ? x : x * s, 4 lanes (a NaN x: x * s, NaN) */
ALWAYS_INLINE v4f prelu4(v4f v, v4f s) { return sel4(v >= splat4(0.0f), v, v * s); }

ALWAYS_INLINE void prelu_plane(const pr_t *a, int64_t p) {
    int64_t size = a->hw * a->lanes;
    const float *x = a->x + p * size, *s = a->slope + p % a->c * a->lanes;
    float *y = a->y + p * size;
    if (a->lanes == 1) {
        v4f k = splat4(s[0]);
        int64_t i = 0;
        for (; i + 8 <= size; i += 8) {
            v4f h0, h1;
            memcpy(&h0, x + i, sizeof h0);
            memcpy(&h1, x + i + 4, sizeof h1);
            h0 = prelu4(h0, k);
            h1 = prelu4(h1, k);
            memcpy(y + i, &h0, sizeof h0);
            memcpy(y + i + 4, &h1, sizeof h1);
        }
        for (; i < size; i++) y[i] = x[i] >= 0.0f ? x[i] : x[i] * s[0];
        return;
    }
    int64_t full = a->lanes / 4 * 4;
    for (int64_t j = 0; j < size; j += a->lanes) {
        int64_t l = 0;
        for (; l < full; l += 4) {
            v4f h, k;
            memcpy(&h, x + j + l, sizeof h);
            memcpy(&k, s + l, sizeof k);
            h = prelu4(h, k);
            memcpy(y + j + l, &h, sizeof h);
        }
        for (; l < a->lanes; l++) y[j + l] = x[j + l] >= 0.0f ? x[j + l] : x[j + l] * s[l];
    }
}

HOT_CLONES static void prelu_item(void *ctx, int64_t it) {
    const pr_t *a = ctx;
    for (int64_t p = it * a->group, end = p + a->group; p < end; p++) prelu_plane(a, p);
}

OPT_API int optcli_channel_prelu_f32(const float *x, float *y, const float *slope, int64_t n, int64_t c, int64_t hw,
                                     int64_t lanes) {
    if (n < 0 || c < 1 || hw < 0 || lanes < 1) return OPT_EINVAL;
    if (n == 0 || hw == 0) return 0;
    int64_t planes = n * c, size = hw * lanes;
    pr_t a = {.x = x, .y = y, .slope = slope, .c = c, .hw = hw, .lanes = lanes};
    a.group = size >= 2048 ? 1 : 2048 / size; /* as optcli_channel_affine_f32's items */
    int64_t whole = planes / a.group;
    opt_parallel(prelu_item, &a, whole, planes * size < (1 << 16) ? 1 : 0);
    for (int64_t p = whole * a.group; p < planes; p++) prelu_plane(&a, p);
    return 0;
}

OPT_API int optcli_native_abi(void) { return OPTCLI_NATIVE_ABI; }
