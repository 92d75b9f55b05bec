/* The GEMM-conv work item, written once for a vector type (included by gemm.c once per variant).
 *
 * Before including, define GK_V (the vector type: GK_L floats), GK_SPLAT(a) (a vector literal of
 * GK_L copies of a), GK_MR (rows of a register tile), GK_ATTR (the target attribute of this
 * variant's item functions, or nothing) and GK(name) (the name with this variant's suffix); they
 * are undefined again at the end.  A register tile is GK_MR rows x 2 vectors of Y.
 */
#define GK_NR (2 * GK_L)

#ifndef GK_ACT_LATER
#define GK_ACT_LATER (-1) /* the tiles' code for the activations applied after the store: GK(act_rows) */
#endif

ALWAYS_INLINE GK_V GK(vld)(const float *p) { GK_V v; memcpy(&v, p, sizeof v); return v; }
ALWAYS_INLINE void GK(vst)(float *p, GK_V v) { memcpy(p, &v, sizeof v); }

/* The first n (0..GK_L) floats at p into a vector, zero beyond; and the way back. */
ALWAYS_INLINE GK_V GK(vld_part)(const float *p, int n) {
    float t[GK_L] = {0};
    copy_part(t, p, n, GK_L);
    return GK(vld)(t);
}

ALWAYS_INLINE void GK(vst_part)(float *p, GK_V v, int n) {
    float t[GK_L];
    GK(vst)(t, v);
    copy_part(p, t, n, GK_L);
}

ALWAYS_INLINE void GK(load_row)(const float *p, int cols, GK_V *lo, GK_V *hi) {
    if (cols >= GK_NR) {
        *lo = GK(vld)(p);
        *hi = GK(vld)(p + GK_L);
    } else if (cols >= GK_L) {
        *lo = GK(vld)(p);
        *hi = GK(vld_part)(p + GK_L, cols - GK_L);
    } else {
        *lo = GK(vld_part)(p, cols);
        *hi = GK(vld_part)(p, 0);
    }
}

ALWAYS_INLINE void GK(store_row)(float *p, int cols, GK_V lo, GK_V hi) {
    if (cols >= GK_NR) {
        GK(vst)(p, lo);
        GK(vst)(p + GK_L, hi);
    } else if (cols > GK_L) {
        GK(vst)(p, lo);
        GK(vst_part)(p + GK_L, hi, cols - GK_L);
    } else {
        GK(vst_part)(p, lo, cols);
    }
}

/* The activation over a vector, 4 lanes at a time (see simd.h); act is a constant here. */
ALWAYS_INLINE GK_V GK(act)(GK_V v, const int act, float alpha, float beta) {
    if (act == ACT_NONE || act == ACT_RELU || act == ACT_CLIP || act == GK_ACT_LATER) return v; /* see GK(clamp) */
#if GK_L >= 8 && defined(__x86_64__)
    /* sigmoid, swish and GELU 8 lanes at a time on x86-64 (simd.h's act8): the 4-lane halves
     * went through the stack and took twice as long */
    if (act == ACT_SIGMOID || act == ACT_SWISH || act == ACT_GELU || act == ACT_GELU_TANH) {
#if GK_L == 8
        return act8(v, act);
#elif defined(HAVE_SHUFFLE)
        v8f lo = act8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), act);
        v8f hi = act8(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), act);
        return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
    }
#endif
    v4f h[GK_L / 4];
    memcpy(h, &v, sizeof v);
    for (int i = 0; i < GK_L / 4; i++) h[i] = act4(h[i], act, alpha, beta);
    memcpy(&v, h, sizeof v);
    return v;
}

/* relu and clip in registers, before the store: a compare and a mask or blend per vector (a NaN
 * stays NaN, as with np.maximum / np.clip).  Clamping the row after its store, as a loop over
 * the floats in L1, cost 15% of a 1x1 conv with K = 16. */
typedef int32_t GK(vi) __attribute__((vector_size(GK_L * 4)));
ALWAYS_INLINE GK_V GK(clamp)(GK_V v, const int act, GK_V lo, GK_V hi) {
    GK(vi) m = v < lo;
    v = (GK_V)((m & (GK(vi))lo) | (~m & (GK(vi))v));
    if (act == ACT_CLIP) {
        m = v > hi;
        v = (GK_V)((m & (GK(vi))hi) | (~m & (GK(vi))v));
    }
    return v;
}

/* The clamp's bounds for a tile's stores, made once after its K loop.  Read through volatiles:
 * otherwise GCC hoists the splat out of the tile loops and keeps it in a register across the K
 * loop, where 12 accumulators, 2 loads and a broadcast already use 15 of AVX2's 16, and it
 * spilled an accumulator instead (a store and a load per k, every Relu conv at half speed).  Made
 * per stored vector instead (a stack store, a reload and a broadcast per bound each time), a
 * Clip took a 1x1 conv with K = 16 from 800 to 1300 us. */
ALWAYS_INLINE void GK(bounds)(const gemm_t *g, const int act, GK_V *lo, GK_V *hi) {
    volatile float lo_bound = act == ACT_RELU ? 0.0f : g->alpha, hi_bound = act == ACT_CLIP ? g->beta : 0.0f;
    const float l = lo_bound, h = hi_bound; /* one read each: a splat of the volatile reads it per lane */
    *lo = (GK_V)GK_SPLAT(l);
    *hi = (GK_V)GK_SPLAT(h);
}

/* One row of a tile, two vectors (cols of them stored): what came before it added (the bias, or
 * the earlier K blocks' sum in Y), then on the last K block the residual and the activation. */
ALWAYS_INLINE void GK(finish)(const gemm_t *g, GK_V c0, GK_V c1, float *y, const float *r, const float *bias,
                              int cols, int first, int last, const int act, GK_V lo, GK_V hi) {
    if (!first) {
        GK_V p0, p1;
        GK(load_row)(y, cols, &p0, &p1);
        c0 += p0;
        c1 += p1;
    } else if (bias) {
        c0 += *bias;
        c1 += *bias;
    }
    if (last) {
        if (r) {
            GK_V r0, r1;
            GK(load_row)(r, cols, &r0, &r1);
            c0 += r0;
            c1 += r1;
        }
        c0 = GK(act)(c0, act, g->alpha, g->beta);
        c1 = GK(act)(c1, act, g->alpha, g->beta);
        if (act == ACT_RELU || act == ACT_CLIP) {
            c0 = GK(clamp)(c0, act, lo, hi);
            c1 = GK(clamp)(c1, act, lo, hi);
        }
    }
    GK(store_row)(y, cols, c0, c1);
}

/* The activation over n stored floats: act_span's, but GELU 16 lanes at a time in the AVX-512
 * variant (as two 8-lane halves, a transformer's FC + GELU spent as long in the GELU as in the
 * product). */
ALWAYS_INLINE void GK(act_span)(float *y, int64_t n, int act, float alpha, float beta) {
#if GK_L == 16 && defined(__x86_64__)
    if (act == ACT_GELU || act == ACT_GELU_TANH) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            v16f v;
            memcpy(&v, y + i, sizeof v);
            v = act == ACT_GELU ? gelu16(v) : gelu_tanh16(v);
            memcpy(y + i, &v, sizeof v);
        }
        if (i < n) act_span(y + i, n - i, act, alpha, beta);
        return;
    }
#endif
    act_span(y, n, act, alpha, beta);
}

/* The activation over a stored tile's rows (still in L1), one copy of every activation's loop per
 * variant: called by the tiles of GK_ACT_LATER (otherwise the tiles with no activation) and by the
 * transposed tiles, rather than inlined into each of their many constant shapes (the build took
 * minutes).  A call per tile costs nothing next to its K multiply-adds per float. */
GK_ATTR __attribute__((noinline)) static void GK(act_rows)(const gemm_t *g, float *y, int64_t ld, int rows,
                                                           int cols) {
    for (int i = 0; i < rows; i++) GK(act_span)(y + i * ld, cols, g->act, g->alpha, g->beta);
}

/* One tile of Y at (m, n): MR rows (a constant: GK_MR, or a smaller tile for the last rows of M),
 * rows < MR and cols < GK_NR at the edges.  a is W at (m, k0), b the packed panel (kb x GK_NR);
 * first / last say whether this K block is the first / last one. */
ALWAYS_INLINE void GK(tile)(const gemm_t *g, const float *a, const float *b, int64_t kb, float *y, const float *r,
                            const float *bias, int rows, int cols, int first, int last, const int act, const int MR) {
    const int64_t K = g->K, N = g->N;
    const float *ar[GK_MR];
    for (int i = 0; i < MR; i++) ar[i] = a + (i < rows ? i : rows - 1) * K; /* past M: a row again, unstored */
    /* Each K block sums from zero and then adds what came before it (the bias, or the earlier
     * blocks' sum in Y): a two-level sum, whose rounding grows with the block length, not K. */
    GK_V c[GK_MR][2], zero = {0};
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = zero;
    for (int64_t k = 0; k < kb; k++, b += GK_NR) {
        GK_V b0 = GK(vld)(b), b1 = GK(vld)(b + GK_L);
        for (int i = 0; i < MR; i++) {
            float av = ar[i][k];
            GK_V s = GK_SPLAT(av); /* one broadcast: 0 + av would be an add as well */
            c[i][0] += s * b0;
            c[i][1] += s * b1;
        }
    }
    GK_V lo = zero, hi = zero;
    if (last && (act == ACT_RELU || act == ACT_CLIP)) GK(bounds)(g, act, &lo, &hi);
    for (int i = 0; i < MR; i++) { /* a constant bound: the accumulators stay in registers */
        if (i >= rows) break;
        GK(finish)(g, c[i][0], c[i][1], y + i * N, r ? r + i * g->rld : NULL, bias ? bias + i : NULL, cols, first, last,
                   act, lo, hi);
    }
    if (act == GK_ACT_LATER && last) GK(act_rows)(g, y, N, rows, cols);
}

/* cols columns of kb rows of X (row stride ld) into GK_NR-wide panels, zero past cols. */
ALWAYS_INLINE void GK(pack)(float *dst, const float *x, int64_t ld, int64_t kb, int64_t cols) {
    for (int64_t p = 0; p < cols; p += GK_NR, dst += kb * GK_NR) {
        int w = cols - p < GK_NR ? (int)(cols - p) : GK_NR;
        for (int64_t k = 0; k < kb; k++) {
            GK_V lo, hi;
            GK(load_row)(x + p + k * ld, w, &lo, &hi);
            GK(vst)(dst + k * GK_NR, lo);
            GK(vst)(dst + k * GK_NR + GK_L, hi);
        }
    }
}

/* The same panels for the implicit GEMM of a convolution: rows k0.. of X, columns n0.. (cols of
 * them), gathered from the padded input xp of one image (see conv_t), a run of output columns of
 * one output row at a time. */
ALWAYS_INLINE void GK(pack_conv)(float *dst, const conv_t *q, const float *xp, int64_t k0, int64_t kb, int64_t n0,
                                 int64_t cols) {
    /* where row k of X starts in xp, worked out once for all the panels: four divisions per row
     * and panel cost ten times the copy itself */
    int64_t start[PANEL_FLOATS / GK_NR];
    int64_t c = k0 / (q->KH * q->KW), kh = k0 / q->KW % q->KH, kw = k0 % q->KW;
    for (int64_t k = 0; k < kb; k++) {
        start[k] = (c * q->HP + kh * q->dh) * q->WP + kw * q->dw;
        if (++kw == q->KW) {
            kw = 0;
            if (++kh == q->KH) kh = 0, c++;
        }
    }
    for (int64_t p = 0; p < cols; p += GK_NR, dst += kb * GK_NR) {
        int w = cols - p < GK_NR ? (int)(cols - p) : GK_NR;
        int64_t oh0 = (n0 + p) / q->OW, ow0 = (n0 + p) % q->OW;
        if (ow0 + w > q->OW) {
            /* The panel's columns cross output rows (small planes: a 9x9 output is 9-column runs):
             * their offsets in a plane worked out once, then one gather per row of X.  Walking the
             * runs per row cost more than the product itself on MTCNN's 3x3 convs. */
            int64_t off[GK_NR];
            for (int j = 0, oh = (int)oh0, ow = (int)ow0; j < w; j++) {
                off[j] = oh * q->sh * q->WP + ow * q->sw;
                if (++ow == q->OW) ow = 0, oh++;
            }
            for (int64_t k = 0; k < kb; k++) {
                const float *plane = xp + start[k];
                float *d = dst + k * GK_NR;
                int j = 0;
                for (; j < w; j++) d[j] = plane[off[j]];
                for (; j < GK_NR; j++) d[j] = 0.0f;
            }
            continue;
        }
        for (int64_t k = 0; k < kb; k++) {
            const float *plane = xp + start[k];
            float *d = dst + k * GK_NR;
            int j = 0;
            for (int64_t oh = oh0, ow = ow0; j < w; oh++, ow = 0) {
                int run = q->OW - ow < w - j ? (int)(q->OW - ow) : w - j;
                const float *src = plane + oh * q->sh * q->WP + ow * q->sw;
                if (q->sw == 1) {
                    for (int i = 0; i < run; i++) d[j + i] = src[i];
                } else {
                    for (int i = 0; i < run; i++) d[j + i] = src[i * q->sw];
                }
                j += run;
            }
            for (; j < GK_NR; j++) d[j] = 0.0f;
        }
    }
}

ALWAYS_INLINE void GK(item)(gemm_t *g, int64_t it, const int act) {
    const int64_t M = g->M, K = g->K, N = g->N;
    int64_t img = it / (g->nn * g->nm), rest = it % (g->nn * g->nm);
    int64_t n0 = rest / g->nm * g->nb, m0 = rest % g->nm * g->mb; /* row bands of a column band are neighbours */
    int64_t cols = N - n0 < g->nb ? N - n0 : g->nb, m1 = M - m0 < g->mb ? M : m0 + g->mb;
    float *bp = NULL;
    if (!g->packed) {
        bp = opt_scratch((size_t)(g->kc * ((cols + GK_NR - 1) / GK_NR) * GK_NR + 16));
        if (!bp) {
            g->failed = 1;
            return;
        }
        bp += (64 - (uintptr_t)bp % 64) % 64 / sizeof(float); /* a line apart: no panel load splits a line */
    }
    const float *x = g->x + img * g->xstride + (g->conv ? 0 : n0);
    float *y = g->y + img * M * N + n0;
    const float *r = g->res ? g->res + img * g->rimg + n0 : NULL;
    const int64_t grp = g->groups > 1 ? img % g->groups : 0; /* a grouped conv's group: its rows of W */
    const float *w = g->w + grp * M * K, *bias = g->bias ? g->bias + grp * M : NULL;
    for (int64_t k0 = 0; k0 < K; k0 += g->kc) {
        int64_t kb = K - k0 < g->kc ? K - k0 : g->kc;
        int first = k0 == 0, last = k0 + kb == K;
        if (g->packed) { /* packed once for all row bands: see run() */
            bp = g->packed + img * g->pstride + k0 * ((N + GK_NR - 1) / GK_NR) * GK_NR + n0 / GK_NR * kb * GK_NR;
        } else if (g->conv) {
            GK(pack_conv)(bp, g->conv, x, k0, kb, n0, cols);
        } else {
            GK(pack)(bp, x + k0 * N, N, kb, cols);
        }
        /* A tile's rows of W (MR x kb, in L1 for all of its panels) against each packed panel of
         * the band in turn (a sequential stream from L2), so each row band of Y is written along
         * its rows.  Panels outermost instead (each panel in L1 against all of W's rows, the
         * BLIS order, which assumes a packed W) was as fast or up to 16% slower at 1 thread (W's
         * MR rows then come as MR strided streams from L2 for every tile, and Y is written MR
         * rows at a time down all of M), within the noise at 2 threads (1x1 and 3x3 conv shapes,
         * K 16..2304, the two orders interleaved in one process, order rotated per round). */
        for (int64_t m = m0; m < m1; m += GK_MR) {
            int rows = m1 - m < GK_MR ? (int)(m1 - m) : GK_MR;
            const float *wm = w + m * K + k0, *bm = bias ? bias + m : NULL;
            for (int64_t p = 0; p < cols; p += GK_NR) {
                int pc = cols - p < GK_NR ? (int)(cols - p) : GK_NR;
                const float *b = bp + p / GK_NR * kb * GK_NR, *rm = r ? r + m * g->rld + p : NULL;
                /* the last rows of M in a tile of their size: M = 16 on 12-row tiles computed 24 */
                if (rows > GK_MR * 2 / 3)
                    GK(tile)(g, wm, b, kb, y + m * N + p, rm, bm, rows, pc, first, last, act, GK_MR);
                else if (rows > GK_MR / 3)
                    GK(tile)(g, wm, b, kb, y + m * N + p, rm, bm, rows, pc, first, last, act, GK_MR * 2 / 3);
                else
                    GK(tile)(g, wm, b, kb, y + m * N + p, rm, bm, rows, pc, first, last, act, GK_MR / 3);
            }
        }
    }
}

#define GK_TM 4 /* thin products: at most this many rows of W (a fully connected layer on a few rows) */

/* Thin products over a band of columns, K outermost: Y's rows (at most GK_TM) for a block of
 * GK_TB columns stay in L1 (or L2) while every row of X streams through once, in order.  With K innermost
 * (registers across all of K, per group of columns) each group walks down all K rows of X, N floats apart: for a classifier
 * head (X is the 1024 x 1000 weight) that is a strided walk over 4 MB that the prefetchers do not
 * follow, 2-6x slower than one sequential pass. */
#define GK_TB 2048
ALWAYS_INLINE void GK(thin_block)(const gemm_t *g, const float *x, float *y, const float *r, int64_t c0,
                                  int64_t c1) {
    const int64_t K = g->K, N = g->N, M = g->M;
    const int64_t vec_end = c0 + (c1 - c0) / GK_L * GK_L;
    for (int64_t m = 0; m < M; m++) {
        float start = g->bias ? g->bias[m] : 0.0f;
        for (int64_t n = c0; n < c1; n++) y[m * N + n] = start;
    }
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) { /* four rows of X per pass over Y's block: a quarter of the Y traffic */
        const float *x0 = x + k * N, *x1 = x0 + N, *x2 = x1 + N, *x3 = x2 + N;
        for (int m = 0; m < M; m++) {
            const float *a = g->w + m * K + k;
            GK_V s0 = GK_SPLAT(a[0]), s1 = GK_SPLAT(a[1]), s2 = GK_SPLAT(a[2]), s3 = GK_SPLAT(a[3]);
            float *ym = y + m * N;
            int64_t n = c0;
            for (; n < vec_end; n += GK_L)
                GK(vst)(ym + n, GK(vld)(ym + n) + s0 * GK(vld)(x0 + n) + s1 * GK(vld)(x1 + n) + s2 * GK(vld)(x2 + n) +
                                    s3 * GK(vld)(x3 + n));
            for (; n < c1; n++) ym[n] += a[0] * x0[n] + a[1] * x1[n] + a[2] * x2[n] + a[3] * x3[n];
        }
    }
    for (; k < K; k++) {
        const float *xr = x + k * N;
        for (int m = 0; m < M; m++) {
            float av = g->w[m * K + k];
            GK_V sv = GK_SPLAT(av);
            float *ym = y + m * N;
            int64_t n = c0;
            for (; n < vec_end; n += GK_L) GK(vst)(ym + n, GK(vld)(ym + n) + sv * GK(vld)(xr + n));
            for (; n < c1; n++) ym[n] += av * xr[n];
        }
    }
    GK_V zero = {0};
    for (int64_t m = 0; m < M; m++) { /* the residual and the activation over the rows, still in L1 */
        if (r)
            for (int64_t n = c0; n < c1; n += GK_NR) {
                int cols = c1 - n < GK_NR ? (int)(c1 - n) : GK_NR;
                GK(finish)(g, zero, zero, y + m * N + n, r + m * g->rld + n, NULL, cols, 0, 1, ACT_NONE, zero, zero);
            }
        if (g->act != ACT_NONE) GK(act_span)(y + m * N + c0, c1 - c0, g->act, g->alpha, g->beta);
    }
}

GK_ATTR static void GK(thin)(void *c, int64_t it) {
    gemm_t *g = c;
    int64_t img = it / g->nn, n0 = it % g->nn * g->nb, n1 = g->N - n0 < g->nb ? g->N : n0 + g->nb;
    const float *x = g->x + img * g->K * g->N;
    float *y = g->y + img * g->M * g->N;
    const float *r = g->res ? g->res + img * g->rimg : NULL;
    for (int64_t c = n0; c < n1; c += GK_TB)
        GK(thin_block)(g, x, y, r, c, n1 - c < GK_TB ? n1 : c + GK_TB);
}

/* Narrow products (fewer than NARROW_COLS columns: a squeeze-excitation block or a conv head on a
 * [1, C, 1, 1] input, a fully connected layer with its weight transposed): no register tile of
 * GK_NR columns fits them, and W (M x K) is the only large operand, read once.  So each output is
 * a dot product along K, vectorised along K: X comes transposed (xt [N, K], each column
 * contiguous), GK_NRR rows of W at a time against GK_NC columns of X (GK_NRR x GK_NC independent
 * accumulators: enough to hide the FMA latency where each W vector is used GK_NC times at most).
 * Past M the last row is read again and not stored; past K both operands load zeros. */
#define GK_NRR 8
/* The sum of a vector's lanes, halving it down to 4 lanes (a lane-by-lane scalar loop costs more
 * than a short row's whole dot product). */
ALWAYS_INLINE float GK(hsum)(GK_V v) {
    v4f q[GK_L / 4];
    memcpy(q, &v, sizeof v);
    for (int w = GK_L / 4; w > 1; w /= 2)
        for (int i = 0; i < w / 2; i++) q[i] += q[i + w / 2];
    return (q[0][0] + q[0][2]) + (q[0][1] + q[0][3]);
}
ALWAYS_INLINE void GK(narrow_tile)(const float *w, int64_t K, const float *xt, int rows, float out[GK_NRR][GK_NC],
                                   const int nc) {
    const float *ar[GK_NRR];
    for (int i = 0; i < GK_NRR; i++) ar[i] = w + (i < rows ? i : rows - 1) * K;
    GK_V acc[GK_NRR][GK_NC], zero = {0};
    for (int i = 0; i < GK_NRR; i++)
        for (int j = 0; j < nc; j++) acc[i][j] = zero;
    int64_t k = 0;
    for (; k + GK_L <= K; k += GK_L) {
        GK_V xv[GK_NC];
        for (int j = 0; j < nc; j++) xv[j] = GK(vld)(xt + j * K + k);
        for (int i = 0; i < GK_NRR; i++) {
            GK_V wv = GK(vld)(ar[i] + k);
            for (int j = 0; j < nc; j++) acc[i][j] += wv * xv[j];
        }
    }
    if (k < K) {
        int left = (int)(K - k);
        GK_V xv[GK_NC];
        for (int j = 0; j < nc; j++) xv[j] = GK(vld_part)(xt + j * K + k, left);
        for (int i = 0; i < GK_NRR; i++) {
            GK_V wv = GK(vld_part)(ar[i] + k, left);
            for (int j = 0; j < nc; j++) acc[i][j] += wv * xv[j];
        }
    }
    for (int i = 0; i < GK_NRR; i++)
        for (int j = 0; j < nc; j++) out[i][j] = GK(hsum)(acc[i][j]);
}

/* Band it: image it / nm, rows [m0, m0 + mb) of it; y rows of that band are contiguous, so the
 * activation runs once over them at the end (in L1). */
ALWAYS_INLINE void GK(narrow_band)(const gemm_t *g, int64_t it) {
    const int64_t M = g->M, K = g->K, N = g->N;
    int64_t img = it / g->nm, m0 = it % g->nm * g->mb, m1 = M - m0 < g->mb ? M : m0 + g->mb;
    const float *xt = g->x + img * g->xstride;
    float *y = g->y + img * M * N;
    const float *r = g->res ? g->res + img * g->rimg : NULL;
    float out[GK_NRR][GK_NC];
    for (int64_t m = m0; m < m1; m += GK_NRR) {
        int rows = m1 - m < GK_NRR ? (int)(m1 - m) : GK_NRR;
        for (int64_t n = 0; n < N; n += GK_NC) {
            int nc = N - n < GK_NC ? (int)(N - n) : GK_NC;
            if (nc == GK_NC) { /* a constant column count: the accumulators stay in registers */
                GK(narrow_tile)(g->w + m * K, K, xt + n * K, rows, out, GK_NC);
            } else {
                GK(narrow_tile)(g->w + m * K, K, xt + n * K, rows, out, 1);
                for (int j = 1; j < nc; j++) {
                    float one[GK_NRR][GK_NC];
                    GK(narrow_tile)(g->w + m * K, K, xt + (n + j) * K, rows, one, 1);
                    for (int i = 0; i < rows; i++) out[i][j] = one[i][0];
                }
            }
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < nc; j++) {
                    int64_t at = (m + i) * N + n + j;
                    y[at] = out[i][j] + (g->bias ? g->bias[m + i] : 0.0f) + (r ? r[(m + i) * g->rld + n + j] : 0.0f);
                }
        }
    }
    GK(act_span)(y + m0 * N, (m1 - m0) * N, g->act, g->alpha, g->beta);
}

/* One pool item per thread taking part: the calling thread takes bands from the first on, the
 * workers from the last one back, until every band is taken (see run()).  A band is counted
 * before it is taken, so the two ends never take the same one. */
GK_ATTR static void GK(narrow)(void *c, int64_t it) {
    gemm_t *g = c;
    (void)it;
    const int front = pthread_equal(pthread_self(), g->caller);
    while (atomic_fetch_add(&g->claims, 1) < g->bands)
        GK(narrow_band)(g, front ? atomic_fetch_add(&g->front, 1) : g->bands - 1 - atomic_fetch_add(&g->back, 1));
}

/* Small planes (the 1x1 convs on 7x7 and 14x14: 49 and 196 columns, many rows): Y's columns
 * fill GK_NR-wide tiles badly (49 of 64), so the product is taken transposed, Y.T = X.T @ W.T,
 * vectorised along M: a tile is nr rows of Y.T (columns n.. of Y, nr = GK_MR, fewer and exact
 * at the end) x nv vectors of M (M is a multiple of GK_L), the broadcasts nr consecutive floats of
 * one row of X, the vectors rows of W.T ([K, M], made once per weight by the caller), all of K
 * in registers (W.T's rows of a band come from L2, each read once per row tile).  Bias, residual
 * and activation on the tile, which is then stored transposed. */
ALWAYS_INLINE void GK(ttile)(const gemm_t *g, const float *x, const float *wt, float *y, const float *r, int64_t n0,
                             int64_t m0, const int nr, const int nv) {
    const int64_t K = g->K, M = g->M, N = g->N;
    GK_V acc[GK_MR][2], zero = {0};
    for (int i = 0; i < nr; i++) acc[i][0] = acc[i][1] = zero;
    /* W.T in panels of 2 * GK_L columns of M, each [K, 2 * GK_L] contiguous (the last one, of
     * GK_L columns when M is an odd number of vectors, [K, GK_L]): read in order */
    const float *a = x + n0, *b = wt + m0 * K;
    const int64_t ldb = nv * GK_L;
    (void)M;
    for (int64_t k = 0; k < K; k++, a += N, b += ldb) {
        GK_V b0 = GK(vld)(b), b1 = nv > 1 ? GK(vld)(b + GK_L) : zero;
        for (int i = 0; i < nr; i++) {
            float av = a[i];
            GK_V sv = GK_SPLAT(av);
            acc[i][0] += sv * b0;
            if (nv > 1) acc[i][1] += sv * b1;
        }
    }
    GK_V bias0 = zero, bias1 = zero;
    if (g->bias) {
        bias0 = GK(vld)(g->bias + m0);
        if (nv > 1) bias1 = GK(vld)(g->bias + m0 + GK_L);
    }
    /* the tile through a buffer: the activation once over it, then each of its columns (one
     * row of Y, nr consecutive floats) stored as a run */
    float t[GK_MR * 2 * GK_L];
    const int w = nv * GK_L;
    for (int i = 0; i < nr; i++) {
        GK(vst)(t + i * w, acc[i][0] + bias0);
        if (nv > 1) GK(vst)(t + i * w + GK_L, acc[i][1] + bias1);
    }
    if (r)
        for (int j = 0; j < w; j++)
            for (int i = 0; i < nr; i++) t[i * w + j] += r[(m0 + j) * g->rld + n0 + i];
    if (g->act != ACT_NONE) GK(act_rows)(g, t, 0, 1, nr * w);
    for (int j = 0; j < w; j++) {
        float *yj = y + (m0 + j) * N + n0;
        for (int i = 0; i < nr; i++) yj[i] = t[i * w + j];
    }
}

/* W [M, K] into W.T's panels as GK(ttile) reads them (M a multiple of GK_L). */
GK_ATTR static void GK(pack_wt)(const float *w, float *wt, int64_t M, int64_t K) {
    for (int64_t m0 = 0; m0 < M; m0 += 2 * GK_L) {
        int64_t w_ = M - m0 < 2 * GK_L ? M - m0 : 2 * GK_L;
        float *dst = wt + m0 * K;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < w_; j++) dst[k * w_ + j] = w[(m0 + j) * K + k];
    }
}

/* Item it: image it / (nm * nn), a band of mb of M (whole panels but the last) and one of nb of N. */
GK_ATTR static void GK(transposed)(void *c, int64_t it) {
    const gemm_t *g = c;
    const int64_t M = g->M, N = g->N;
    int64_t img = it / (g->nm * g->nn), rest = it % (g->nm * g->nn);
    int64_t m0 = rest % g->nm * g->mb, m1 = M - m0 < g->mb ? M : m0 + g->mb;
    int64_t n0 = rest / g->nm * g->nb, n1 = N - n0 < g->nb ? N : n0 + g->nb;
    const float *x = g->x + img * g->xstride;
    float *y = g->y + img * M * N;
    const float *r = g->res ? g->res + img * g->rimg : NULL;
    for (int64_t m = m0; m < m1; m += 2 * GK_L) {
        const int two = m1 - m >= 2 * GK_L;
        int64_t n = n0;
        for (; n + GK_MR <= n1; n += GK_MR) {
            if (two) GK(ttile)(g, x, g->wt, y, r, n, m, GK_MR, 2);
            else GK(ttile)(g, x, g->wt, y, r, n, m, GK_MR, 1);
        }
        switch (n1 - n) { /* the last rows, exactly: constant counts keep the accumulators in registers */
#define GK_TREST(R) \
    case R: if (two) GK(ttile)(g, x, g->wt, y, r, n, m, R, 2); else GK(ttile)(g, x, g->wt, y, r, n, m, R, 1); break;
            GK_TREST(1) GK_TREST(2) GK_TREST(3) GK_TREST(4) GK_TREST(5)
#if GK_MR > 6
            GK_TREST(6) GK_TREST(7)
#endif
#if GK_MR > 8
            GK_TREST(8) GK_TREST(9) GK_TREST(10) GK_TREST(11)
#endif
#undef GK_TREST
        default: break;
        }
    }
}

/* Item it of the packing job that serves every row band (run()): K block it % blocks of image
 * it / blocks, all N columns, at the place GK(item) looks for it. */
GK_ATTR static void GK(prepack)(void *c, int64_t it) {
    gemm_t *g = c;
    int64_t blocks = (g->K + g->kc - 1) / g->kc, img = it / blocks, k0 = it % blocks * g->kc;
    int64_t kb = g->K - k0 < g->kc ? g->K - k0 : g->kc;
    float *dst = g->packed + img * g->pstride + k0 * ((g->N + GK_NR - 1) / GK_NR) * GK_NR;
    const float *x = g->x + img * g->xstride;
    if (g->conv) {
        GK(pack_conv)(dst, g->conv, x, k0, kb, 0, g->N);
    } else {
        GK(pack)(dst, x + k0 * g->N, g->N, kb, g->N);
    }
}

/* The pool's entry points for the register tiles: relu and clip are applied in registers, a
 * constant in their own copy of the tiles; every other activation by act_span over each tile's rows
 * once stored (still in L1), from one copy: eleven copies of the tiles took a minute of the build. */
#define GK_ENTRY(name, act) \
    GK_ATTR static void GK(name)(void *c, int64_t it) { GK(item)(c, it, act); }
GK_ENTRY(none, ACT_NONE)
GK_ENTRY(relu, ACT_RELU)
GK_ENTRY(clip, ACT_CLIP)
GK_ENTRY(later, GK_ACT_LATER)
#undef GK_ENTRY

static const opt_item_fn GK(items)[ACT_COUNT] = {GK(none), GK(relu), GK(clip), GK(later), GK(later), GK(later),
                                                 GK(later), GK(later), GK(later), GK(later), GK(later)};
/* thin products apply the residual and the activation over whole rows: one entry for all */
static const opt_item_fn GK(thin_items)[ACT_COUNT] = {GK(thin), GK(thin), GK(thin), GK(thin), GK(thin), GK(thin),
                                                      GK(thin), GK(thin), GK(thin), GK(thin), GK(thin)};
static const variant_t GK(variant) = {GK_MR, GK_NR, GK(items), GK(thin_items), GK(prepack), GK(narrow),
                                      GK(transposed), GK(pack_wt)};
#undef GK_NR
#undef GK_TM
#undef GK_NRR
#undef GK_NC
#undef GK_V
#undef GK_L
#undef GK_SPLAT
#undef GK_MR
#undef GK_ATTR
#undef GK
