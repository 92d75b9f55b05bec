/* A fully connected layer over a few rows: y [rows, n] = act(x [rows, k] @ w [k, n] + bias [n]),
 * w in its own row-major [K, N] layout (a MatMul's weight as the model holds it).
 *
 * A decoder's Loop runs its GRU gates, attention and output heads every step on one row: there the
 * product is a few microseconds, and what costs is around it.  numpy's matmul, its bias Add and its
 * activation are three calls; the GEMM conv's narrow path (gemm.c: dot products of W.T's rows) needs
 * horizontal sums per output and its argument checks; BLAS above its gemv threshold spins a second
 * thread on the other core.  Here each row of W is read once per group of up to four rows of x
 * and multiplied into a register tile of up to 4 rows x 32 columns, bias and activation applied as
 * the tile is stored.  Columns past the last full vector are dot products of their own.  Large
 * products (>= 256 K multiply-adds) split their column tiles over the pool.
 */
#include "optcli_native.h"
#include "simd.h"

#define FC_TILE 4                   /* vectors of columns per register tile */
#define FC_COLS (FC_TILE * VL)      /* columns per tile */
#define FC_PARALLEL_MACS (1 << 18)  /* below this many multiply-adds one thread does it all */

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t rows, k, n, items;
    int act;
    float alpha, beta;
} fc_t;

/* Rows r0 .. r0 + R of the columns j .. j + T * VL: R and T constants once inlined. */
ALWAYS_INLINE void fc_tile(const fc_t *a, int64_t r0, int64_t j, const int R, const int T) {
    v8f acc[4][FC_TILE];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < T; c++) acc[r][c] = vsplat(0.0f);
    const float *x = a->x + r0 * a->k;
    for (int64_t kk = 0; kk < a->k; kk++) {
        const float *wr = a->w + kk * a->n + j;
        v8f wv[FC_TILE];
        for (int c = 0; c < T; c++) wv[c] = vload(wr + c * VL);
        for (int r = 0; r < R; r++) {
            v8f xv = vsplat(x[r * a->k + kk]);
            for (int c = 0; c < T; c++) acc[r][c] += xv * wv[c];
        }
    }
    for (int r = 0; r < R; r++) {
        float *y = a->y + (r0 + r) * a->n + j;
        for (int c = 0; c < T; c++) vstore(y + c * VL, a->bias ? acc[r][c] + vload(a->bias + j + c * VL) : acc[r][c]);
        act_span(y, T * VL, a->act, a->alpha, a->beta);
    }
}

ALWAYS_INLINE void fc_rows_tile(const fc_t *a, int64_t r0, int64_t j, const int T) {
    switch (a->rows - r0 < 4 ? a->rows - r0 : 4) {
    case 1: fc_tile(a, r0, j, 1, T); break;
    case 2: fc_tile(a, r0, j, 2, T); break;
    case 3: fc_tile(a, r0, j, 3, T); break;
    default: fc_tile(a, r0, j, 4, T); break;
    }
}

/* Work item `it`: column tile it (FC_COLS wide, the last one narrower), every row. */
HOT_CLONES static void fc_item(void *ctx, int64_t it) {
    const fc_t *a = ctx;
    int64_t j = it * FC_COLS, full = a->n / VL * VL;
    int64_t end = j + FC_COLS < full ? j + FC_COLS : full;
    for (int64_t r0 = 0; r0 < a->rows; r0 += 4) {
        switch ((end - j) / VL) {
        case 4: fc_rows_tile(a, r0, j, 4); break;
        case 3: fc_rows_tile(a, r0, j, 3); break;
        case 2: fc_rows_tile(a, r0, j, 2); break;
        case 1: fc_rows_tile(a, r0, j, 1); break;
        default: break; /* a tile past the full vectors (n < VL): only the columns below */
        }
    }
    if (it != a->items - 1 || full == a->n) return;
    /* the last item also takes the columns past the last full vector, one dot product each */
    for (int64_t r = 0; r < a->rows; r++) {
        float *y = a->y + r * a->n;
        for (int64_t c = full; c < a->n; c++) {
            float s = a->bias ? a->bias[c] : 0.0f;
            for (int64_t kk = 0; kk < a->k; kk++) s += a->x[r * a->k + kk] * a->w[kk * a->n + c];
            y[c] = s;
        }
        act_span(y + full, a->n - full, a->act, a->alpha, a->beta);
    }
}

OPT_API int optcli_fc_rows_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows,
                               int64_t k, int64_t n, int act, float alpha, float beta) {
    if (rows < 0 || k < 1 || n < 1 || act < 0 || act >= ACT_COUNT) return OPT_EINVAL;
    if (rows == 0) return 0;
    fc_t a = {.x = x, .w = w, .bias = bias, .y = y, .rows = rows, .k = k, .n = n, .act = act, .alpha = alpha,
              .beta = beta};
    a.items = (n / VL * VL + FC_COLS - 1) / FC_COLS;
    if (a.items == 0) a.items = 1; /* n < VL: one item, the dot products */
    opt_parallel(fc_item, &a, a.items, rows * k * n < FC_PARALLEL_MACS ? 1 : 0);
    return 0;
}
