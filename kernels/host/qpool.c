/* MaxPool on 8-bit NCHW tensors (u8, or s8 read with its top bit flipped, which keeps the order): the
 * integer plan's pools (optcli/passes/fuse_qdq_movement.py), which numpy took 4x the float kernel's time
 * for (a ResNet stem's 3x3 stride-2 pool: a ufunc pass per tap over strided views).
 *
 * Separable, and written so the loops vectorise in the portable C: per output row, the max over the
 * window's rows of each input column (contiguous bytes), into a row buffer that also holds the padding
 * columns at the dtype's lowest value (they never win, as the float pool's -inf); then, for a stride s,
 * that row split into its s column phases, so each tap of the horizontal max reads one phase
 * contiguously at a fixed offset.  A window that lies wholly in padding (only ceil_mode makes one)
 * gives the lowest value, as quantizing the float pool's -inf does.  Exact: a max of bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "simd.h"

#define QPOOL_MAX_STRIDE 8

typedef struct {
    const uint8_t *x;
    uint8_t *y;
    int64_t H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
    int64_t L, phase_len; /* the padded row's length, each column phase's */
    uint8_t flip;         /* 0x80 for s8 */
    _Atomic int failed;
} qpool_t;

/* The row buffer split into its s column phases: dst[ph * n + j] = buf[j * s + ph] (buf holds s * n bytes). */
HOT_CLONES static void split_phases(const uint8_t *restrict buf, uint8_t *restrict dst, int64_t s, int64_t n) {
    if (s == 2) { /* the common stride, as a constant: the loop vectorises */
        for (int64_t j = 0; j < n; j++) {
            dst[j] = buf[2 * j];
            dst[n + j] = buf[2 * j + 1];
        }
        return;
    }
    for (int64_t ph = 0; ph < s; ph++)
        for (int64_t j = 0; j < n; j++) dst[ph * n + j] = buf[j * s + ph];
}

HOT_CLONES static void plane_item(void *ctx, int64_t i) {
    qpool_t *p = ctx;
    const int64_t s = p->sw, n = p->phase_len, L = s * n, OW = p->OW, W = p->W, pl = p->pl;
    const int64_t H = p->H, OH = p->OH, KH = p->KH, KW = p->KW, sh = p->sh, dh = p->dh, dw = p->dw, pt = p->pt;
    uint8_t *buf = (uint8_t *)opt_scratch((size_t)(2 * L + 3) / 4); /* (counted in floats) */
    if (!buf) {
        p->failed = 1;
        return;
    }
    uint8_t *restrict phase = buf + L; /* [s][n] */
    const uint8_t *x = p->x + i * H * W;
    uint8_t *restrict y = p->y + i * OH * OW;
    const uint8_t flip = p->flip;
    const int64_t lo_col = pl, hi_col = pl + W < L ? pl + W : L; /* real columns in buf */
    for (int64_t oh = 0; oh < OH; oh++) {
        memset(buf, 0, (size_t)L); /* flipped, 0 is the lowest value of both dtypes */
        for (int64_t kh = 0; kh < KH; kh++) {
            const int64_t ih = oh * sh - pt + kh * dh;
            if (ih < 0 || ih >= H) continue;
            const uint8_t *restrict row = x + ih * W - pl;
            uint8_t *restrict b = buf;
            for (int64_t c = lo_col; c < hi_col; c++) {
                const uint8_t v = (uint8_t)(row[c] ^ flip);
                b[c] = b[c] > v ? b[c] : v;
            }
        }
        const uint8_t *src0 = buf;
        if (s > 1) {
            split_phases(buf, phase, s, n);
            src0 = phase;
        }
        uint8_t *restrict out = y + oh * OW;
        memcpy(out, src0, (size_t)OW); /* tap 0: phase 0 at offset 0 */
        for (int64_t kw = 1; kw < KW; kw++) {
            const int64_t t = kw * dw; /* column of output j's tap: j * s + t = (j + t / s) * s + t % s */
            const uint8_t *restrict src = src0 + (t % s) * n + t / s;
            for (int64_t j = 0; j < OW; j++) out[j] = out[j] > src[j] ? out[j] : src[j];
        }
        if (flip)
            for (int64_t j = 0; j < OW; j++) out[j] ^= flip;
    }
}

/* geom: N, C, H, W, KH, KW, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW; is_signed: s8. */
OPT_API int optcli_maxpool2d_q8(const uint8_t *x, uint8_t *y, const int64_t *geom, int is_signed) {
    if (!x || !y || !geom) return OPT_EINVAL;
    qpool_t p = {.x = x, .y = y, .flip = is_signed ? 0x80 : 0};
    const int64_t N = geom[0], C = geom[1];
    int64_t *f[12] = {&p.H, &p.W, &p.KH, &p.KW, &p.sh, &p.sw, &p.dh, &p.dw, &p.pt, &p.pl, &p.OH, &p.OW};
    for (int i = 0; i < 12; i++) *f[i] = geom[2 + i];
    if (N < 0 || C < 0 || p.H < 1 || p.W < 1 || p.KH < 1 || p.KW < 1 || p.sh < 1 || p.sw < 1 ||
        p.sw > QPOOL_MAX_STRIDE || p.dh < 1 || p.dw < 1 || p.pt < 0 || p.pl < 0 || p.OH < 0 || p.OW < 0 ||
        p.KH > 1024 || p.KW > 1024 || p.dh > 1024 || p.dw > 1024 || p.pt > 1024 || p.pl > 1024 || p.W > (1 << 24))
        return OPT_EINVAL;
    if (N == 0 || C == 0 || p.OH == 0 || p.OW == 0) return 0;
    /* every output's window starts within reach of the input (an output past it would be all padding for
     * no reason: the shape the caller derived is wrong) */
    if ((p.OH - 1) * p.sh - p.pt >= p.H || (p.OW - 1) * p.sw - p.pl >= p.W) return OPT_EINVAL;
    p.L = (p.OW - 1) * p.sw + (p.KW - 1) * p.dw + 1;
    p.phase_len = (p.L + p.sw - 1) / p.sw;
    opt_parallel(plane_item, &p, N * C, N * C * p.OH * p.OW * p.KH * p.KW < (1 << 16));
    return p.failed ? OPT_ENOMEM : 0;
}
