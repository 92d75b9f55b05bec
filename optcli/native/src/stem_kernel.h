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

/* Output row y (channel m0's row; channel m0 + i is i planes further) at columns [ow0, ow0 + V * SK_L),
 * for the channels [m0, m0 + mcount) of the packed weights wk [taps][SK_MB]; s is the output row's
 * first scratch row. */
ALWAYS_INLINE void SK(tile)(const stem_t *a, const float *s, const float *wk, const float *bias, float *y,
                            int64_t ow0, int64_t mcount, const int V) {
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
        for (int v = 0; v < V; v++) in[v] = SK(vld)(p + v * SK_L);
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
    if (mcount >= SK_MB && ow0 + V * SK_L <= a->OW) { /* whole tiles: constant indices, so the */
        SK_UNROLL
        for (int i = 0; i < SK_MB; i++)               /* accumulators never go through memory */
            SK_UNROLL
            for (int v = 0; v < V; v++) SK(vst)(y + i * plane + ow0 + v * SK_L, acc[i][v]);
        return;
    }
    float t[SK_MB][SK_NV * SK_L]; /* the last channels or columns: through a buffer */
    SK_UNROLL
    for (int i = 0; i < SK_MB; i++)
        SK_UNROLL
        for (int v = 0; v < V; v++) SK(vst)(t[i] + v * SK_L, acc[i][v]);
    int64_t cols = a->OW - ow0 < V * SK_L ? a->OW - ow0 : V * SK_L;
    for (int64_t i = 0; i < SK_MB && i < mcount; i++) memcpy(y + i * plane + ow0, t[i], (size_t)cols * sizeof(float));
}

/* One output row, all channels: channel blocks outside (their weights stay in L1 across the row),
 * column tiles inside (the scratch rows they read stay in L1 across the channel blocks). */
ALWAYS_INLINE void SK(row)(const stem_t *a, const float *s, float *y) {
    const int64_t OWv = (a->OW + SK_L - 1) / SK_L * SK_L;
    for (int64_t m0 = 0; m0 < a->M; m0 += SK_MB) {
        const float *wk = a->wp + m0 * a->taps, *bias = a->bp + m0;
        float *ym = y + m0 * a->OH * a->OW;
        int64_t mcount = a->M - m0;
        int64_t ow0 = 0;
        for (; ow0 + SK_NV * SK_L <= OWv; ow0 += SK_NV * SK_L) SK(tile)(a, s, wk, bias, ym, ow0, mcount, SK_NV);
        switch ((OWv - ow0) / SK_L) { /* the row's last vectors: fewer than SK_NV */
        case 1: SK(tile)(a, s, wk, bias, ym, ow0, mcount, 1); break;
#if SK_NV > 2
        case 2: SK(tile)(a, s, wk, bias, ym, ow0, mcount, 2); break;
#endif
#if SK_NV > 3
        case 3: SK(tile)(a, s, wk, bias, ym, ow0, mcount, 3); break;
#endif
        default: break;
        }
    }
}

SK_ATTR static void SK(item)(void *ctx, int64_t it) {
    stem_t *a = ctx;
    band_t bd;
    float *s = stem_band(a, it, &bd);
    if (!s) return;
    float *y = a->y + bd.n * a->M * a->OH * a->OW;
    for (int64_t oh = bd.oh0; oh < bd.oh1; oh++) SK(row)(a, s + (oh - bd.oh0) * a->sh * a->RS, y + oh * a->OW);
    if (a->act != ACT_NONE && a->act != ACT_RELU && a->act != ACT_CLIP) /* over the band's rows, still in cache */
        for (int64_t m = 0; m < a->M; m++)
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
