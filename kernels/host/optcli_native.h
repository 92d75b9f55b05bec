/* The host target's native kernels: a plain C ABI loaded with ctypes (optcli/native/library.py).
 * No Python API here, so the library has no tie to one Python version. */
#ifndef OPTCLI_NATIVE_H
#define OPTCLI_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#define OPT_API __attribute__((visibility("default")))
#define OPTCLI_NATIVE_ABI 26 /* bump when a signature below changes (or functions are added) */

/* Errors returned by the kernels (0 is success). */
#define OPT_EINVAL (-1) /* arguments out of range: the caller's shapes or attributes */
#define OPT_ENOMEM (-2) /* scratch allocation failed */
#define OPT_ENOTSUP (-3) /* this build cannot do it (a compiler without _Float16): the caller falls back */

typedef void (*opt_item_fn)(void *ctx, int64_t item);
/* Runs fn(ctx, i) for i in [0, nitems) on the pool; max_threads <= 0 means no extra cap. */
void opt_parallel(opt_item_fn fn, void *ctx, int64_t nitems, int max_threads);
/* Whether the CPU runs the x86-64-v4 (AVX-512) variants: 0 elsewhere (pool.c). */
int opt_cpu_has_avx512(void);
/* The calling thread's scratch of at least n floats, kept between calls (window.c); NULL when out
 * of memory.  One user at a time per thread: a kernel must not hold it across another's call. */
float *opt_scratch(size_t n);

OPT_API int optcli_native_abi(void);
OPT_API int optcli_get_num_threads(void);
OPT_API int optcli_set_num_threads(int n); /* returns the previous value */
OPT_API int optcli_pool_workers(void);
OPT_API int64_t optcli_pool_selftest(int64_t nitems, int sleep_us, int64_t *stats); /* tests */

/* Depthwise 2-D convolution, NCHW in and out, with bias and a fused activation.
 * geom: N, C, H, W, M, KH, KW, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW.
 * Output channel m reads input channel m / (M / C).  bias may be NULL. */
OPT_API int optcli_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y,
                                const int64_t *geom, int act, float alpha, float beta);

/* Dense 2-D convolution (one group) for few input channels, the stems of vision nets (stem.c),
 * NCHW in and out, with bias and a fused activation; no padded copy of x needed.  geom as for
 * optcli_dwconv2d_f32 (pads may be negative: they crop); w is [M, C, KH, KW], bias [M] or NULL.
 * Its time grows with C * M and it reads each input row once per band: meant for C <= 4 or so. */
OPT_API int optcli_stem_conv2d_f32(const float *x, const float *w, const float *bias, float *y,
                                   const int64_t *geom, int act, float alpha, float beta);

/* The same for a grouped conv (groups divides C and M; w is [M, C / groups, KH, KW]): each image's
 * groups run as images of C / groups channels with their own weights.  Small groups (RegNet's 8
 * channels) are what it is for: the GEMM packs each group's few rows and columns separately. */
OPT_API int optcli_stem_conv2d_grouped_f32(const float *x, const float *w, const float *bias, float *y,
                                           const int64_t *geom, int64_t groups, int act, float alpha, float beta);

/* Max (op 1) or average (op 2) pooling, NCHW: geom as above with M = C; for average pooling,
 * rrow[OH] and rcol[OW] are 1 / (the window's count) along each axis, whose product divides. */
OPT_API int optcli_pool2d_f32(const float *x, float *y, const int64_t *geom, int op, const float *rrow,
                              const float *rcol);

/* y[n, c, :] = act(x[n, c, :] * scale[c] + shift[c]) over [N, C, HW]; scale and shift may be NULL
 * (1 and 0); x == y works in place. */
OPT_API int optcli_channel_affine_f32(const float *x, float *y, const float *scale, const float *shift,
                                      int64_t n, int64_t c, int64_t hw, int act, float alpha, float beta);

/* y = x >= 0 ? x : x * slope[c * lanes + l] over x [N, C, HW, lanes] (PRelu with a slope per
 * channel: lanes 1 for NCHW, the block width for the blocked layout); x == y works in place. */
OPT_API int optcli_channel_prelu_f32(const float *x, float *y, const float *slope, int64_t n, int64_t c, int64_t hw,
                                     int64_t lanes);

/* The GEMM convs (gemm.c): for each of `batch` images, y = act(w @ x + bias[:, None] + res) with
 * w [M, K] shared, x [K, N], y and res [M, N], all row-major and contiguous, images back to back.
 * bias and res may be NULL; res must not overlap y (y holds partial sums while K is walked). */
OPT_API int optcli_gemm_conv_f32(const float *w, const float *x, const float *bias, const float *res, float *y,
                                 int64_t batch, int64_t m, int64_t k, int64_t n, int act, float alpha, float beta);
/* Small planes (1x1 convs on 7x7 and 14x14): W packed once by the caller into panels of W.T
 * (m * k floats; returns the panel width, 0 where m is not a multiple of the vector width and
 * nothing was written), then the product of optcli_gemm_conv_f32 with those panels: 16..256
 * columns run as Y.T = X.T @ W.T, vectorised along m (49 columns fill 64-column tiles badly);
 * other shapes, or panels of another width (the tests switch the vector width), as
 * optcli_gemm_conv_f32. */
OPT_API int optcli_gemm_pack_wt_f32(const float *w, float *wt, int64_t m, int64_t k);
OPT_API int optcli_gemm_conv_t_f32(const float *w, const float *wt, int64_t nr, const float *x, const float *bias,
                                   const float *res, float *y, int64_t batch, int64_t m, int64_t k, int64_t n, int act,
                                   float alpha, float beta);
/* A 2-D convolution (one group) as an implicit GEMM: the same product and epilogue with X the
 * im2col matrix of the zero-padded input xp [batch, C, HP, WP], gathered while packing, never
 * formed.  geom: batch, M, C, HP, WP, KH, KW, stride_h, stride_w, dil_h, dil_w, OH, OW; w is
 * [M, C * KH * KW], y and res [batch, M, OH * OW]. */
OPT_API int optcli_conv2d_gemm_f32(const float *w, const float *xp, const float *bias, const float *res, float *y,
                                   const int64_t *geom, int act, float alpha, float beta);
OPT_API int optcli_conv2d_gemm_grouped_f32(const float *w, const float *xp, const float *bias, float *y,
                                           const int64_t *geom, int64_t groups, int act, float alpha, float beta);
/* For the tests: the GEMM's vector width in floats, 4, 8 or 16 (x86-64 with AVX-512 only); 0 picks
 * by the CPU again, -1 changes nothing.  Returns the width now in use, or -1 if refused. */
OPT_API int optcli_gemm_variant(int lanes);

/* The channel-blocked layout (blocked_conv.c): [N, C, H, W] held as [N, ceil(C / b), H, W, b], channel c
 * in lane c % b of block c / b, b = 4, 8 or 16 (16 only with AVX-512).  to: x [n, c, hw] -> y [n,
 * ceil(c / b), hw, b], lanes past c zero; from: the way back. */
OPT_API int optcli_to_blocked_f32(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t b);
OPT_API int optcli_from_blocked_f32(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t b);
/* A 2-D conv in the blocked layout, direct (no im2col): geom N, C, H, W, M, KH, KW, stride_h,
 * stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW, ib, B, groups; x blocked [N, ceil(C / B), H, W, B] (ib = B)
 * or plain [N, C, H, W] (ib = 1); packed [ceil(Mb / G), C, KH, KW, G, B] (Mb = ceil(M / B), G = 2 for
 * B = 8, else 4: a register tile's weight vectors side by side) with zeros past M; bias
 * [ceil(M / B) * B] or NULL; res NULL or as y, added before the activation; y [N, ceil(M / B), OH, OW, B].
 * Zero padding (pads may be negative: they crop).  groups > 1: C / groups a multiple of ib and M / groups
 * of B (every lane of a block in one group); packed is each group's packing as above (C / groups input
 * channels, M / groups outputs) one after another. */
OPT_API int optcli_conv2d_blocked_f32(const float *x, const float *packed, const float *bias, const float *res,
                                      float *y, const int64_t *geom, int act, float alpha, float beta);

/* Element-wise (elementwise.c): y = act(x) over n floats (activation codes of simd.h); x == y works
 * in place. */
OPT_API int optcli_activation_f32(const float *x, float *y, int64_t n, int act, float alpha, float beta);
/* y = act(x + b) over n floats (a residual Add and its fused activation in one pass); y may be x or b. */
OPT_API int optcli_add_f32(const float *x, const float *b, float *y, int64_t n, int act, float alpha, float beta);
/* y = act(x + b[i % nb]) over n floats, n a multiple of nb >= 1 (b broadcast along x's leading dims); y may be x. */
OPT_API int optcli_add_period_f32(const float *x, const float *b, float *y, int64_t n, int64_t nb, int act, float alpha,
                                  float beta);
/* A fully connected layer over a few rows (fc_rows.c): y [rows, n] = act(x [rows, k] @ w [k, n] + bias [n]),
 * all row-major and contiguous; bias may be NULL; y must not overlap x, w or bias. */
OPT_API int optcli_fc_rows_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows,
                               int64_t k, int64_t n, int act, float alpha, float beta);
/* Softmax along rows of n contiguous floats (elementwise.c): y [rows, n] = exp(x - max) / sum per row; a row
 * whose max is not finite (a NaN, +inf, all -inf) is NaN.  y may be x. */
OPT_API int optcli_softmax_f32(const float *x, float *y, int64_t rows, int64_t n);
/* Softmax along the middle axis of x [outer, n, inner] (1 <= n <= 4096), the same rules; y must not be x. */
OPT_API int optcli_softmax_mid_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner);
/* A fully connected layer over any number of rows (gemm.c): the same product as optcli_fc_rows_f32,
 * through the GEMM's register tiles, the bias and activation in their epilogue, split over the pool.
 * packed (or NULL): w as optcli_fc_pack_f32 packed it for panel width nr, used where nr is the
 * variant's in use. */
OPT_API int optcli_fc_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t k,
                          int64_t n, int act, float alpha, float beta, const float *packed, int64_t nr);
/* w [k, n] packed for optcli_fc_f32 into packed (k * round_up(n, nr) floats); returns nr, the panel
 * width of the variant in use (packed NULL: only that), or a negative status. */
OPT_API int64_t optcli_fc_pack_f32(const float *w, float *packed, int64_t k, int64_t n);
/* LayerNormalization of x [outer, c, inner] over its c axis: y (same layout) = (x - mean) / sqrt(var + eps)
 * * scale[k] + bias[k]; mean and inv (1 / sqrt(var + eps)), [outer, inner], are written when not NULL.
 * bias may be NULL; eps must be > 0. */
OPT_API int optcli_layer_norm_f32(const float *x, const float *scale, const float *bias, float *y, float *mean,
                                  float *inv, int64_t outer, int64_t c, int64_t inner, float eps);
/* Half-precision storage (elementwise.c): y (n binary16 values) = x rounded to nearest even, finite
 * values beyond +-65504 saturating to it, infinities and NaN kept; and back, exactly.  OPT_ENOTSUP
 * where the compiler had no _Float16. */
OPT_API int optcli_f32_to_f16(const float *x, void *y, int64_t n);
OPT_API int optcli_f16_to_f32(const void *x, float *y, int64_t n);
/* y[r] = the mean of x[r, 0:n] for r < rows, x row-major. */
OPT_API int optcli_row_mean_f32(const float *x, float *y, int64_t rows, int64_t n);
/* Upsampling by whole factors (upsample.c): y [planes, H * KH, W * KW], pixel (i * KH + a, j * KW + b)
 * of plane p = act(src[p * ps + (a * KW + b) * ts + i * W + j] + bias[p % channels]); geom = planes,
 * channels, H, W, KH, KW, ps, ts.  ts = 0: a nearest Resize; ts = H * W: a ConvTranspose's columns
 * whose taps never overlap.  bias may be NULL. */
OPT_API int optcli_upsample_taps_f32(const float *src, const float *bias, float *y, const int64_t *geom, int act,
                                     float alpha, float beta);

/* Channel-blocked layout NCHWc (blocked_window.c): a logical [N, C, H, W] stored as [N, Cb, H, W, B],
 * Cb = ceil(C / B), channel c at block c / B, lane c % B; B is 4, 8 or 16 (16 only on x86-64 with
 * AVX-512: OPT_EINVAL elsewhere).  geom: N, Cb, H, W, KH, KW, stride_h, stride_w, dil_h, dil_w,
 * pad_top, pad_left, OH, OW, B (padding at the end: whatever OH and OW imply).
 * Depthwise conv (multiplier 1) with bias and a fused activation: x [N, Cb, H, W, B], packed weights
 * [Cb, KH, KW, B] (zero in pad lanes), bias [Cb * B] or NULL, y [N, Cb, OH, OW, B]; zero padding.
 * Pad lanes of y hold act(0) when the input's pad lanes are finite. */
OPT_API int optcli_dwconv2d_blocked_f32(const float *x, const float *packed, const float *bias, float *y,
                                        const int64_t *geom, int act, float alpha, float beta);
/* Max (op 1, padding -inf, np.maximum's NaN rule) or average (op 2, padding 0, each window's sum times
 * rrow[oh] * rcol[ow]) pooling, blocked x [N, Cb, H, W, B] -> y [N, Cb, OH, OW, B]; geom as above. */
OPT_API int optcli_pool2d_blocked_f32(const float *x, float *y, const int64_t *geom, int op, const float *rrow,
                                      const float *rcol);
/* Global average pooling, blocked x [n, cb, hw, b] -> y [n, cb, b]: the mean over hw, summed in float
 * vectors of 256 pixels and those sums in double. */
OPT_API int optcli_global_avg_blocked_f32(const float *x, float *y, int64_t n, int64_t cb, int64_t hw, int64_t b);

/* The time loop of LSTM (cell 0), GRU (1) and RNN (2) layers (recurrent.c), ONNX semantics, for every
 * direction and batch row.  geom: dirs, seq, batch, hidden, direction (0 forward, 1 reverse,
 * 2 bidirectional: direction 0 forward, 1 reverse); G = 4, 3, 1 gates.
 * xp [dirs, seq, batch, G * hidden]: X @ W^T with the biases folded in (LSTM and RNN: Wb + Rb; GRU:
 * Wb, plus Rb of z and r); rt [dirs, ceil(G * hidden / 16), hidden + 1, 16]: R transposed in panels of
 * 16 columns (column col of row i at [col / 16, i, col % 16]; the last panel's extra columns and each
 * panel's padding row zero); rbh [dirs, hidden]: GRU's Rb
 * of its h gate (NULL for the others); p [dirs, 3 * hidden] LSTM peepholes i, o, f or NULL; h0, c0
 * [dirs, batch, hidden] or NULL (zeros); lens [batch] in [0, seq] or NULL (seq each).
 * Writes y [seq, dirs, batch, hidden] (zero past a row's length), yh and yc [dirs, batch, hidden];
 * each may be NULL.  acts, alphas, betas: 3 per direction (f, g, h of the ONNX op; activation codes
 * of simd.h); flags: 1 input_forget, 2 linear_before_reset, 4 clip pre-activations to +-clip, 8 (LSTM)
 * quantized h, onnxruntime's DynamicQuantizeLSTM: rt holds R's 8-bit integers less their zero point,
 * qscale [dirs, 4 * hidden] their scale per column, and each step adds float(q @ rt) * (h_scale *
 * qscale[col]) for q = h(t-1) quantized to uint8 less its zero point (per row: the whole batch where
 * batch is 1).  The caller keeps hidden * 255 * max|rt| under 2**24: float32 sums those integers
 * exactly.  qscale is NULL without the flag.  rq and rqsum (both or neither, with the flag only): the
 * same integers as int8 [dirs, ceil(4 * hidden / 16), ceil(hidden / 4), 16, 4] (panel of 16 columns,
 * group of 4 rows, column, row: zero-padded) and their column sums [dirs, 4 * hidden] int32, for
 * vpdpbusd where the CPU has AVX-512 VNNI (hidden up to 1024); else the float product of rt runs. */
OPT_API int optcli_recurrent_f32(int cell, const float *xp, const float *rt, const float *rbh, const float *qscale,
                                 const int8_t *rq, const int32_t *rqsum, const float *p, const float *h0, const float *c0, const int32_t *lens, float *y, float *yh, float *yc,
                                 const int64_t *geom, const int32_t *acts, const float *alphas, const float *betas,
                                 float clip, int flags);
/* onnxruntime's dynamic quantization of a float operand of n elements (its dynamic GEMMs, recurrent.c):
 * q receives clamp(rint(a / scale), -zp, 255 - zp), the uint8 values less their zero point, and
 * params scale and zero point (range [min(a, 0), max(a, 0)], scale range / 255 or 1, zp rint(clamp(
 * -min / scale, 0, 255))).  Returns 1 (q then undefined) where an element is not finite: the
 * caller's general path defines those. */
OPT_API int optcli_dynamic_quantize_f32(const float *a, int64_t n, float *q, float *params);
/* A DynamicQuantizeLSTM's input projection from X's quantized rows (optcli_dynamic_quantize_f32's q and
 * params: x scale, zero point): out [rows, n] = float(q @ W) * (x_scale * col_scale[j]) + bias[j] (bias
 * may be NULL: no add), W's
 * integers int8 in the recurrent product's panels ([ceil(n / 16), ceil(k / 4), 16, 4]) with their column
 * sums wsum [n]; the product exact in int32 by AVX-512 VNNI.  geom: rows, k (1..4096), n (1..4096).
 * OPT_ENOTSUP where the CPU lacks AVX-512 VNNI (the caller's float product runs). */
OPT_API int optcli_dynamic_qrows_f32(const float *q, const float *qp, const int8_t *wq, const int32_t *wsum,
                                     const float *col_scale, const float *bias, float *out, const int64_t *geom);
/* For the tests: the size of R (floats) from which a layer whose rows leave cores idle splits each
 * row's hidden units over the pool, one time step at a time (default 32768; 0: always, -1: never);
 * -2 changes nothing.  Returns the previous value. */
OPT_API int64_t optcli_recurrent_split_from(int64_t floats);
/* For the tests: the lanes of the recurrent product, 16 (AVX-512, -1 where the CPU lacks it) or 8;
 * 0 picks by the CPU, -1 only asks.  Returns the lanes in effect (or -1). */
OPT_API int optcli_recurrent_lanes(int lanes);

/* Integer convolutions (qgemm.c): u8 or s8 activations x s8 weights, accumulated exactly in int32,
 * requantized to u8 or s8 as onnxruntime's QLinearConv: float(acc + bias[m]) * mult[m], clamped to
 * [qmin, qmax] - y_zp, rounded to nearest even, + y_zp.  x [N, C, H, W], y [N, M, OH, OW], NCHW.
 * geom: N, C, H, W, M, KH, KW, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, OH, OW, group
 * (padding with the input's zero point; at the end: what OH and OW imply); qp: x zero point,
 * y zero point, qmin, qmax, x signed (0: u8), y signed.  bias [M] int32 or NULL; mult [M] float.
 * gemm: wp [M, ceil(K / 2)] int32, W [M, K] (K = C / group * KH * KW) as int16 pairs, the low half
 * k even (zero past K); K at most 65536.  depthwise: C / group == 1, w [M, KH * KW] int8. */
OPT_API int optcli_qconv2d_gemm(const void *x, const int32_t *wp, const int32_t *bias, const float *mult, void *y,
                                const int64_t *geom, const int32_t *qp);
OPT_API int optcli_qconv2d_depthwise(const void *x, const int8_t *w, const int32_t *bias, const float *mult, void *y,
                                     const int64_t *geom, const int32_t *qp);
/* Integer 1x1 convs with unit strides and no padding (qpointwise.c, vpmaddubsw where AVX2 is): the same
 * integers as optcli_qconv2d_gemm from weights split so that no u8 x s8 pair sum can clip (see there),
 * built by optcli/native/qgemm.py's pack_quads.  wq: int32 format (0 split as above; 1 the whole weights, no
 * residual, for the VNNI path, whose vpdpbusd has no int16 step), then [M, Q] int32 (Q = ceil(K / 4); each the bytes of
 * w[m, 4q .. 4q + 3], zero past K), then int32 rptr[M + 1] (rptr[0] = 0, non-decreasing), then rptr[M]
 * pairs (quad index < Q, 4 residual weight bytes) in row order.  bias [M] (required): the model's bias
 * less x_zp' * sum(w[m]), modulo 2^32, where x_zp' is the zero point (u8 inputs) or the zero point + 128
 * (s8 inputs, read as u8 by flipping their top bit).  The rest as optcli_qconv2d_gemm. */
OPT_API int optcli_qconv2d_pointwise(const void *x, const int32_t *wq, const int32_t *bias, const float *mult,
                                     void *y, const int64_t *geom, const int32_t *qp);
/* MaxPool of 8-bit NCHW x (u8, or s8 where is_signed) into y [N, C, OH, OW] (qpool.c).  geom: N, C, H, W, KH, KW,
 * stride_h, stride_w (at most 8), dil_h, dil_w, pad_top, pad_left, OH, OW; padding never wins (the dtype's
 * lowest value).  OPT_EINVAL where an output's window would start past the input. */
OPT_API int optcli_maxpool2d_q8(const uint8_t *x, uint8_t *y, const int64_t *geom, int is_signed);
/* Integer dense convs, any window, strides, dilations, padding and groups (qpointwise.c, vpdpbusd where the
 * CPU has AVX-512 VNNI): the same integers as optcli_qconv2d_gemm from optcli_qconv2d_pointwise's blob and
 * bias (K = C / group * KH * KW in the order (c, kh, kw)). */
OPT_API int optcli_qconv2d_dense(const void *x, const int32_t *wq, const int32_t *bias, const float *mult, void *y,
                                 const int64_t *geom, const int32_t *qp);
/* Integer dense layer (qmatmul.c, optcli.QMatMul): y [R, M] (u8 / s8 by qp[5]) = requant(x [R, K] (u8 / s8 by
 * qp[4]) times w [K, M] plus bias), x and y row-major.  w: optcli/native/qgemm.py's pack_columns, int8
 * [ceil(M / 16)][ceil(K / 4)][16][4] (zeros past K and M); aux: int32 column sums of w [M], bias [M] (zeros for
 * none), then per tile of 16 columns the residual entries' starts [tiles + 1] and the entries (quad < ceil(K /
 * 4), 64 residual bytes: 17 int32 each; none unless split).  mult [M] float32; dims: R, K (1 to 65536), M, split
 * (1: the main weights' byte pairs cannot clip vpmaddubsw's int16 sums); qp: x_zp, y_zp, qmin, qmax, x signed,
 * y signed.  The same integers as optcli_qconv2d_gemm's 1x1 conv of x^T. */
OPT_API int optcli_qmatmul_rows(const void *x, const int8_t *w, const int32_t *aux, const float *mult, void *y,
                                const int64_t *dims, const int32_t *qp);
/* For the tests: the dot-product path, 1 plain C, 2 AVX2, 3 AVX2 with FMA depthwise lanes, 4 as 3 with the
 * 1x1 and dense convs by AVX-512 VNNI (x86-64 CPUs that have them); 0 picks by the CPU again, -1 changes nothing.
 * Returns the path now in use, or -1 if refused. */
OPT_API int optcli_qgemm_variant(int which);
/* Quantized Add (qelementwise.c), onnxruntime's QLinearAdd arithmetic: y[i] = rint(clamp(fma(a[i], p[0],
 * fma(b[i], p[1], p[2])), p[3], p[4])) over n elements of the same shape; p: a_scale / y_scale,
 * b_scale / y_scale, y_zp - (p[0] * a_zp + p[1] * b_zp), qmin, qmax; flags: a signed, b signed (y's
 * signedness is in its bounds: its bytes are the two's complement of the result). */
OPT_API int optcli_qadd(const void *a, const void *b, void *y, int64_t n, const float *p, const int32_t *flags);
/* QuantizeLinear per tensor (qelementwise.c): y[i] = clamp(rint(x[i] / scale) + zp, lo, hi) over n floats, a NaN
 * giving 0; lo and hi the output dtype's range (its bytes are the two's complement of the result). */
OPT_API int optcli_quantize_f32(const float *x, void *y, int64_t n, float scale, float zp, float lo, float hi);
/* DequantizeLinear per tensor (qelementwise.c): y[i] = (float)(x[i] - zp) * scale over n u8 (or s8 where x_signed)
 * values, in float32: the correctly rounded product, as the numpy kernel's float64 product cast to float32. */
OPT_API int optcli_dequantize_f32(const void *x, float *y, int64_t n, float scale, int32_t zp, int32_t x_signed);
/* Byte table lookup (qelementwise.c): y[i] = table[x[i]] over n bytes, table[256] indexed by the raw byte. */
OPT_API int optcli_lookup_u8(const void *x, void *y, int64_t n, const uint8_t *table);
/* For the tests: the lookup's and the float-to-byte quantization's path, 1 the portable loops; 0 picks by the
 * CPU again (the lookup by AVX-512 VBMI, reported as 2; the quantization by AVX-512 F/BW/VL where the CPU has
 * them), -1 changes nothing.  Returns the lookup's path now in use, or -1 if refused. */
OPT_API int optcli_lookup_variant(int which);
/* Quantized multiply of x [rows, inner] by a per-row gate g [rows] (qelementwise.c): y = clamp(rint(float((x - zp[0])
 * * (g - zp[1])) * p[0]) + zp[2], p[1], p[2]); zp[3], zp[4]: x signed, g signed. */
OPT_API int optcli_qmul_rows(const void *x, const void *g, void *y, int64_t rows, int64_t inner, const float *p,
                             const int32_t *zp);
/* Quantized mean of each row of x [rows, inner] (qelementwise.c): y[r] = clamp(rint(float(sum(x[r]) - zp[0] * inner)
 * * p[0]) + zp[1], p[1], p[2]); zp[2]: x signed; inner <= 2^23. */
OPT_API int optcli_qgap_rows(const void *x, void *y, int64_t rows, int64_t inner, const float *p, const int32_t *zp);

#endif
