/* Test driver for the native kernels, built for another architecture (aarch64) and run under
 * qemu-user by tests/native/test_aarch64.py.
 *
 * usage: driver THREADS CASE OUT [CASE OUT ...]
 * A case file is int64 header[20] then float32 arrays:
 *   header[0] = kind (0: depthwise conv, 1: channel affine, 2: pooling, 3: GEMM conv, 4: activation,
 *   5: layer norm), [1] = act (pooling: 1 max, 2 average), [2] = has bias (shift),
 *   [3..17] = geometry (depthwise and pooling: the 15 values of optcli_dwconv2d_f32; affine: n, c, hw,
 *   has scale; GEMM: batch, m, k, n, has residual, transposed (W.T's panels packed, then the
 *   transposed product of small planes); activation: n; layer norm: outer, c, inner),
 *   [18..19] = alpha (layer norm: eps), beta as float32 bit patterns;
 *   then x, w (depthwise) or scale (affine, if any; layer norm) or 1/counts per row and column
 *   (average), bias; GEMM: w, x, residual (if any), bias.
 * Kind 6 (row mean): geometry = rows, n; array x.
 * Kind 9 (sum with an activation): geometry = n; arrays x, b.
 * Kind 7 (implicit GEMM conv): geometry = the 13 values of optcli_conv2d_gemm_f32 and has residual;
 * arrays w, the padded input, residual (if any), bias.
 * Kind 8 (stem conv): geometry = the 15 values of optcli_stem_conv2d_f32; arrays x, w [M, C, KH, KW], bias.
 * Kind 17 (grouped stem conv): as kind 8, then after the header int64 groups; w is [M, C / groups, KH, KW].
 * Kind 18 (upsample.c): geometry = the 8 values of optcli_upsample_taps_f32 (planes, channels, H, W, KH,
 * KW, plane stride, tap stride); arrays src [planes * plane stride], bias [channels].
 * Kind 19 (few-row fully connected, fc_rows.c): geometry = rows, k, n; arrays x [rows, k], w [k, n], bias [n].
 * Kind 21 (recurrent.c, an LSTM in its quantized-h mode): geometry = dirs, seq, batch, hidden, direction and
 * the f, g, h activation codes; arrays xp [dirs, seq, batch, 4H], rt [dirs, H, 4H], qscale [dirs, 4H];
 * OUT: y, y_h, y_c.
 * Kinds 12-14, the channel-blocked layout (blocked_window.c): geometry = the 15 values of
 * optcli_dwconv2d_blocked_f32 (N, Cb, H, W, KH, KW, strides, dilations, pad_top, pad_left, OH, OW, B).
 * 12 (depthwise): arrays x [N, Cb, H, W, B], packed w [Cb, KH, KW, B], bias [Cb * B];
 * 13 (pooling, act 1 max, 2 average): arrays x, then 1/counts per row and column (average);
 * 14 (global average): geometry N, Cb, H * W, B; array x.
 * Kind 10 (blocked_conv.c's conversions): geometry n, c, hw, b, direction (0: to blocked, 1: from); array x.
 * Kind 11 (blocked conv): geometry = the first 15 values of optcli_conv2d_blocked_f32, then after the
 * header int64 ib, B, has residual, groups; arrays x (blocked, or plain where ib = 1), packed w, residual, bias.
 * Kinds 15 and 16, the integer kernels: after the header, int64 e[24].  15 (qgemm.c): e = the 16 values of
 * optcli_qconv2d_gemm's geom, its 6 qp values, the kernel (0 GEMM, 1 depthwise, 2 pointwise, 3 dense), the
 * weights' size in bytes; then bytes x, the weights (int32 pairs, int8 for depthwise, pack_quads' blob for
 * pointwise and dense),
 * int32 bias [M] (if any), float32 multipliers [M].  16
 * (qelementwise.c): e = n, a signed, b signed, y signed; then float32 params[5], bytes a [n], b [n].  Their
 * u8 / s8 outputs are written as float32 values.  Kind 22 (qpool.c's 8-bit MaxPool): e = the 14 geometry values
 * of optcli_maxpool2d_q8 and its signed flag; then bytes x.
 * Kind 23 (optcli_lookup_u8): e = n, the table signed; then bytes
 * table [256], x [n].  24 (optcli_qmul_rows): e = rows, inner, x_zp, g_zp, y_zp, x signed, g signed, y signed;
 * then float32 params[3], bytes x [rows * inner], g [rows].  25 (optcli_qgap_rows): e = rows, inner, x_zp, y_zp,
 * x signed, y signed; then float32 params[3], bytes x [rows * inner].  Kind 26: no arrays; OUT holds the integer
 * kernels' dot-product path (optcli_qgemm_variant(-1): 6 where the CPU has the dot product, else 1).
 * Kind 27 (optcli_qmatmul_rows, qmatmul.c): e = R, K, M, split, its 6 qp values, the packed weights' bytes, the
 * aux blob's int32 count; then bytes x [R * K], the weights, int32 aux, float32 multipliers [M].
 * OUT receives the output as float32 (layer norm: y, then mean and 1 / std).  Exit status 0 when
 * every kernel returned 0.  OPTCLI_LANES=4|8|16 in the environment forces that vector width (see
 * optcli_gemm_variant), for runs on the host under a sanitizer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"

static float *read_floats(FILE *f, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p || fread(p, sizeof(float), (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "short read (%lld floats)\n", (long long)n);
        exit(3);
    }
    return p;
}

static void *read_bytes(FILE *f, int64_t n) {
    void *p = malloc((size_t)(n > 0 ? n : 1));
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "short read (%lld bytes)\n", (long long)n);
        exit(3);
    }
    return p;
}

/* The integer kernels' u8 / s8 output as float32 values (what OUT holds). */
static float *bytes_to_floats(const uint8_t *q, int64_t n, int is_signed) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) y[i] = is_signed ? (float)(int8_t)q[i] : (float)q[i];
    return y;
}

static int run_int8_case(FILE *f, int64_t kind, int has_bias, float **y, int64_t *ny) {
    int64_t e[24];
    if (fread(e, sizeof(int64_t), 24, f) != 24) { fprintf(stderr, "short int8 header\n"); return 3; }
    int rc;
    uint8_t *yq;
    if (kind == 15) {
        const int32_t qp[6] = {(int32_t)e[16], (int32_t)e[17], (int32_t)e[18], (int32_t)e[19], (int32_t)e[20],
                               (int32_t)e[21]};
        const int64_t M = e[4];
        uint8_t *x = read_bytes(f, e[0] * e[1] * e[2] * e[3]);
        void *w = read_bytes(f, e[23]);
        int32_t *b = has_bias ? read_bytes(f, M * 4) : NULL;
        float *mult = read_floats(f, M);
        *ny = e[0] * M * e[13] * e[14];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = e[22] == 3   ? optcli_qconv2d_dense(x, w, b, mult, yq, e, qp)
             : e[22] == 2 ? optcli_qconv2d_pointwise(x, w, b, mult, yq, e, qp)
             : e[22] ? optcli_qconv2d_depthwise(x, w, b, mult, yq, e, qp)
                     : optcli_qconv2d_gemm(x, w, b, mult, yq, e, qp);
        *y = bytes_to_floats(yq, *ny, qp[5]);
        free(x), free(w), free(b), free(mult);
    } else if (kind == 27) {
        const int32_t qp[6] = {(int32_t)e[4], (int32_t)e[5], (int32_t)e[6], (int32_t)e[7], (int32_t)e[8],
                               (int32_t)e[9]};
        uint8_t *x = read_bytes(f, e[0] * e[1]);
        void *w = read_bytes(f, e[10]);
        int32_t *aux = read_bytes(f, e[11] * 4);
        float *mult = read_floats(f, e[2]);
        *ny = e[0] * e[2];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = optcli_qmatmul_rows(x, w, aux, mult, yq, e, qp);
        *y = bytes_to_floats(yq, *ny, qp[5]);
        free(x), free(w), free(aux), free(mult);
    } else if (kind == 26) { /* the integer kernels' dot-product path in use (optcli_qgemm_variant) */
        *ny = 1;
        *y = malloc(sizeof(float));
        (*y)[0] = (float)optcli_qgemm_variant(-1);
        return 0;
    } else if (kind == 22) { /* qpool.c: e = N, C, the 12 window values, signed */
        uint8_t *x = read_bytes(f, e[0] * e[1] * e[2] * e[3]);
        *ny = e[0] * e[1] * e[12] * e[13];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = optcli_maxpool2d_q8(x, yq, e, (int)e[14]);
        *y = bytes_to_floats(yq, *ny, (int)e[14]);
        free(x);
    } else if (kind == 23) {
        uint8_t *table = read_bytes(f, 256), *x = read_bytes(f, e[0]);
        *ny = e[0];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = optcli_lookup_u8(x, yq, e[0], table);
        *y = bytes_to_floats(yq, *ny, (int)e[1]);
        free(table), free(x);
    } else if (kind == 24 || kind == 25) {
        const int q = kind == 24;
        const int32_t zp[5] = {(int32_t)e[2], (int32_t)e[3], (int32_t)e[4], (int32_t)e[5], (int32_t)e[6]};
        float *p = read_floats(f, 3);
        uint8_t *x = read_bytes(f, e[0] * e[1]), *g = q ? read_bytes(f, e[0]) : NULL;
        *ny = q ? e[0] * e[1] : e[0];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = q ? optcli_qmul_rows(x, g, yq, e[0], e[1], p, zp) : optcli_qgap_rows(x, yq, e[0], e[1], p, zp);
        *y = bytes_to_floats(yq, *ny, (int)(q ? e[7] : e[5]));
        free(p), free(x), free(g);
    } else {
        const int32_t flags[2] = {(int32_t)e[1], (int32_t)e[2]};
        float *p = read_floats(f, 5);
        uint8_t *a = read_bytes(f, e[0]), *b = read_bytes(f, e[0]);
        *ny = e[0];
        yq = malloc((size_t)(*ny > 0 ? *ny : 1));
        rc = optcli_qadd(a, b, yq, e[0], p, flags);
        *y = bytes_to_floats(yq, *ny, (int)e[3]);
        free(p), free(a), free(b);
    }
    free(yq);
    return rc;
}

static int run_case(const char *in, const char *out) {
    FILE *f = fopen(in, "rb");
    if (!f) { perror(in); return 3; }
    int64_t h[20];
    if (fread(h, sizeof(int64_t), 20, f) != 20) { fprintf(stderr, "%s: short header\n", in); return 3; }
    float alpha, beta;
    int32_t ab[2] = {(int32_t)h[18], (int32_t)h[19]};
    memcpy(&alpha, &ab[0], 4);
    memcpy(&beta, &ab[1], 4);
    int act = (int)h[1], has_bias = (int)h[2];
    const int64_t *g = h + 3;
    float *y = NULL;
    int64_t ny;
    int rc;
    if (h[0] == 15 || h[0] == 16 || (h[0] >= 22 && h[0] <= 27)) { /* the integer kernels */
        rc = run_int8_case(f, h[0], has_bias, &y, &ny);
    } else if (h[0] == 0 || h[0] == 8) { /* depthwise: w [M, 1, KH, KW]; stem: w [M, C, KH, KW] */
        int64_t nx = g[0] * g[1] * g[2] * g[3], nw = g[4] * (h[0] == 8 ? g[1] : 1) * g[5] * g[6];
        float *x = read_floats(f, nx), *w = read_floats(f, nw);
        float *b = has_bias ? read_floats(f, g[4]) : NULL;
        ny = g[0] * g[4] * g[13] * g[14];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = (h[0] == 8 ? optcli_stem_conv2d_f32 : optcli_dwconv2d_f32)(x, w, b, y, g, act, alpha, beta);
        free(x), free(w), free(b);
    } else if (h[0] == 17) { /* grouped stem: int64 groups after the header; w [M, C / groups, KH, KW] */
        int64_t groups;
        if (fread(&groups, sizeof(int64_t), 1, f) != 1 || groups < 1) { fprintf(stderr, "%s: short header\n", in); return 3; }
        int64_t nx = g[0] * g[1] * g[2] * g[3], nw = g[4] * (g[1] / groups) * g[5] * g[6];
        float *x = read_floats(f, nx), *w = read_floats(f, nw);
        float *b = has_bias ? read_floats(f, g[4]) : NULL;
        ny = g[0] * g[4] * g[13] * g[14];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_stem_conv2d_grouped_f32(x, w, b, y, g, groups, act, alpha, beta);
        free(x), free(w), free(b);
    } else if (h[0] == 12 || h[0] == 13) { /* blocked depthwise / pooling */
        int64_t B = g[14], nx = g[0] * g[1] * g[2] * g[3] * B;
        float *x = read_floats(f, nx);
        ny = g[0] * g[1] * g[12] * g[13] * B;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        if (h[0] == 12) {
            float *w = read_floats(f, g[1] * g[4] * g[5] * B), *b = has_bias ? read_floats(f, g[1] * B) : NULL;
            rc = optcli_dwconv2d_blocked_f32(x, w, b, y, g, act, alpha, beta);
            free(w), free(b);
        } else {
            float *rrow = act == 2 ? read_floats(f, g[12]) : NULL, *rcol = act == 2 ? read_floats(f, g[13]) : NULL;
            rc = optcli_pool2d_blocked_f32(x, y, g, act, rrow, rcol);
            free(rrow), free(rcol);
        }
        free(x);
    } else if (h[0] == 10) { /* blocked conversions */
        int64_t cb = (g[1] + g[3] - 1) / g[3], nb = g[0] * cb * g[2] * g[3], np_ = g[0] * g[1] * g[2];
        float *x = read_floats(f, g[4] ? nb : np_);
        ny = g[4] ? np_ : nb;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = (g[4] ? optcli_from_blocked_f32 : optcli_to_blocked_f32)(x, y, g[0], g[1], g[2], g[3]);
        free(x);
    } else if (h[0] == 11) { /* blocked conv */
        int64_t e[4], geom[18];
        if (fread(e, sizeof(int64_t), 4, f) != 4) { fprintf(stderr, "%s: short header\n", in); return 3; }
        memcpy(geom, g, 15 * sizeof(int64_t));
        geom[15] = e[0], geom[16] = e[1], geom[17] = e[3];
        int64_t B = e[1], G = B == 8 ? 2 : 4, cbi = (g[1] + e[0] - 1) / e[0], mb = (g[4] + B - 1) / B;
        int64_t groups = e[3] > 0 ? e[3] : 1, mgb = groups > 1 ? mb / groups : mb;
        /* packed per group [ceil(mgb / G), C / groups, KH, KW, G, B], the groups one after another */
        int64_t nw = groups * ((mgb + G - 1) / G) * G * (g[1] / groups) * g[5] * g[6] * B;
        float *x = read_floats(f, g[0] * cbi * g[2] * g[3] * e[0]), *w = read_floats(f, nw);
        ny = g[0] * mb * g[13] * g[14] * B;
        float *r = e[2] ? read_floats(f, ny) : NULL, *b = has_bias ? read_floats(f, mb * B) : NULL;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_conv2d_blocked_f32(x, w, b, r, y, geom, act, alpha, beta);
        free(x), free(w), free(r), free(b);
    } else if (h[0] == 18) { /* upsampling by whole factors: geom = optcli_upsample_taps_f32's 8 values */
        float *x = read_floats(f, g[0] * g[6]);
        float *b = has_bias ? read_floats(f, g[1]) : NULL;
        ny = g[0] * g[2] * g[4] * g[3] * g[5];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_upsample_taps_f32(x, b, y, g, act, alpha, beta);
        free(x), free(b);
    } else if (h[0] == 14) { /* blocked global average */
        float *x = read_floats(f, g[0] * g[1] * g[2] * g[3]);
        ny = g[0] * g[1] * g[3];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_global_avg_blocked_f32(x, y, g[0], g[1], g[2], g[3]);
        free(x);
    } else if (h[0] == 3) {
        float *w = read_floats(f, g[1] * g[2]), *x = read_floats(f, g[0] * g[2] * g[3]);
        ny = g[0] * g[1] * g[3];
        float *r = g[4] ? read_floats(f, ny) : NULL;
        float *b = has_bias ? read_floats(f, g[1]) : NULL;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        if (g[5]) { /* the transposed product of small planes, on W.T's panels packed here */
            float *wt = malloc((size_t)(g[1] * g[2]) * sizeof(float));
            int nr = optcli_gemm_pack_wt_f32(w, wt, g[1], g[2]);
            rc = nr ? optcli_gemm_conv_t_f32(w, wt, nr, x, b, r, y, g[0], g[1], g[2], g[3], act, alpha, beta) : 4;
            free(wt);
        } else {
            rc = optcli_gemm_conv_f32(w, x, b, r, y, g[0], g[1], g[2], g[3], act, alpha, beta);
        }
        free(w), free(x), free(r), free(b);
    } else if (h[0] == 2) {
        int64_t nx = g[0] * g[1] * g[2] * g[3];
        float *x = read_floats(f, nx);
        float *rrow = act == 2 ? read_floats(f, g[13]) : NULL, *rcol = act == 2 ? read_floats(f, g[14]) : NULL;
        ny = g[0] * g[1] * g[13] * g[14];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_pool2d_f32(x, y, g, act, rrow, rcol);
        free(x), free(rrow), free(rcol);
    } else if (h[0] == 4) {
        ny = g[0];
        float *x = read_floats(f, ny);
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_activation_f32(x, ny % 2 ? y : x, ny, act, alpha, beta); /* odd sizes out of place */
        if (ny % 2 == 0) memcpy(y, x, (size_t)ny * sizeof(float));
        free(x);
    } else if (h[0] == 32) { /* softmax along a middle axis: g = outer, n, inner */
        ny = g[0] * g[1] * g[2];
        float *x = read_floats(f, ny);
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_softmax_mid_f32(x, y, g[0], g[1], g[2]);
        free(x);
    } else if (h[0] == 31) { /* softmax along rows: g = rows, n */
        float *x = read_floats(f, g[0] * g[1]);
        ny = g[0] * g[1];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_softmax_f32(x, y, g[0], g[1]);
        free(x);
    } else if (h[0] == 19 || h[0] == 30) { /* the few-row and the GEMM fully connected layer */
        int64_t rows = g[0], k = g[1], n = g[2];
        float *x = read_floats(f, rows * k), *w = read_floats(f, k * n);
        float *b = has_bias ? read_floats(f, n) : NULL;
        ny = rows * n;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        if (h[0] == 19) {
            rc = optcli_fc_rows_f32(x, w, b, y, rows, k, n, act, alpha, beta);
        } else { /* the weight packed first where g[3] says so */
            int64_t nr = g[3] ? optcli_fc_pack_f32(w, NULL, k, n) : 0;
            float *packed = nr > 0 ? malloc((size_t)(k * ((n + nr - 1) / nr * nr)) * sizeof(float)) : NULL;
            if (packed) optcli_fc_pack_f32(w, packed, k, n);
            rc = optcli_fc_f32(x, w, b, y, rows, k, n, act, alpha, beta, packed, nr);
            free(packed);
        }
        free(x), free(w), free(b);
    } else if (h[0] == 21) {
        const int64_t dirs = g[0], seq = g[1], batch = g[2], hid = g[3];
        float *xp = read_floats(f, dirs * seq * batch * 4 * hid), *rt = read_floats(f, dirs * (hid + 1) * ((4 * hid + 15) / 16 * 16)); /* R^T in padded panels */
        float *qs = read_floats(f, dirs * 4 * hid);
        const int64_t geom[5] = {dirs, seq, batch, hid, g[4]};
        int32_t acts[6];
        float ab0[6] = {0};
        for (int i = 0; i < 6; i++) acts[i] = (int32_t)g[5 + i % 3];
        const int64_t ns = dirs * batch * hid;
        ny = seq * ns + 2 * ns;
        y = malloc((size_t)ny * sizeof(float));
        rc = optcli_recurrent_f32(0, xp, rt, NULL, qs, NULL, NULL, NULL, NULL, NULL, NULL, y, y + seq * ns, y + seq * ns + ns, geom,
                                  acts, ab0, ab0, 0.0f, 8);
        free(xp), free(rt), free(qs);
    } else if (h[0] == 20) { /* PRelu with a slope per channel: g = n, c, hw, lanes */
        ny = g[0] * g[1] * g[2] * g[3];
        float *x = read_floats(f, ny), *s = read_floats(f, g[1] * g[3]);
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        float *dst = ny % 2 ? y : x; /* even cases in place, odd ones out of place */
        rc = optcli_channel_prelu_f32(x, dst, s, g[0], g[1], g[2], g[3]);
        if (dst == x) memcpy(y, x, (size_t)ny * sizeof(float));
        free(x), free(s);
    } else if (h[0] == 9 && g[1] > 0) { /* b of g[1] floats repeated along x */
        ny = g[0];
        float *x = read_floats(f, ny), *b = read_floats(f, g[1]);
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_add_period_f32(x, b, y, ny, g[1], act, alpha, beta);
        free(x);
        free(b);
    } else if (h[0] == 9) {
        ny = g[0];
        float *x = read_floats(f, ny), *b = read_floats(f, ny);
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_add_f32(x, b, ny % 2 ? y : b, ny, act, alpha, beta); /* even sizes in place (into b) */
        if (ny % 2 == 0) memcpy(y, b, (size_t)ny * sizeof(float));
        free(x);
        free(b);
    } else if (h[0] == 7) {
        int64_t k = g[2] * g[5] * g[6];
        float *w = read_floats(f, g[1] * k), *x = read_floats(f, g[0] * g[2] * g[3] * g[4]);
        ny = g[0] * g[1] * g[11] * g[12];
        float *r = g[13] ? read_floats(f, ny) : NULL;
        float *b = has_bias ? read_floats(f, g[1]) : NULL;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_conv2d_gemm_f32(w, x, b, r, y, g, act, alpha, beta);
        free(w), free(x), free(r), free(b);
    } else if (h[0] == 6) {
        float *x = read_floats(f, g[0] * g[1]);
        ny = g[0];
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        rc = optcli_row_mean_f32(x, y, g[0], g[1]);
        free(x);
    } else if (h[0] == 5) {
        int64_t nx = g[0] * g[1] * g[2], ns = g[0] * g[2];
        float *x = read_floats(f, nx), *s = read_floats(f, g[1]);
        float *b = has_bias ? read_floats(f, g[1]) : NULL;
        ny = nx + 2 * ns;
        y = malloc((size_t)ny * sizeof(float));
        rc = optcli_layer_norm_f32(x, s, b, y, y + nx, y + nx + ns, g[0], g[1], g[2], alpha);
        free(x), free(s), free(b);
    } else {
        ny = g[0] * g[1] * g[2];
        float *x = read_floats(f, ny);
        float *s = g[3] ? read_floats(f, g[1]) : NULL;
        float *b = has_bias ? read_floats(f, g[1]) : NULL;
        y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(float));
        /* even cases in place, odd ones out of place */
        float *dst = ny % 2 ? y : x;
        rc = optcli_channel_affine_f32(x, dst, s, b, g[0], g[1], g[2], act, alpha, beta);
        if (dst == x) memcpy(y, x, (size_t)ny * sizeof(float));
        free(x), free(s), free(b);
    }
    fclose(f);
    if (rc != 0) { fprintf(stderr, "%s: kernel returned %d\n", in, rc); free(y); return 4; }
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(y, sizeof(float), (size_t)ny, o) != (size_t)ny) { perror(out); return 3; }
    fclose(o);
    free(y);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc % 2) {
        fprintf(stderr, "usage: %s THREADS CASE OUT [CASE OUT ...]\n", argv[0]);
        return 2;
    }
    if (optcli_native_abi() != OPTCLI_NATIVE_ABI) return 5;
    optcli_set_num_threads(atoi(argv[1]));
    const char *lanes = getenv("OPTCLI_LANES"); /* a vector width of the GEMM and stem conv to force (a host run) */
    if (lanes && optcli_gemm_variant(atoi(lanes)) != atoi(lanes)) return 6;
    for (int i = 2; i + 1 < argc; i += 2) {
        int rc = run_case(argv[i], argv[i + 1]);
        if (rc) return rc;
    }
    printf("ok: %d cases, %d threads, %d pool workers\n", (argc - 2) / 2, optcli_get_num_threads(),
           optcli_pool_workers());
    return 0;
}
