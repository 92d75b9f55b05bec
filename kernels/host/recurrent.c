/* The time loop of the recurrent layers, LSTM, GRU and RNN (ONNX semantics), on the pool.
 *
 * What stays in numpy (optcli/ops/recurrent.py): the input projection of every time step as one
 * GEMM (X @ W^T, the biases folded in), which is where a long sequence spends its multiply-adds
 * in BLAS.  What is here: the part that cannot be batched over time, h(t-1) @ R^T and the gates,
 * one step after another.  Per step numpy paid ~10 small calls (tens of microseconds) for work
 * that takes one to a few microseconds at the hidden sizes of speech and OCR models (64-512).
 *
 * Work items are (direction, batch row) pairs: each runs its whole sequence alone, so a
 * bidirectional layer's two directions run on two cores.  R is given transposed ([H, G*H]) so the
 * product is a sum of rows of R^T scaled by h's elements: vectorised along the gates with no
 * horizontal sums, its accumulators held in registers across the whole of h.
 *
 * Gates follow ONNX: LSTM i, o, f, c (peepholes i, o, f); GRU z, r, h; RNN one.  Activations are
 * the fused-epilogue codes of simd.h (the ONNX names with no code run in numpy).  A row whose
 * sequence length is shorter than the sequence stops there: later steps of y are zero, y_h / y_c
 * hold the state after its last step (zeros for a length of 0), and the reverse direction starts at
 * its last step.
 */
#include <stdlib.h>

#include "optcli_native.h"
#include "simd.h"

enum { CELL_LSTM = 0, CELL_GRU = 1, CELL_RNN = 2 };
enum { FLAG_INPUT_FORGET = 1, FLAG_LINEAR_BEFORE_RESET = 2, FLAG_CLIP = 4 };
enum { DIR_FORWARD = 0, DIR_REVERSE = 1, DIR_BIDIRECTIONAL = 2 };

typedef struct {
    int cell, flags, direction;
    int64_t dirs, seq, batch, hidden, gates;
    const float *xp, *rt, *rbh, *p, *h0, *c0;
    const int32_t *lens;
    float *y, *yh, *yc;
    const int32_t *acts;
    const float *alphas, *betas;
    float clip;
    int failed; /* set by an item whose scratch could not be had */
} rnn_t;

/* g[0:n] += h[0:k] @ rt[0:k, 0:n] (rows of rt ld floats apart): 64 columns at a time in eight
 * vector accumulators (enough independent FMAs to hide their latency), then 8, then one. */
HOT_CLONES static void gemv_rows(float *g, const float *h, const float *rt, int64_t k, int64_t n, int64_t ld) {
    int64_t j = 0;
    for (; j + 8 * VL <= n; j += 8 * VL) {
        v8f a0 = vload(g + j), a1 = vload(g + j + VL), a2 = vload(g + j + 2 * VL), a3 = vload(g + j + 3 * VL);
        v8f a4 = vload(g + j + 4 * VL), a5 = vload(g + j + 5 * VL), a6 = vload(g + j + 6 * VL);
        v8f a7 = vload(g + j + 7 * VL);
        for (int64_t i = 0; i < k; i++) {
            const float *r = rt + i * ld + j;
            v8f s = vsplat(h[i]);
            a0 += s * vload(r);
            a1 += s * vload(r + VL);
            a2 += s * vload(r + 2 * VL);
            a3 += s * vload(r + 3 * VL);
            a4 += s * vload(r + 4 * VL);
            a5 += s * vload(r + 5 * VL);
            a6 += s * vload(r + 6 * VL);
            a7 += s * vload(r + 7 * VL);
        }
        vstore(g + j, a0);
        vstore(g + j + VL, a1);
        vstore(g + j + 2 * VL, a2);
        vstore(g + j + 3 * VL, a3);
        vstore(g + j + 4 * VL, a4);
        vstore(g + j + 5 * VL, a5);
        vstore(g + j + 6 * VL, a6);
        vstore(g + j + 7 * VL, a7);
    }
    for (; j + VL <= n; j += VL) {
        v8f a = vload(g + j);
        for (int64_t i = 0; i < k; i++) a += vsplat(h[i]) * vload(rt + i * ld + j);
        vstore(g + j, a);
    }
    for (; j < n; j++) {
        float a = g[j];
        for (int64_t i = 0; i < k; i++) a += h[i] * rt[i * ld + j];
        g[j] = a;
    }
}

/* Gate activation number `which` of direction d (acts, alphas, betas hold 3 per direction). */
static void gate_act(const rnn_t *a, int64_t d, int which, float *v, int64_t n) {
    int64_t at = d * 3 + which;
    if (a->flags & FLAG_CLIP) clip_span(v, n, -a->clip, a->clip);
    act_span(v, n, a->acts[at], a->alphas[at], a->betas[at]);
}

/* One LSTM step of one row: g (4H) holds x @ W^T + biases, h and c the state, updated in place. */
HOT_CLONES static void lstm_step(const rnn_t *a, int64_t d, float *g, float *h, float *c, float *tmp) {
    const int64_t H = a->hidden;
    const float *rt = a->rt + d * H * 4 * H, *p = a->p ? a->p + d * 3 * H : NULL;
    gemv_rows(g, h, rt, H, 4 * H, 4 * H);
    float *gi = g, *go = g + H, *gf = g + 2 * H, *gc = g + 3 * H;
    if (p) {
        for (int64_t j = 0; j < H; j++) {
            gi[j] += p[j] * c[j];
            gf[j] += p[2 * H + j] * c[j];
        }
    }
    gate_act(a, d, 0, gi, H);
    if (a->flags & FLAG_INPUT_FORGET) {
        for (int64_t j = 0; j < H; j++) gf[j] = 1.0f - gi[j];
    } else {
        gate_act(a, d, 0, gf, H);
    }
    gate_act(a, d, 1, gc, H);
    for (int64_t j = 0; j < H; j++) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    if (p) {
        for (int64_t j = 0; j < H; j++) go[j] += p[H + j] * c[j];
    }
    gate_act(a, d, 0, go, H);
    memcpy(tmp, c, (size_t)H * sizeof(float));
    act_span(tmp, H, a->acts[d * 3 + 2], a->alphas[d * 3 + 2], a->betas[d * 3 + 2]);
    for (int64_t j = 0; j < H; j++) h[j] = go[j] * tmp[j];
}

/* One GRU step: g (3H) holds x @ W^T + Wb + Rb of z and r (not of h: with linear_before_reset it
 * sits inside r * (...)); tmp has 3H floats. */
HOT_CLONES static void gru_step(const rnn_t *a, int64_t d, float *g, float *h, float *tmp) {
    const int64_t H = a->hidden;
    const float *rt = a->rt + d * H * 3 * H, *rbh = a->rbh + d * H;
    float *gz = g, *gr = g + H, *gh = g + 2 * H;
    if (a->flags & FLAG_LINEAR_BEFORE_RESET) {
        memset(tmp, 0, (size_t)(3 * H) * sizeof(float));
        gemv_rows(tmp, h, rt, H, 3 * H, 3 * H);
        for (int64_t j = 0; j < 2 * H; j++) g[j] += tmp[j];
        gate_act(a, d, 0, gz, 2 * H); /* z and r: one activation */
        for (int64_t j = 0; j < H; j++) gh[j] += gr[j] * (tmp[2 * H + j] + rbh[j]);
    } else {
        gemv_rows(g, h, rt, H, 2 * H, 3 * H);
        gate_act(a, d, 0, gz, 2 * H);
        for (int64_t j = 0; j < H; j++) tmp[j] = gr[j] * h[j];
        for (int64_t j = 0; j < H; j++) gh[j] += rbh[j];
        gemv_rows(gh, tmp, rt + 2 * H, H, H, 3 * H);
    }
    gate_act(a, d, 1, gh, H);
    for (int64_t j = 0; j < H; j++) h[j] = (1.0f - gz[j]) * gh[j] + gz[j] * h[j];
}

HOT_CLONES static void rnn_step(const rnn_t *a, int64_t d, float *g, float *h) {
    const int64_t H = a->hidden;
    gemv_rows(g, h, a->rt + d * H * H, H, H, H);
    gate_act(a, d, 0, g, H);
    memcpy(h, g, (size_t)H * sizeof(float));
}

/* Item d * batch + b: direction d of batch row b, its whole sequence. */
static void rnn_item(void *ctx, int64_t item) {
    rnn_t *a = ctx;
    const int64_t H = a->hidden, G = a->gates, B = a->batch, S = a->seq;
    const int64_t d = item / B, b = item % B;
    const int reverse = a->direction == DIR_REVERSE || (a->direction == DIR_BIDIRECTIONAL && d == 1);
    const int64_t len = a->lens ? a->lens[b] : S;
    float *g = malloc((size_t)(G * H + 3 * H + 3 * H) * sizeof(float));
    if (!g) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *h = g + G * H, *c = h + H, *tmp = c + H; /* tmp: 3H */
    const int64_t state = (d * B + b) * H;
    if (a->h0) memcpy(h, a->h0 + state, (size_t)H * sizeof(float));
    else memset(h, 0, (size_t)H * sizeof(float));
    if (a->c0) memcpy(c, a->c0 + state, (size_t)H * sizeof(float));
    else memset(c, 0, (size_t)H * sizeof(float));
    for (int64_t s = 0; s < len; s++) {
        const int64_t t = reverse ? len - 1 - s : s;
        memcpy(g, a->xp + ((d * S + t) * B + b) * G * H, (size_t)(G * H) * sizeof(float));
        if (a->cell == CELL_LSTM) lstm_step(a, d, g, h, c, tmp);
        else if (a->cell == CELL_GRU) gru_step(a, d, g, h, tmp);
        else rnn_step(a, d, g, h);
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

OPT_API int optcli_recurrent_f32(int cell, const float *xp, const float *rt, const float *rbh, const float *p,
                                 const float *h0, const float *c0, const int32_t *lens, float *y, float *yh, float *yc,
                                 const int64_t *geom, const int32_t *acts, const float *alphas, const float *betas,
                                 float clip, int flags) {
    rnn_t a = {.cell = cell, .flags = flags, .direction = (int)geom[4], .dirs = geom[0], .seq = geom[1],
               .batch = geom[2], .hidden = geom[3], .xp = xp, .rt = rt, .rbh = rbh, .p = p, .h0 = h0, .c0 = c0,
               .lens = lens, .y = y, .yh = yh, .yc = yc, .acts = acts, .alphas = alphas, .betas = betas,
               .clip = clip};
    if (cell < CELL_LSTM || cell > CELL_RNN || a.direction < DIR_FORWARD || a.direction > DIR_BIDIRECTIONAL) {
        return OPT_EINVAL;
    }
    if (a.dirs != (a.direction == DIR_BIDIRECTIONAL ? 2 : 1) || a.seq < 0 || a.batch < 0 || a.hidden < 1) {
        return OPT_EINVAL;
    }
    if (a.hidden > (1 << 20) || a.seq > ((int64_t)1 << 40) || a.batch > ((int64_t)1 << 30)) return OPT_EINVAL;
    a.gates = cell == CELL_LSTM ? 4 : cell == CELL_GRU ? 3 : 1;
    if (cell == CELL_GRU && !rbh) return OPT_EINVAL;
    if (cell != CELL_LSTM && (p || c0 || yc)) return OPT_EINVAL;
    if ((flags & FLAG_CLIP) && !(clip >= 0.0f)) return OPT_EINVAL;
    for (int64_t i = 0; i < 3 * a.dirs; i++) {
        if (acts[i] < ACT_NONE || acts[i] >= ACT_COUNT) return OPT_EINVAL;
    }
    if (lens) {
        for (int64_t b = 0; b < a.batch; b++) {
            if (lens[b] < 0 || lens[b] > a.seq) return OPT_EINVAL;
        }
    }
    opt_parallel(rnn_item, &a, a.dirs * a.batch, 0);
    return a.failed ? OPT_ENOMEM : 0;
}
