/* The stem conv's work item, written once for a vector type (included by stem.c once per variant).
 *
 * Before including, define SK_V (the vector type: SK_L floats), SK_SPLAT(a) (a vector literal of
 * SK_L copies of a), SK_MB (output channels of a register tile), SK_NV (vectors of output columns
 * of a register tile), SK_ATTR (the target attribute of this variant's item function, or nothing)
 * and SK(name) (the name with this variant's suffix); they are undefined again at the end.
 *
 * A register tile is SK_MB output channels x V <= SK_NV vectors of one output row: per tap it loads
 * V input vectors once and broadcasts SK_MB weights, so SK_MB * V multiply-adds cost SK_MB + V
 * loads and the loads never bound it (a tile of one channel, as in the depthwise kernel, would do
 * V multiply-adds for V + 1 loads).
 */
typedef __typeof__((SK_V){0} < (SK_V){0}) SK(vi); /* the lane masks of a comparison */
#define SK_VI SK(vi)
/* The tile loops unrolled whole: an accumulator indexed by a loop counter lives in memory. */
#define SK_UNROLL _Pragma("GCC unroll 16")

ALWAYS_INLINE SK_V SK(vld)(const float *p) { SK_V v; memcpy(&v, p, sizeof v); return v; }
ALWAYS_INLINE void SK(vst)(float *p, SK_V v) { memcpy(p, &v, sizeof v); }

/* The first n (1..SK_L - 1) lanes of v to p, by fixed-size copies: a memcpy of a variable size is a
 * libc call, which cost as much as the multiply-adds of a short row. */
ALWAYS_INLINE void SK(vst_part)(float *p, SK_V v, int n) {
    float t[SK_L];
    SK(vst)(t, v);
    copy_part(p, t, n, SK_L);
}

/* V vectors of output for the channels [m0, m0 + mcount) of the packed weights wk [taps][SK_MB]: y is
 * channel m0's output row (channel m0 + i is i planes further), s the row's first scratch row.  The
 * vectors are the columns [ow0, ow0 + V * SK_L) of the row, or with `rows` the columns [0, SK_L) of V
 * rows one after the other (rows of one vector or less: see SK(item)). */
ALWAYS_INLINE void SK(tile)(const stem_t *a, const float *s, const float *wk, const float *bias, float *y,
                            int64_t ow0, int64_t mcount, const int V, const int rows) {
    const int64_t xs = rows ? a->sh * a->RS : SK_L, ys = rows ? a->OW : SK_L; /* steps between the vectors */
    SK_V acc[SK_MB][SK_NV];
    SK_UNROLL
    for (int i = 0; i < SK_MB; i++) {
        SK_V b = SK_SPLAT(bias[i]);
        SK_UNROLL
        for (int v = 0; v < V; v++) acc[i][v] = b;
    }
    const int64_t T = a->taps;
    const int64_t *toff = a->toff;
    s += ow0;
    for (int64_t t = 0; t < T; t++, wk += SK_MB) {
        const float *p = s + toff[t];
        SK_V in[SK_NV] = {0};
        SK_UNROLL
        for (int v = 0; v < V; v++) in[v] = SK(vld)(p + v * xs);
        SK_UNROLL
        for (int i = 0; i < SK_MB; i++) {
            float wv = wk[i];
            SK_V w = SK_SPLAT(wv); /* one broadcast: 0 + wv would be an add as well */
            SK_UNROLL
            for (int v = 0; v < V; v++) acc[i][v] += w * in[v];
        }
    }
    if (a->act == ACT_RELU || a->act == ACT_CLIP) { /* in registers: a compare and a select or two */
        SK_V lo = SK_SPLAT(a->act == ACT_RELU ? 0.0f : a->alpha), hi = SK_SPLAT(a->beta);
        SK_UNROLL
        for (int i = 0; i < SK_MB; i++)
            SK_UNROLL
            for (int v = 0; v < V; v++) {
                SK_VI m = acc[i][v] < lo; /* a NaN stays NaN, as with np.maximum and np.clip */
                acc[i][v] = (SK_V)((m & (SK_VI)lo) | (~m & (SK_VI)acc[i][v]));
                if (a->act == ACT_CLIP) {
                    m = acc[i][v] > hi;
                    acc[i][v] = (SK_V)((m & (SK_VI)hi) | (~m & (SK_VI)acc[i][v]));
                }
            }
    }
    const int64_t plane = a->OH * a->OW;
    y += ow0;
    if (mcount >= SK_MB && ow0 + (rows ? 1 : V) * SK_L <= a->OW) { /* whole tiles: constant indices, so */
        SK_UNROLL
        for (int i = 0; i < SK_MB; i++)                             /* the accumulators stay in registers */
            SK_UNROLL
            for (int v = 0; v < V; v++) SK(vst)(y + i * plane + v * ys, acc[i][v]);
        return;
    }
    SK_UNROLL
    for (int i = 0; i < SK_MB; i++) { /* the last channels or columns */
        if (i >= mcount) break;
        SK_UNROLL
        for (int v = 0; v < V; v++) {
            int64_t left = a->OW - ow0 - (rows ? 0 : v * SK_L);
            if (left >= SK_L) SK(vst)(y + i * plane + v * ys, acc[i][v]);
            else if (left > 0) SK(vst_part)(y + i * plane + v * ys, acc[i][v], (int)left);
        }
    }
}

/* Tiles of n < SK_NV vectors (a row's last columns, a band's last rows). */
ALWAYS_INLINE void SK(short_tile)(const stem_t *a, const float *s, const float *wk, const float *bias, float *y,
                                  int64_t ow0, int64_t mcount, int64_t n, const int rows) {
    switch (n) {
    case 1: SK(tile)(a, s, wk, bias, y, ow0, mcount, 1, rows); break;
#if SK_NV > 2
    case 2: SK(tile)(a, s, wk, bias, y, ow0, mcount, 2, rows); break;
#endif
#if SK_NV > 3
    case 3: SK(tile)(a, s, wk, bias, y, ow0, mcount, 3, rows); break;
#endif
    default: break;
    }
}

/* One output row, all channels: channel blocks outside (their weights stay in L1 across the row),
 * column tiles inside (the scratch rows they read stay in L1 across the channel blocks). */
ALWAYS_INLINE void SK(row)(const stem_t *a, const band_t *bd, const float *s, float *y) {
    const int64_t OWv = (a->OW + SK_L - 1) / SK_L * SK_L;
    for (int64_t m0 = bd->m0; m0 < bd->m1; m0 += SK_MB) {
        const float *wk = a->wp + (bd->wo + m0) * a->taps, *bias = a->bp + bd->wo + m0;
        float *ym = y + m0 * a->OH * a->OW;
        int64_t mcount = bd->m1 - m0;
        int64_t ow0 = 0;
        for (; ow0 + SK_NV * SK_L <= OWv; ow0 += SK_NV * SK_L) SK(tile)(a, s, wk, bias, ym, ow0, mcount, SK_NV, 0);
        SK(short_tile)(a, s, wk, bias, ym, ow0, mcount, (OWv - ow0) / SK_L, 0);
    }
}

/* Rows of one vector or less (7x7 to 16x16 maps of 16 lanes): a tile of SK_NV rows instead of one
 * row's vectors, else each tile would load a vector for every SK_MB weights it broadcasts. */
ALWAYS_INLINE void SK(narrow_rows)(const stem_t *a, const band_t *bd, const float *s, float *y) {
    const int64_t oh0 = bd->oh0, oh1 = bd->oh1;
    for (int64_t m0 = bd->m0; m0 < bd->m1; m0 += SK_MB) {
        const float *wk = a->wp + (bd->wo + m0) * a->taps, *bias = a->bp + bd->wo + m0;
        float *ym = y + m0 * a->OH * a->OW;
        int64_t mcount = bd->m1 - m0, oh = oh0;
        for (; oh + SK_NV <= oh1; oh += SK_NV)
            SK(tile)(a, s + (oh - oh0) * a->sh * a->RS, wk, bias, ym + oh * a->OW, 0, mcount, SK_NV, 1);
        SK(short_tile)(a, s + (oh - oh0) * a->sh * a->RS, wk, bias, ym + oh * a->OW, 0, mcount, oh1 - oh, 1);
    }
}

SK_ATTR static void SK(item)(void *ctx, int64_t it) {
    stem_t *a = ctx;
    band_t bd;
    float *s = stem_band(a, it, &bd);
    if (!s) return;
    float *y = a->y + bd.n * a->M * a->OH * a->OW;
    if (a->OW <= SK_L && bd.oh1 - bd.oh0 > 1)
        SK(narrow_rows)(a, &bd, s, y);
    else
        for (int64_t oh = bd.oh0; oh < bd.oh1; oh++)
            SK(row)(a, &bd, s + (oh - bd.oh0) * a->sh * a->RS, y + oh * a->OW);
    if (a->act != ACT_NONE && a->act != ACT_RELU && a->act != ACT_CLIP) /* over the band's rows, still in cache */
        for (int64_t m = bd.m0; m < bd.m1; m++)
            act_span(y + m * a->OH * a->OW + bd.oh0 * a->OW, (bd.oh1 - bd.oh0) * a->OW, a->act, a->alpha, a->beta);
}

#undef SK_VI
#undef SK_UNROLL
#undef SK_V
#undef SK_L
#undef SK_SPLAT
#undef SK_MB
#undef SK_NV
#undef SK_ATTR
#undef SK
