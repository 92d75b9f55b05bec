/* The time loop of the recurrent layers, LSTM, GRU and RNN (ONNX semantics), on the pool.
 *
 * What stays in numpy (optcli/ops/recurrent.py): the input projection of every time step as one
 * GEMM (X @ W^T, the biases folded in), which is where a long sequence spends its multiply-adds
 * in BLAS.  What is here: the part that cannot be batched over time, h(t-1) @ R^T and the gates,
 * one step after another.  Per step numpy paid ~10 small calls (tens of microseconds) for work
 * that takes one to a few microseconds at the hidden sizes of speech and OCR models (64-512).
 *
 * Work items are (direction, batch row) pairs: each runs its whole sequence alone, so a
 * bidirectional layer's two directions run on two cores.  R is given transposed ([H, G*H], in
 * panels of 8 columns: `gemv_rows`) so the product is a sum of rows of R^T scaled by h's elements:
 * vectorised along the gates with no horizontal sums, its accumulators held in registers across
 * the whole of h.
 *
 * Where the time goes (one core, EPYC): the product reads all of R^T every step, 64 KiB for an
 * LSTM of 64 units (or a GRU/RNN of 128), which is past L1, so it runs at L2's bandwidth, ~0.7 us
 * a step whatever the FMA scheduling; the default LSTM gates take one fused 8-lane pass
 * (lstm_default_gates).  onnxruntime's DynamicQuantizeLSTM keeps R in int8 (16 KiB, in L1) and
 * quantizes h per step; its numerics run here with FLAG_QUANTIZE_H (`quantized_product`): h(t-1)
 * quantized per step as its dynamic GEMM does, the product of R's integers less their zero point
 * exact (int8 by vpdpbusd where the CPU has AVX-512 VNNI, else float sums of the integers), so the
 * results are onnxruntime's, not the float LSTM's.
 *
 * Gates follow ONNX: LSTM i, o, f, c (peepholes i, o, f); GRU z, r, h; RNN one.  Activations are
 * the fused-epilogue codes of simd.h (the ONNX names with no code run in numpy).  A row whose
 * sequence length is shorter than the sequence stops there: later steps of y are zero, y_h / y_c
 * hold the state after its last step (zeros for a length of 0), and the reverse direction starts at
 * its last step.
 */
#include <math.h>
#include <stdlib.h>

#include "optcli_native.h"
#include "qconv_kernel.h"
#include "simd.h"

enum { CELL_LSTM = 0, CELL_GRU = 1, CELL_RNN = 2 };
enum { FLAG_INPUT_FORGET = 1, FLAG_LINEAR_BEFORE_RESET = 2, FLAG_CLIP = 4, FLAG_QUANTIZE_H = 8 };
enum { DIR_FORWARD = 0, DIR_REVERSE = 1, DIR_BIDIRECTIONAL = 2 };

/* R's size in floats from which a layer splits its rows over the pool: 32K (128 KiB).  Measured
 * with R^T in panels on a 2-core EPYC (Zen 5 class), a layer of 100 steps at 2 threads, sequential
 * against split: LSTM 64 units (16K floats) 0.083 against 0.101 ms, GRU 96 (28K) 0.137 against
 * 0.162 ms; LSTM 96 (37K) 0.181 against 0.167 ms, LSTM 128 0.303 against 0.201 ms, GRU 128 0.197
 * against 0.147 ms, GRU 256 0.351 against 0.202 ms.  (With plain R^T the split paid only from
 * 640 KiB, one core's L2: each step's product was bound by the strided reads, not by the core.)
 * The tests set 0 (always) and -1 (never) to check both paths on small layers. */
static int64_t g_split_min_floats = 32768;

OPT_API int64_t optcli_recurrent_split_from(int64_t floats) {
    int64_t old = g_split_min_floats;
    if (floats >= -1) g_split_min_floats = floats;
    return old;
}

typedef struct {
    int cell, flags, direction;
    int64_t dirs, seq, batch, hidden, gates;
    const float *xp, *rt, *rbh, *qscale, *p, *h0, *c0;
    const int8_t *rq;     /* FLAG_QUANTIZE_H: R's integers as int8 in vpdpbusd's panels, or NULL */
    const int32_t *rqsum; /* their column sums [dirs, 4H] */
    const int32_t *lens;
    float *y, *yh, *yc;
    const int32_t *acts;
    const float *alphas, *betas;
    float clip;
    int64_t split_min_floats; /* R's size from which the split path runs (-1: never) */
    int failed; /* set by an item whose scratch could not be had */
} rnn_t;

/* R^T in panels of PANEL columns, each panel's K rows one after another and PANEL_PAD rows of
 * padding after them: element (i, col) of a direction's [K, N] R^T is at (col / PANEL) * (K +
 * PANEL_PAD) * PANEL + i * PANEL + col % PANEL, the columns padded to a whole panel
 * (optcli/native/recurrent.py packs it).  Plain R^T put the rows of a column block N floats apart:
 * 4 KiB for an LSTM of 256 units, a new page per row, which the prefetchers do not follow, so a
 * layer whose R outgrows L2 ran at ~75 GB/s against onnxruntime's ~110 (LSTM 256 units: 1.56x its
 * time; 1.30x in panels, 512 units 1.53x -> 1.04x).  A panel row is one 64-byte line: one AVX-512
 * vector, two AVX2 ones.  The padding row keeps panels from starting 4 KiB apart (K = 128: the
 * streams of a block fell in one L1 set, 1.18x slower than plain R^T). */
#define PANEL 16
#define PANEL_PAD 1

/* Floats from one panel to the next, for K rows. */
static inline int64_t panel_stride(int64_t k) {
    return (k + PANEL_PAD) * PANEL;
}

/* The start of direction d's panels: N columns (padded to a whole panel) of K rows each. */
static inline const float *panels_of(const float *rt, int64_t d, int64_t k, int64_t n) {
    return rt + d * ((n + PANEL - 1) / PANEL) * panel_stride(k);
}

/* Columns [c, c + nv * VL) of the product below (c a multiple of PANEL), in nv vector accumulators
 * (nv a constant once inlined, so the accumulators live in registers): nv independent FMA chains,
 * two per panel, each reading its half of the panel front to back. */
ALWAYS_INLINE void gemv_block(float *g, const float *h, const float *rp, int64_t k, int64_t c, const int nv) {
    v8f a[12];
    const int64_t stride = panel_stride(k);
    const float *panel = rp + c / PANEL * stride;
    for (int q = 0; q < nv; q++) a[q] = vload(g + q * VL);
    for (int64_t i = 0; i < k; i++) {
        v8f s = vsplat(h[i]);
        for (int q = 0; q < nv; q++) a[q] += s * vload(panel + q / 2 * stride + q % 2 * VL + i * PANEL);
    }
    for (int q = 0; q < nv; q++) vstore(g + q * VL, a[q]);
}

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#define HAVE_GEMV16 1
typedef float v16f __attribute__((vector_size(64)));
#define GEMV16 __attribute__((target("arch=x86-64-v4")))

/* gemv_block with one AVX-512 vector per panel (whole panels from column c). */
GEMV16 ALWAYS_INLINE void gemv_block16(float *g, const float *h, const float *rp, int64_t k, int64_t c, const int nv) {
    v16f a[12];
    const int64_t stride = panel_stride(k);
    const float *panel = rp + c / PANEL * stride;
    for (int q = 0; q < nv; q++) memcpy(&a[q], g + q * PANEL, sizeof a[q]);
    for (int64_t i = 0; i < k; i++) {
        const float hi = h[i];
        const v16f s = {hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi};
        for (int q = 0; q < nv; q++) {
            v16f r;
            memcpy(&r, panel + q * stride + i * PANEL, sizeof r);
            a[q] += s * r;
        }
    }
    for (int q = 0; q < nv; q++) memcpy(g + q * PANEL, &a[q], sizeof a[q]);
}

/* The whole panels of gemv_rows' range, n a multiple of PANEL: 12 panels at a time, then 8, 4, 1. */
GEMV16 static void gemv_panels16(float *g, const float *h, const float *rp, int64_t k, int64_t c0, int64_t n) {
    int64_t j = 0;
    for (; j + 12 * PANEL <= n; j += 12 * PANEL) gemv_block16(g + j, h, rp, k, c0 + j, 12);
    for (; j + 8 * PANEL <= n; j += 8 * PANEL) gemv_block16(g + j, h, rp, k, c0 + j, 8);
    for (; j + 4 * PANEL <= n; j += 4 * PANEL) gemv_block16(g + j, h, rp, k, c0 + j, 4);
    for (; j < n; j += PANEL) gemv_block16(g + j, h, rp, k, c0 + j, 1);
}
#endif

/* Which product the steps run: 16 lanes (AVX-512, where the CPU has it) or 8; the tests pick.  Set
 * on first use (every writer stores the same value). */
static int g_gemv_lanes;

static int gemv_wide_available(void) {
#ifdef HAVE_GEMV16
    return opt_cpu_has_avx512();
#else
    return 0;
#endif
}

static inline int gemv_lanes(void) {
    int lanes = __atomic_load_n(&g_gemv_lanes, __ATOMIC_RELAXED);
    if (!lanes) {
        lanes = gemv_wide_available() ? 16 : 8;
        __atomic_store_n(&g_gemv_lanes, lanes, __ATOMIC_RELAXED);
    }
    return lanes;
}

OPT_API int optcli_recurrent_lanes(int lanes) {
    if (lanes == 0) __atomic_store_n(&g_gemv_lanes, gemv_wide_available() ? 16 : 8, __ATOMIC_RELAXED);
    else if (lanes == 8 || (lanes == 16 && gemv_wide_available())) __atomic_store_n(&g_gemv_lanes, lanes, __ATOMIC_RELAXED);
    else if (lanes != -1) return -1;
    return gemv_lanes();
}

/* g += h[0:k] @ R^T[0:k, col], column by column (a range's ends that are not whole panels). */
static inline float gemv_column(float g, const float *h, const float *rp, int64_t k, int64_t col) {
    const float *r = rp + col / PANEL * panel_stride(k) + col % PANEL;
    for (int64_t i = 0; i < k; i++) g += h[i] * r[i * PANEL];
    return g;
}

/* g[0:n] += h[0:k] @ R^T[0:k, c0:c0 + n] (rp: a direction's panels): column by column up to a
 * panel's start, then whole panels: with AVX-512 twelve vectors of 16 columns at a time (enough
 * independent FMAs to hide their latency), else twelve of 8 (96 columns), then fewer; the last
 * columns one by one.  Every column sums over i in order on every path: the same results. */
HOT_CLONES static void gemv_rows(float *g, const float *h, const float *rp, int64_t k, int64_t c0, int64_t n) {
    int64_t j = 0;
    for (; j < n && (c0 + j) % PANEL; j++) g[j] = gemv_column(g[j], h, rp, k, c0 + j);
#ifdef HAVE_GEMV16
    if (gemv_lanes() == 16) {
        const int64_t whole = (n - j) / PANEL * PANEL;
        gemv_panels16(g + j, h, rp, k, c0 + j, whole);
        j += whole;
    }
#endif
    for (; j + 12 * VL <= n; j += 12 * VL) gemv_block(g + j, h, rp, k, c0 + j, 12);
    for (; j + 8 * VL <= n; j += 8 * VL) gemv_block(g + j, h, rp, k, c0 + j, 8);
    for (; j + 4 * VL <= n; j += 4 * VL) gemv_block(g + j, h, rp, k, c0 + j, 4);
    for (; j + 2 * VL <= n; j += 2 * VL) gemv_block(g + j, h, rp, k, c0 + j, 2);
    for (; j + VL <= n; j += VL) gemv_block(g + j, h, rp, k, c0 + j, 1); /* the first half of a panel */
    for (; j < n; j++) g[j] = gemv_column(g[j], h, rp, k, c0 + j);
}

/* Gate activation number `which` of direction d (acts, alphas, betas hold 3 per direction). */
HOT_CLONES static void gate_act(const rnn_t *a, int64_t d, int which, float *v, int64_t n) {
    int64_t at = d * 3 + which;
    if (a->flags & FLAG_CLIP) clip_span(v, n, -a->clip, a->clip);
    act_span(v, n, a->acts[at], a->alphas[at], a->betas[at]);
}

/* The steps below compute hidden units [j0, j1) of one row: the whole row (j0 = 0, j1 = H) in the
 * sequential path, a slice of it per work item in the split path (`split_step`).  g holds the
 * row's G * H gate values, its columns of [j0, j1) preloaded with x @ W^T + biases; hin is h(t-1)
 * (read whole: the product needs all of it), hout receives h(t) for [j0, j1) (it may be hin: h
 * is read whole before any of it is written); c is the row's cell state, updated in place for
 * [j0, j1); tmp has H floats. */

/* The LSTM's gates of n units when they are the defaults (f sigmoid, g and h tanh) with no
 * peepholes, input_forget or clip: one pass, 8 units at a time held in registers, where the general
 * path below makes five passes over memory (each gate's activation, the cell update, a copy of c
 * and its tanh, the output), tanh 4 lanes at a time.  A voice detector's 64-unit step took ~1.4 us,
 * the product of h and R^T ~0.4 of it. */
ALWAYS_INLINE void lstm_gates8(const float *gi, const float *go, const float *gf, const float *gc, float *c,
                               float *h) {
    v8f cn = sigmoid8(vload(gf)) * vload(c) + sigmoid8(vload(gi)) * tanh8(vload(gc));
    vstore(c, cn);
    vstore(h, sigmoid8(vload(go)) * tanh8(cn));
}

ALWAYS_INLINE void lstm_default_gates(const float *gi, const float *go, const float *gf, const float *gc, float *c,
                                      float *h, int64_t n) {
    int64_t j = 0;
    for (; j + VL <= n; j += VL) lstm_gates8(gi + j, go + j, gf + j, gc + j, c + j, h + j);
    if (j < n) { /* the last n % 8 units through zero-padded copies */
        float t[6][VL] = {{0}};
        const int r = (int)(n - j);
        copy_short(t[0], gi + j, r);
        copy_short(t[1], go + j, r);
        copy_short(t[2], gf + j, r);
        copy_short(t[3], gc + j, r);
        copy_short(t[4], c + j, r);
        lstm_gates8(t[0], t[1], t[2], t[3], t[4], t[5]);
        copy_short(c + j, t[4], r);
        copy_short(h + j, t[5], r);
    }
}

/* Whether direction d of an LSTM takes lstm_default_gates. */
static int lstm_default(const rnn_t *a, int64_t d) {
    const int32_t *act = a->acts + 3 * d;
    return !a->p && !(a->flags & (FLAG_INPUT_FORGET | FLAG_CLIP)) && act[0] == ACT_SIGMOID && act[1] == ACT_TANH &&
           act[2] == ACT_TANH;
}

/* Lane-wise a < b ? a : b and a > b ? a : b (a NaN in a gives b: left out of a range). */
ALWAYS_INLINE v8f vmin_keep(v8f a, v8f b) {
    v8i m = a < b;
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
}

ALWAYS_INLINE v8f vmax_keep(v8f a, v8f b) {
    v8i m = a > b;
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
}

/* a / scale clamped to [low, top] (whole numbers) and rounded half to even: adding and taking away
 * 1.5 * 2^23 rounds a float under 2^22 in magnitude to an integer in the default rounding mode (the
 * scalar rintf's result); a NaN stays NaN. */
ALWAYS_INLINE v8f quantize8(v8f v, v8f scale, v8f low, v8f top) {
    const v8f magic = vsplat(12582912.0f);
    v = v / scale;
    v8i below = v < low, above = v > top;
    v = (v8f)((below & (v8i)low) | (~below & (v8i)v));
    v = (v8f)((above & (v8i)top) | (~above & (v8i)v));
    return (v + magic) - magic;
}

/* onnxruntime's dynamic quantization of one GEMM operand (rnn_helpers.cc ComputeGemm, MLAS): the
 * range [min(a, 0), max(a, 0)], scale range / 255 (1 for all zeros), zero point rint(clamp(-min /
 * scale, 0, 255)), q = clamp(rint(a / scale), -zp, 255 - zp): the uint8 value less its zero point,
 * an exact integer in float.  Eight lanes at a time (plain loops stay scalar: compilers keep a float
 * min / max or sum in order without -ffast-math): 12800 values took 12 us as scalar loops.  A NaN
 * is left out of the range and quantizes to NaN.  Returns 1 where an element is not finite (the
 * caller's fallback defines those), else 0; params receives scale and zero point. */
HOT_CLONES static int dynamic_quantize(const float *a, int64_t n, float *q, float *params) {
    v8f lo8 = vsplat(0.0f), hi8 = vsplat(0.0f), spread8 = vsplat(0.0f);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        const v8f v = vload(a + i);
        lo8 = vmin_keep(v, lo8);
        hi8 = vmax_keep(v, hi8);
        spread8 += v - v; /* 0 for finite elements, NaN once one is not */
    }
    float lo = 0.0f, hi = 0.0f, spread = 0.0f;
    for (int k = 0; k < VL; k++) {
        lo = lo8[k] < lo ? lo8[k] : lo;
        hi = hi8[k] > hi ? hi8[k] : hi;
        spread += spread8[k];
    }
    for (; i < n; i++) {
        lo = a[i] < lo ? a[i] : lo;
        hi = a[i] > hi ? a[i] : hi;
        spread += a[i] - a[i];
    }
    const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f;
    float z = 0.0f - lo / scale;
    z = z < 0.0f ? 0.0f : z > 255.0f ? 255.0f : z;
    const float zp = rintf(z), low = -zp, top = 255.0f - zp;
    const v8f scale8 = vsplat(scale), low8 = vsplat(low), top8 = vsplat(top);
    for (i = 0; i + VL <= n; i += VL) vstore(q + i, quantize8(vload(a + i), scale8, low8, top8));
    for (; i < n; i++) {
        const float v = a[i] / scale;
        q[i] = rintf(v < low ? low : v > top ? top : v);
    }
    params[0] = scale;
    params[1] = zp;
    return spread != 0.0f || spread != spread;
}

OPT_API int optcli_dynamic_quantize_f32(const float *a, int64_t n, float *q, float *params) {
    if (!a || !q || !params || n < 0) return OPT_EINVAL;
    return dynamic_quantize(a, n, q, params);
}

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#include <immintrin.h>
#define HAVE_QGEMV_VNNI 1

/* out[0:16 np] = hu[0:4 k4] @ R (int32, exact): hu the quantized h as bytes (q + zp, 0..255), R's
 * int8 integers in panels of 16 columns, each panel k4 groups of [16 columns][4 rows] (vpdpbusd
 * adds four u8 x s8 products into each int32 lane: 64 x 16 bytes per step of a 64-unit LSTM, in
 * L1, where the float product streamed 64 KiB from L2).  Four panels at a time. */
__attribute__((target(VNNI512_TARGET))) static void qgemv_vnni512(int32_t *out, const uint8_t *hu, const int8_t *rq,
                                                                   int64_t k4, int64_t np) {
    int64_t p = 0;
    for (; p + 4 <= np; p += 4) {
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *w = rq + p * k4 * 64;
        for (int64_t g = 0; g < k4; g++) {
            int32_t four;
            memcpy(&four, hu + 4 * g, 4);
            const __m512i x = _mm512_set1_epi32(four);
            a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512(w + g * 64));
            a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512(w + (k4 + g) * 64));
            a2 = _mm512_dpbusd_epi32(a2, x, _mm512_loadu_si512(w + (2 * k4 + g) * 64));
            a3 = _mm512_dpbusd_epi32(a3, x, _mm512_loadu_si512(w + (3 * k4 + g) * 64));
        }
        _mm512_storeu_si512(out + p * 16, a0);
        _mm512_storeu_si512(out + p * 16 + 16, a1);
        _mm512_storeu_si512(out + p * 16 + 32, a2);
        _mm512_storeu_si512(out + p * 16 + 48, a3);
    }
    for (; p < np; p++) {
        __m512i a0 = _mm512_setzero_si512();
        const int8_t *w = rq + p * k4 * 64;
        for (int64_t g = 0; g < k4; g++) {
            int32_t four;
            memcpy(&four, hu + 4 * g, 4);
            a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(four), _mm512_loadu_si512(w + g * 64));
        }
        _mm512_storeu_si512(out + p * 16, a0);
    }
}
#endif

/* The input projection of a DynamicQuantizeLSTM: rows of X already quantized (q, the uint8 values
 * less zp, as float), out[r, j] = float(q[r] @ W[:, j]) * (x_scale * col_scale[j]) (+ bias[j]), the
 * product exact in int32 by vpdpbusd on W's int8 panels (the recurrent product's layout) and every
 * float operation the numpy path's, in its order: the same numbers.  Rows in bands over the pool.
 * DynamicQuantizeMatMul takes it too (bias optional there). */
#ifdef HAVE_QGEMV_VNNI
typedef struct {
    const float *q;
    float zp, x_scale;
    int64_t rows, k, n, band;
    const int8_t *wq;
    const int32_t *wsum;
    const float *col_scale, *bias;
    float *out;
} qrows_t;

#define QROWS_BAND 8 /* rows per work item */
#define QROWS_SPLIT_MACS (1 << 18) /* u8 x s8 products from which the rows go over the pool */

/* Built for the baseline x86-64 (no clones: no FMA), so the product by the scale and the bias's add
 * round one after the other, as numpy's two passes do; an FMA here would change the last bit. */
static void qrows_item(void *ctx, int64_t item) {
    const qrows_t *t = ctx;
    const int64_t k4 = (t->k + 3) / 4, np = (t->n + 15) / 16;
    uint8_t hu[4 * k4];
    int32_t acc[16 * np];
    const int32_t z = (int32_t)t->zp;
    for (int64_t r = item * t->band; r < (item + 1) * t->band && r < t->rows; r++) {
        const float *q = t->q + r * t->k;
        for (int64_t i = 0; i < 4 * k4; i++) hu[i] = i < t->k ? (uint8_t)(int32_t)(q[i] + t->zp) : 0;
        qgemv_vnni512(acc, hu, t->wq, k4, np);
        float *o = t->out + r * t->n;
        for (int64_t j = 0; j < t->n; j++) {
            const float s = t->x_scale * t->col_scale[j];
            o[j] = (float)(acc[j] - z * t->wsum[j]) * s;
        }
        if (t->bias) { /* an add of 0 would turn -0 into +0: none without a bias, as numpy's path */
            for (int64_t j = 0; j < t->n; j++) o[j] += t->bias[j];
        }
    }
}
#endif

OPT_API int optcli_dynamic_qrows_f32(const float *q, const float *qp, const int8_t *wq, const int32_t *wsum,
                                     const float *col_scale, const float *bias, float *out, const int64_t *geom) {
    const int64_t rows = geom[0], k = geom[1], n = geom[2];
    if (!q || !qp || !wq || !wsum || !col_scale || !out || rows < 0 || k < 1 || k > 4096 || n < 1 ||
        n > 4096) { /* a work item's scratch on its stack: 16 KiB of sums, 4 KiB of bytes at most */
        return OPT_EINVAL;
    }
#ifdef HAVE_QGEMV_VNNI
    optcli_qgemm_variant(-1);
    if (opt_qconv_vnni512 != 1) return OPT_ENOTSUP;
    qrows_t t = {.q = q, .zp = qp[1], .x_scale = qp[0], .rows = rows, .k = k, .n = n, .band = QROWS_BAND,
                 .wq = wq, .wsum = wsum, .col_scale = col_scale, .bias = bias, .out = out};
    /* a small product on one core: the hand-off to a second costs more than it saves (a speech
     * model's [100, 64] x [64, 29] head: 10.5 us alone, 13.7 us split) */
    const int one = rows * k * n < QROWS_SPLIT_MACS;
    opt_parallel(qrows_item, &t, (rows + QROWS_BAND - 1) / QROWS_BAND, one ? 1 : 0);
    return 0;
#else
    return OPT_ENOTSUP;
#endif
}

/* FLAG_QUANTIZE_H's product: g[0:4H] += float(q @ R) * (scale * qscale[col]), q = h(t-1) quantized
 * as onnxruntime's dynamic GEMM quantizes its operand (`dynamic_quantize`).  q and R hold integers,
 * every partial sum under 2**24 (the caller's bound): exact in float32 in any order, and exact in
 * int32 where the CPU has AVX-512 VNNI and R fits int8 (rq given): (q + zp) @ R - zp * colsum(R), the
 * same numbers.  hq: H floats (the bytes of q + zp there, after q is read), acc: 4H. */
HOT_CLONES static void quantized_product(const rnn_t *a, int64_t d, float *g, const float *hin, float *hq,
                                         float *acc) {
    const int64_t H = a->hidden, N = 4 * H;
    float params[2];
    const int not_finite = dynamic_quantize(hin, H, hq, params);
    const float *qs = a->qscale + d * N, scale = params[0];
    (void)not_finite;
#ifdef HAVE_QGEMV_VNNI
    /* its scratch on the stack: 17 KiB at most; a NaN in h has no byte: the float product carries it */
    if (a->rq && opt_qconv_vnni512 == 1 && H <= 1024 && !not_finite) {
        const int64_t k4 = (H + 3) / 4, np = (N + 15) / 16;
        uint8_t hu[4 * k4];
        const float zp = params[1];
        for (int64_t i = 0; i < 4 * k4; i++) hu[i] = i < H ? (uint8_t)(int32_t)(hq[i] + zp) : 0;
        int32_t out[16 * np];
        qgemv_vnni512(out, hu, a->rq + d * np * k4 * 64, k4, np);
        const int32_t *sum = a->rqsum + d * N, z = (int32_t)zp;
        for (int64_t j = 0; j < N; j++) g[j] += (float)(out[j] - z * sum[j]) * (scale * qs[j]);
        return;
    }
#endif
    memset(acc, 0, (size_t)N * sizeof(float));
    gemv_rows(acc, hq, panels_of(a->rt, d, H, N), H, 0, N);
    for (int64_t j = 0; j < N; j++) g[j] += acc[j] * (scale * qs[j]);
}

/* One LSTM step (with FLAG_QUANTIZE_H, g already holds the product: `quantized_product`). */
HOT_CLONES static void lstm_range(const rnn_t *a, int64_t d, float *g, const float *hin, float *hout, float *c,
                                  float *tmp, int64_t j0, int64_t j1) {
    const int64_t H = a->hidden, n = j1 - j0;
    const float *rt = panels_of(a->rt, d, H, 4 * H), *p = a->p ? a->p + d * 3 * H : NULL;
    if (a->flags & FLAG_QUANTIZE_H) {
        /* added by quantized_product */
    } else if (n == H) {
        gemv_rows(g, hin, rt, H, 0, 4 * H); /* the four gates side by side: one product */
    } else {
        for (int q = 0; q < 4; q++) gemv_rows(g + q * H + j0, hin, rt, H, q * H + j0, n);
    }
    float *gi = g + j0, *go = g + H + j0, *gf = g + 2 * H + j0, *gc = g + 3 * H + j0;
    c += j0;
    if (lstm_default(a, d)) {
        lstm_default_gates(gi, go, gf, gc, c, hout + j0, n);
        return;
    }
    if (p) {
        for (int64_t j = 0; j < n; j++) {
            gi[j] += p[j0 + j] * c[j];
            gf[j] += p[2 * H + j0 + j] * c[j];
        }
    }
    if (!p && !(a->flags & FLAG_INPUT_FORGET) && n == H) {
        gate_act(a, d, 0, g, 3 * H); /* i, o, f side by side: one pass */
    } else {
        gate_act(a, d, 0, gi, n);
        if (a->flags & FLAG_INPUT_FORGET) {
            for (int64_t j = 0; j < n; j++) gf[j] = 1.0f - gi[j];
        } else {
            gate_act(a, d, 0, gf, n);
        }
    }
    gate_act(a, d, 1, gc, n);
    for (int64_t j = 0; j < n; j++) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    if (p) {
        for (int64_t j = 0; j < n; j++) go[j] += p[H + j0 + j] * c[j];
        gate_act(a, d, 0, go, n);
    } else if (a->flags & FLAG_INPUT_FORGET || n != H) {
        gate_act(a, d, 0, go, n);
    }
    memcpy(tmp, c, (size_t)n * sizeof(float));
    act_span(tmp, n, a->acts[d * 3 + 2], a->alphas[d * 3 + 2], a->betas[d * 3 + 2]);
    for (int64_t j = 0; j < n; j++) hout[j0 + j] = go[j] * tmp[j];
}

/* GRU, first half: z and r of [j0, j1), and rh = r * h(t-1) there.  g holds x @ W^T + Wb + Rb of z
 * and r (not of h: with linear_before_reset its Rb sits inside r * (...)). */
HOT_CLONES static void gru_gates(const rnn_t *a, int64_t d, float *g, const float *hin, float *rh, int64_t j0,
                                 int64_t j1) {
    const int64_t H = a->hidden, n = j1 - j0;
    const float *rt = panels_of(a->rt, d, H, 3 * H);
    if (n == H) {
        gemv_rows(g, hin, rt, H, 0, 2 * H); /* z and r side by side: one product */
    } else {
        gemv_rows(g + j0, hin, rt, H, j0, n);
        gemv_rows(g + H + j0, hin, rt, H, H + j0, n);
    }
    if (n == H) {
        gate_act(a, d, 0, g, 2 * H); /* z and r side by side: one pass */
    } else {
        gate_act(a, d, 0, g + j0, n);
        gate_act(a, d, 0, g + H + j0, n);
    }
    for (int64_t j = j0; j < j1; j++) rh[j] = g[H + j] * hin[j];
}

/* GRU, second half (rh of every unit known): the h gate and h(t) of [j0, j1).  With
 * linear_before_reset, tmp receives h(t-1) @ Rh^T for the range first. */
HOT_CLONES static void gru_out(const rnn_t *a, int64_t d, float *g, const float *hin, float *hout, const float *rh,
                               float *tmp, int64_t j0, int64_t j1) {
    const int64_t H = a->hidden, n = j1 - j0;
    const float *rt = panels_of(a->rt, d, H, 3 * H), *rbh = a->rbh + d * H;
    float *gz = g + j0, *gr = g + H + j0, *gh = g + 2 * H + j0;
    if (a->flags & FLAG_LINEAR_BEFORE_RESET) {
        memset(tmp, 0, (size_t)n * sizeof(float));
        gemv_rows(tmp, hin, rt, H, 2 * H + j0, n);
        for (int64_t j = 0; j < n; j++) gh[j] += gr[j] * (tmp[j] + rbh[j0 + j]);
    } else {
        for (int64_t j = 0; j < n; j++) gh[j] += rbh[j0 + j];
        gemv_rows(gh, rh, rt, H, 2 * H + j0, n);
    }
    gate_act(a, d, 1, gh, n);
    for (int64_t j = 0; j < n; j++) hout[j0 + j] = (1.0f - gz[j]) * gh[j] + gz[j] * hin[j0 + j];
}

HOT_CLONES static void rnn_range(const rnn_t *a, int64_t d, float *g, const float *hin, float *hout, int64_t j0,
                                 int64_t j1) {
    const int64_t H = a->hidden, n = j1 - j0;
    gemv_rows(g + j0, hin, panels_of(a->rt, d, H, H), H, j0, n);
    gate_act(a, d, 0, g + j0, n);
    memcpy(hout + j0, g + j0, (size_t)n * sizeof(float));
}

/* Whether row b of direction d is still inside its sequence at step s, and the time t it is at. */
static int row_time(const rnn_t *a, int64_t d, int64_t b, int64_t s, int64_t *t) {
    const int64_t len = a->lens ? a->lens[b] : a->seq;
    const int reverse = a->direction == DIR_REVERSE || (a->direction == DIR_BIDIRECTIONAL && d == 1);
    *t = reverse ? len - 1 - s : s;
    return s < len;
}

/* Item d * batch + b: direction d of batch row b, its whole sequence. */
static void rnn_item(void *ctx, int64_t item) {
    rnn_t *a = ctx;
    const int64_t H = a->hidden, G = a->gates, B = a->batch, S = a->seq;
    const int64_t d = item / B, b = item % B;
    const int64_t len = a->lens ? a->lens[b] : S;
    float *g = malloc((size_t)(G * H + 4 * H + (a->flags & FLAG_QUANTIZE_H ? 5 * H : 0)) * sizeof(float));
    if (!g) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *h = g + G * H, *c = h + H, *tmp = c + H, *rh = tmp + H, *hq = rh + H;
    const int64_t state = (d * B + b) * H;
    if (a->h0) memcpy(h, a->h0 + state, (size_t)H * sizeof(float));
    else memset(h, 0, (size_t)H * sizeof(float));
    if (a->c0) memcpy(c, a->c0 + state, (size_t)H * sizeof(float));
    else memset(c, 0, (size_t)H * sizeof(float));
    int64_t t;
    for (int64_t s = 0; row_time(a, d, b, s, &t); s++) {
        memcpy(g, a->xp + ((d * S + t) * B + b) * G * H, (size_t)(G * H) * sizeof(float));
        if (a->cell == CELL_LSTM) {
            if (a->flags & FLAG_QUANTIZE_H) quantized_product(a, d, g, h, hq, hq + H);
            lstm_range(a, d, g, h, h, c, tmp, 0, H);
        } else if (a->cell == CELL_GRU) {
            gru_gates(a, d, g, h, rh, 0, H);
            gru_out(a, d, g, h, h, rh, tmp, 0, H);
        } else {
            rnn_range(a, d, g, h, h, 0, H);
        }
        if (a->y) memcpy(a->y + ((t * a->dirs + d) * B + b) * H, h, (size_t)H * sizeof(float));
    }
    if (a->y) {
        for (int64_t t = len; t < S; t++) memset(a->y + ((t * a->dirs + d) * B + b) * H, 0, (size_t)H * sizeof(float));
    }
    if (len == 0) { /* a row of length 0 ends in zeros, not its initial state (as onnxruntime) */
        memset(h, 0, (size_t)H * sizeof(float));
        memset(c, 0, (size_t)H * sizeof(float));
    }
    if (a->yh) memcpy(a->yh + state, h, (size_t)H * sizeof(float));
    if (a->yc) memcpy(a->yc + state, c, (size_t)H * sizeof(float));
    free(g);
}

/* The split path: one time step at a time, each row's hidden units cut into `chunks` slices, one
 * work item per (direction, row, slice), so a big layer's R (1 MiB for an LSTM of 256 units,
 * more than a core's L2) is read half by each core, from its own cache.  State per row: g (G * H),
 * h twice (read h(t-1), write h(t), swapped between steps), c, rh, and tmp per slice. */
typedef struct {
    rnn_t *a;
    int64_t chunks, s, cur; /* cur: which of the two h buffers holds h(t-1) */
    int phase;              /* GRU without linear_before_reset: 0 gates, 1 output */
    float *g, *h[2], *c, *rh, *tmp;
} split_t;

static void split_item(void *ctx, int64_t item) {
    split_t *sp = ctx;
    const rnn_t *a = sp->a;
    const int64_t H = a->hidden, G = a->gates, B = a->batch, S = a->seq;
    const int64_t chunk = item % sp->chunks, row = item / sp->chunks, d = row / B, b = row % B;
    const int64_t per = (H + sp->chunks - 1) / sp->chunks;
    const int64_t j0 = chunk * per, j1 = j0 + per < H ? j0 + per : H;
    if (j0 >= j1) return;
    float *g = sp->g + row * G * H, *c = sp->c + row * H, *rh = sp->rh + row * H, *tmp = sp->tmp + item * per;
    const float *hin = sp->h[sp->cur] + row * H;
    float *hout = sp->h[1 - sp->cur] + row * H;
    int64_t t;
    if (!row_time(a, d, b, sp->s, &t)) { /* past this row's length: its state stays */
        if (sp->phase == 0) memcpy(hout + j0, hin + j0, (size_t)(j1 - j0) * sizeof(float));
        return;
    }
    if (sp->phase == 0) {
        const float *x = a->xp + ((d * S + t) * B + b) * G * H;
        for (int64_t q = 0; q < G; q++) memcpy(g + q * H + j0, x + q * H + j0, (size_t)(j1 - j0) * sizeof(float));
    }
    if (a->cell == CELL_LSTM) {
        lstm_range(a, d, g, hin, hout, c, tmp, j0, j1);
    } else if (a->cell == CELL_RNN) {
        rnn_range(a, d, g, hin, hout, j0, j1);
    } else if (a->flags & FLAG_LINEAR_BEFORE_RESET) {
        gru_gates(a, d, g, hin, rh, j0, j1);
        gru_out(a, d, g, hin, hout, rh, tmp, j0, j1);
    } else if (sp->phase == 0) {
        gru_gates(a, d, g, hin, rh, j0, j1);
    } else {
        gru_out(a, d, g, hin, hout, rh, tmp, j0, j1);
    }
    if (a->y && (a->cell != CELL_GRU || a->flags & FLAG_LINEAR_BEFORE_RESET || sp->phase == 1)) {
        memcpy(a->y + ((t * a->dirs + d) * B + b) * H + j0, hout + j0, (size_t)(j1 - j0) * sizeof(float));
    }
}

static int run_split(rnn_t *a, int64_t chunks) {
    const int64_t H = a->hidden, G = a->gates, rows = a->dirs * a->batch, S = a->seq;
    const int64_t per = (H + chunks - 1) / chunks;
    float *mem = malloc((size_t)(rows * (G * H + 4 * H) + rows * chunks * per) * sizeof(float));
    if (!mem) return OPT_ENOMEM;
    split_t sp = {.a = a, .chunks = chunks, .g = mem};
    sp.h[0] = mem + rows * G * H;
    sp.h[1] = sp.h[0] + rows * H;
    sp.c = sp.h[1] + rows * H;
    sp.rh = sp.c + rows * H;
    sp.tmp = sp.rh + rows * H;
    if (a->h0) memcpy(sp.h[0], a->h0, (size_t)(rows * H) * sizeof(float));
    else memset(sp.h[0], 0, (size_t)(rows * H) * sizeof(float));
    if (a->c0) memcpy(sp.c, a->c0, (size_t)(rows * H) * sizeof(float));
    else memset(sp.c, 0, (size_t)(rows * H) * sizeof(float));
    const int two_phases = a->cell == CELL_GRU && !(a->flags & FLAG_LINEAR_BEFORE_RESET);
    for (int64_t s = 0; s < S; s++) {
        sp.s = s;
        for (sp.phase = 0; sp.phase <= two_phases; sp.phase++) opt_parallel(split_item, &sp, rows * chunks, 0);
        sp.cur = 1 - sp.cur;
    }
    for (int64_t row = 0; row < rows; row++) {
        const int64_t b = row % a->batch, d = row / a->batch, len = a->lens ? a->lens[b] : S;
        float *h = sp.h[sp.cur] + row * H, *c = sp.c + row * H;
        if (a->y) {
            for (int64_t t = len; t < S; t++) {
                memset(a->y + ((t * a->dirs + d) * a->batch + b) * H, 0, (size_t)H * sizeof(float));
            }
        }
        if (len == 0) {
            memset(h, 0, (size_t)H * sizeof(float));
            memset(c, 0, (size_t)H * sizeof(float));
        }
        if (a->yh) memcpy(a->yh + row * H, h, (size_t)H * sizeof(float));
        if (a->yc) memcpy(a->yc + row * H, c, (size_t)H * sizeof(float));
    }
    free(mem);
    return 0;
}

/* Slices per row for the split path, 1 for the sequential one: split only where cores would sit
 * idle (fewer rows than threads) and R outgrows a core's cache (g_split_min_floats), where a fork
 * and join per step (a few microseconds) pays; slices of 32 units or more. */
static int64_t split_chunks(const rnn_t *a) {
    const int64_t rows = a->dirs * a->batch, threads = optcli_get_num_threads();
    if (a->flags & FLAG_QUANTIZE_H) return 1; /* each step's product needs the whole row quantized first */
    if (a->split_min_floats == 0) return a->hidden < 3 ? a->hidden : 3; /* the tests: uneven slices, any size */
    if (a->split_min_floats < 0 || rows >= threads || a->gates * a->hidden * a->hidden < a->split_min_floats) return 1;
    int64_t chunks = threads / rows;
    while (chunks > 1 && a->hidden / chunks < 32) chunks--;
    return chunks;
}

OPT_API int optcli_recurrent_f32(int cell, const float *xp, const float *rt, const float *rbh, const float *qscale,
                                 const int8_t *rq, const int32_t *rqsum, const float *p, const float *h0, const float *c0, const int32_t *lens, float *y, float *yh, float *yc,
                                 const int64_t *geom, const int32_t *acts, const float *alphas, const float *betas,
                                 float clip, int flags) {
    rnn_t a = {.cell = cell, .flags = flags, .direction = (int)geom[4], .dirs = geom[0], .seq = geom[1],
               .batch = geom[2], .hidden = geom[3], .xp = xp, .rt = rt, .rbh = rbh, .qscale = qscale, .rq = rq, .rqsum = rqsum, .p = p, .h0 = h0, .c0 = c0,
               .lens = lens, .y = y, .yh = yh, .yc = yc, .acts = acts, .alphas = alphas, .betas = betas,
               .clip = clip, .split_min_floats = g_split_min_floats};
    if (cell < CELL_LSTM || cell > CELL_RNN || a.direction < DIR_FORWARD || a.direction > DIR_BIDIRECTIONAL) {
        return OPT_EINVAL;
    }
    if (a.dirs != (a.direction == DIR_BIDIRECTIONAL ? 2 : 1) || a.seq < 0 || a.batch < 0 || a.hidden < 1) {
        return OPT_EINVAL;
    }
    if (a.hidden > (1 << 20) || a.seq > ((int64_t)1 << 40) || a.batch > ((int64_t)1 << 30)) return OPT_EINVAL;
    a.gates = cell == CELL_LSTM ? 4 : cell == CELL_GRU ? 3 : 1;
    if (cell == CELL_GRU && !rbh) return OPT_EINVAL;
    if (cell != CELL_LSTM && (p || c0 || yc || (flags & FLAG_QUANTIZE_H))) return OPT_EINVAL;
    if (!(flags & FLAG_QUANTIZE_H) != !qscale || !rq != !rqsum || (rq && !qscale)) return OPT_EINVAL;
    if (rq) optcli_qgemm_variant(-1); /* the dot-product path, picked once per process */
    if ((flags & FLAG_CLIP) && !(clip >= 0.0f)) return OPT_EINVAL;
    for (int64_t i = 0; i < 3 * a.dirs; i++) {
        if (acts[i] < ACT_NONE || acts[i] >= ACT_COUNT) return OPT_EINVAL;
    }
    if (lens) {
        for (int64_t b = 0; b < a.batch; b++) {
            if (lens[b] < 0 || lens[b] > a.seq) return OPT_EINVAL;
        }
    }
    const int64_t chunks = split_chunks(&a);
    if (chunks > 1) return run_split(&a, chunks);
    opt_parallel(rnn_item, &a, a.dirs * a.batch, 0);
    return a.failed ? OPT_ENOMEM : 0;
}
