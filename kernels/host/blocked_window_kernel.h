/* The blocked window kernels' work items, written once for a vector type (included by
 * blocked_window.c once per channel block width B).
 *
 * Before including, define BW_V (the vector type: BW_L floats, the block width B), BW_XT (output
 * pixels of a register tile), BW_VMAX(v, m) (np.maximum's NaN rule: v where it is larger or a NaN,
 * else m), BW_ATTR (the target attribute of this variant's item functions, or
 * nothing), BW_TARGET (the target attribute of the inlined helpers, or nothing) and BW(name) (the name with this variant's suffix); they are undefined again at the end.
 *
 * Every lane is its own channel, so a tile is BW_XT output pixels of one row, one vector each:
 * per tap one weight vector (no broadcast) and BW_XT input vectors, BW_XT multiply-adds.  The
 * taps read a zero-padded (-inf for max pooling) copy of the rows an item needs, so no tap is
 * ever checked.  With a constant window (K) and stride (S) and dilation 1 the loops unroll whole,
 * and the compiler loads an input vector once for the taps of every pixel that reads it.
 */
#define BW_UNROLL _Pragma("GCC unroll 16")
/* the inlined helpers in the variant's instruction set (BW_TARGET: a target attribute or nothing):
 * a vector comparison in a function without it would be lowered to scalar code before inlining */
#define BW_INLINE BW_TARGET ALWAYS_INLINE

BW_INLINE BW_V BW(ld)(const float *p) { BW_V v; memcpy(&v, p, sizeof v); return v; }
BW_INLINE void BW(st)(float *p, BW_V v) { memcpy(p, &v, sizeof v); }
BW_INLINE BW_V BW(splat)(float a) { BW_V z = {0}; return z + a; }

/* Where a tile reads: output pixel ow's tap (kh, kw) is at p + off + ow * sw * B + kh * hstep +
 * kw * dw * B (p + off + ow * sw * B stays inside the array for the pixels read). */
typedef struct {
    const float *p;
    int64_t off, hstep;
} BW(src_t);

/* X (<= BW_XT) pixels of one output row from column ow0: wk the plane's packed weights [KH][KW][B]
 * (conv), y the output row.  K: KH = KW when constant (0: the run-time window, dilation a->dw),
 * S the constant column stride (0: a->sw). */
BW_INLINE void BW(tile)(const bw_t *a, BW(src_t) src, const float *wk, BW_V init, float *y, int64_t oh,
                        int64_t ow0, const int X, const int K, const int S, const int op) {
    const int64_t KH = K ? K : a->KH, KW = K ? K : a->KW, sw = S ? S : a->sw, dw = K ? 1 : a->dw;
    const int64_t hstep = src.hstep;
    BW_V acc[BW_XT];
    BW_UNROLL
    for (int x = 0; x < X; x++) acc[x] = init;
    const float *p0 = src.p + (src.off + ow0 * sw * BW_L);
/* tap (kh, kw) into the X accumulators */
#define BW_TAP(kw)                                                                                \
    {                                                                                             \
        const float *q = rp + (kw) * dw * BW_L;                                                   \
        if (op == OP_CONV) {                                                                      \
            BW_V w = BW(ld)(wk + (kh * KW + (kw)) * BW_L);                                        \
            BW_UNROLL                                                                             \
            for (int x = 0; x < X; x++) acc[x] += w * BW(ld)(q + x * sw * BW_L);                  \
        } else if (op == OP_MAX) {                                                                \
            BW_UNROLL                                                                             \
            for (int x = 0; x < X; x++) acc[x] = BW_VMAX(BW(ld)(q + x * sw * BW_L), acc[x]);      \
        } else {                                                                                  \
            BW_UNROLL                                                                             \
            for (int x = 0; x < X; x++) acc[x] += BW(ld)(q + x * sw * BW_L);                      \
        }                                                                                         \
    }
    for (int64_t kh = 0; kh < KH; kh++) {
        const float *rp = p0 + kh * hstep;
        if (K) { /* a constant window unrolls whole; a run-time one stays a loop (unrolled 16 times
                  * with its remainder code, every tile shape's copy cost minutes of build) */
            BW_UNROLL
            for (int64_t kw = 0; kw < KW; kw++) BW_TAP(kw)
        } else {
            for (int64_t kw = 0; kw < KW; kw++) BW_TAP(kw)
        }
    }
#undef BW_TAP
    if (op == OP_AVG) {
        float rr = a->rrow[oh];
        BW_UNROLL
        for (int x = 0; x < X; x++) acc[x] *= BW(splat)(rr * a->rcol[ow0 + x]);
    }
    if (op == OP_CONV && a->act == ACT_RELU) { /* in registers; a NaN stays NaN, as with np.maximum */
        BW_UNROLL
        for (int x = 0; x < X; x++) acc[x] = BW_VMAX(acc[x], BW(splat)(0.0f));
    }
    BW_UNROLL
    for (int x = 0; x < X; x++) BW(st)(y + (ow0 + x) * BW_L, acc[x]);
}

/* Output pixels [first, last) of a row: tiles of BW_XT pixels, the rest by one more tile that
 * overlaps the one before (it writes the same values again); tiles of 4 the same way on spans
 * narrower than BW_XT, one tile below 4. */
BW_INLINE void BW(span)(const bw_t *a, BW(src_t) src, const float *wk, BW_V init, float *y, int64_t oh,
                        int64_t first, int64_t last, const int K, const int S, const int op) {
    int64_t ow0 = first, n = last - first;
    if (n >= BW_XT) {
        for (; ow0 + BW_XT <= last; ow0 += BW_XT) BW(tile)(a, src, wk, init, y, oh, ow0, BW_XT, K, S, op);
        if (ow0 < last) BW(tile)(a, src, wk, init, y, oh, last - BW_XT, BW_XT, K, S, op);
    } else if (n >= 4) {
        for (; ow0 + 4 <= last; ow0 += 4) BW(tile)(a, src, wk, init, y, oh, ow0, 4, K, S, op);
        if (ow0 < last) BW(tile)(a, src, wk, init, y, oh, last - 4, 4, K, S, op);
    } else if (n == 3) {
        BW(tile)(a, src, wk, init, y, oh, first, 3, K, S, op);
    } else if (n == 2) {
        BW(tile)(a, src, wk, init, y, oh, first, 2, K, S, op);
    } else if (n == 1) {
        BW(tile)(a, src, wk, init, y, oh, first, 1, K, S, op);
    }
}

/* Narrow rows (not direct): X output pixels of the band taken row-major from band pixel p (row oh,
 * column ow of the band, oh relative to its first row oh0), running on into the next rows; their
 * outputs are consecutive in y (the band's output).  Per-row tiles left most of a 7-wide row to a
 * second tile overlapping the first (12 pixels computed for 7; 18 for 14 at 6 a tile). */
BW_INLINE void BW(ftile)(const bw_t *a, const float *s, const float *wk, BW_V init, float *y, int64_t oh0,
                         int64_t p, int64_t oh, int64_t ow, const int X, const int K, const int S, const int op) {
    const int64_t KH = K ? K : a->KH, KW = K ? K : a->KW, sw = S ? S : a->sw, dw = K ? 1 : a->dw;
    const int64_t OW = a->OW, hstep = a->dh * a->RS, rowstep = a->sh * a->RS;
    const float *base[BW_XT];
    float scale[BW_XT];
    BW_UNROLL
    for (int x = 0; x < X; x++) {
        base[x] = s + oh * rowstep + ow * sw * BW_L;
        if (op == OP_AVG) scale[x] = a->rrow[oh0 + oh] * a->rcol[ow];
        if (++ow == OW) ow = 0, oh++;
    }
    BW_V acc[BW_XT];
    BW_UNROLL
    for (int x = 0; x < X; x++) acc[x] = init;
    for (int64_t kh = 0; kh < KH; kh++) {
        BW_UNROLL
        for (int64_t kw = 0; kw < KW; kw++) {
            const int64_t off = kh * hstep + kw * dw * BW_L;
            if (op == OP_CONV) {
                BW_V w = BW(ld)(wk + (kh * KW + kw) * BW_L);
                BW_UNROLL
                for (int x = 0; x < X; x++) acc[x] += w * BW(ld)(base[x] + off);
            } else if (op == OP_MAX) {
                BW_UNROLL
                for (int x = 0; x < X; x++) acc[x] = BW_VMAX(BW(ld)(base[x] + off), acc[x]);
            } else {
                BW_UNROLL
                for (int x = 0; x < X; x++) acc[x] += BW(ld)(base[x] + off);
            }
        }
    }
    if (op == OP_AVG) {
        BW_UNROLL
        for (int x = 0; x < X; x++) acc[x] *= BW(splat)(scale[x]);
    }
    if (op == OP_CONV && a->act == ACT_RELU) {
        BW_UNROLL
        for (int x = 0; x < X; x++) acc[x] = BW_VMAX(acc[x], BW(splat)(0.0f));
    }
    BW_UNROLL
    for (int x = 0; x < X; x++) BW(st)(y + (p + x) * BW_L, acc[x]);
}

/* The band's npx output pixels (narrow rows) in flat tiles of BW_XT, the last overlapping the one
 * before (it writes the same values again); below BW_XT pixels, tiles of 4 the same way, or one. */
BW_INLINE void BW(flat)(const bw_t *a, const float *s, const float *wk, BW_V init, float *y, int64_t oh0,
                        int64_t npx, const int K, const int S, const int op) {
    const int64_t OW = a->OW;
    int64_t p = 0, oh = 0, ow = 0;
    const int X = npx >= BW_XT ? BW_XT : npx >= 4 ? 4 : (int)npx;
#define BW_FLAT(W)                                                                                      {                                                                                                       for (; p + (W) <= npx; p += (W)) {                                                                      BW(ftile)(a, s, wk, init, y, oh0, p, oh, ow, (W), K, S, op);                                        ow += (W);                                                                                          while (ow >= OW) ow -= OW, oh++;                                                                }                                                                                                   if (p < npx) {                                                                                          p = npx - (W);                                                                                      BW(ftile)(a, s, wk, init, y, oh0, p, p / OW, p % OW, (W), K, S, op);                            }                                                                                               }
    if (X == BW_XT) BW_FLAT(BW_XT)
    else if (X == 4) BW_FLAT(4)
    else if (X == 3) BW_FLAT(3)
    else if (X == 2) BW_FLAT(2)
    else if (X == 1) BW_FLAT(1)
#undef BW_FLAT
}

/* Padded copies of the columns [c0, c0 + n) of the input rows ih0 + r * step, r < rows (row r at
 * s + r * n * B): the input's values and the padding (0, -inf for max pooling) around them.  Vector
 * by vector: these runs are short, and a memcpy of a variable size is a libc call. */
BW_INLINE void BW(pad_copy)(const bw_t *a, const float *xp, float *s, int64_t ih0, int64_t step, int64_t rows,
                            int64_t c0, int64_t n, const int op) {
    const BW_V pad = BW(splat)(op == OP_MAX ? -INFINITY : 0.0f);
    const int64_t j0 = min64(max64(a->pl - c0, 0), n), j1 = max64(min64(a->W + a->pl - c0, n), j0);
    for (int64_t r = 0; r < rows; r++) {
        float *d = s + r * n * BW_L;
        int64_t ih = ih0 + r * step, j = 0;
        if (ih >= 0 && ih < a->H) {
            const float *src = xp + (ih * a->W + c0 - a->pl) * BW_L;
            for (; j < j0; j++) BW(st)(d + j * BW_L, pad);
            for (; j < j1; j++) BW(st)(d + j * BW_L, BW(ld)(src + j * BW_L));
        }
        for (; j < n; j++) BW(st)(d + j * BW_L, pad);
    }
}

/* Work item it: one plane (image, channel block) and a band of its output rows.
 * Narrow rows read the band's padded rows, in flat tiles (BW(flat)).  Wide rows (direct) read the input in place, but for the first and last few pixels (a whole tile
 * each, the edge columns among them), which read strips of padded copies of the columns they need,
 * made once for the band's input rows; a row whose window leaves the input at the top or bottom
 * reads a padded copy of its tap rows.  Narrow rows read the band's padded rows. */
BW_INLINE void BW(item)(bw_t *a, int64_t it, const int K, const int S, const int op) {
    band_t bd;
    float *s = bw_band(a, it, &bd);
    if (!s) return;
    const int64_t cb = bd.plane % a->Cb, OW = a->OW, sh = a->sh, sw = a->sw;
    const float *wk = op == OP_CONV ? a->w + cb * a->KH * a->KW * BW_L : NULL;
    BW_V init = BW(splat)(op == OP_MAX ? -INFINITY : 0.0f);
    if (op == OP_CONV && a->bias) init = BW(ld)(a->bias + cb * BW_L);
    float *yp = a->y + bd.plane * a->OH * OW * BW_L;
    const float *xp = a->x + bd.plane * a->H * a->W * BW_L;
    const int64_t reach = (a->KW - 1) * a->dw + 1, left = a->left, right = a->right;
    const int64_t nl = left > 0 ? (left - 1) * sw + reach : 0, c0 = right * sw;
    const int64_t nr = right < OW ? (OW - 1) * sw + reach - c0 : 0;
    float *strip_l = s + a->KH * a->RS, *strip_r = strip_l + bd.rows * nl * BW_L;
    if (a->direct && left < right) { /* strips exist (bw_band sized them) only where a row has a middle */
        int64_t r0 = bd.oh0 * sh - a->pt;
        if (nl) BW(pad_copy)(a, xp, strip_l, r0, 1, bd.rows, 0, nl, op);
        if (nr) BW(pad_copy)(a, xp, strip_r, r0, 1, bd.rows, c0, nr, op);
    }
    if (!a->direct) { /* narrow rows: the band's pixels row-major, tiles running on across rows */
        BW(pad_copy)(a, xp, s, bd.oh0 * sh - a->pt, 1, bd.rows, 0, a->SW, op); /* the band's padded rows */
        float *y = yp + bd.oh0 * OW * BW_L;
        const int64_t npx = (bd.oh1 - bd.oh0) * OW;
        BW(flat)(a, s, wk, init, y, bd.oh0, npx, K, S, op);
        if (op == OP_CONV && a->act != ACT_NONE && a->act != ACT_RELU) /* the band's output, still in L1 */
            act_span(y, npx * BW_L, a->act, a->alpha, a->beta);
        return;
    }
    for (int64_t oh = bd.oh0; oh < bd.oh1; oh++) {
        float *y = yp + oh * OW * BW_L;
        const int64_t ih0 = oh * sh - a->pt, i = (oh - bd.oh0) * sh;
        /* The row's spans (the middle read in place, the edge strips; or one padded row), gathered
         * first and then run by ONE call site: span inlines its five tile widths, and one copy of
         * them per item (not one per call site) keeps the build minutes shorter at no cost here. */
        BW(src_t) src[3];
        int64_t first[3], last[3], n = 0;
        if (ih0 < 0 || ih0 + (a->KH - 1) * a->dh >= a->H || left >= right) {
            BW(pad_copy)(a, xp, s, ih0, a->dh, a->KH, 0, a->SW, op);
            src[n] = (BW(src_t)){s, 0, a->SW * BW_L}, first[n] = 0, last[n++] = OW;
        } else {
            src[n] = (BW(src_t)){xp + ih0 * a->W * BW_L, -a->pl * BW_L, a->dh * a->W * BW_L};
            first[n] = left, last[n++] = right;
            if (nl) src[n] = (BW(src_t)){strip_l + i * nl * BW_L, 0, a->dh * nl * BW_L}, first[n] = 0, last[n++] = left;
            if (nr)
                src[n] = (BW(src_t)){strip_r + i * nr * BW_L, -c0 * BW_L, a->dh * nr * BW_L}, first[n] = right,
                last[n++] = OW;
        }
        for (int64_t g = 0; g < n; g++) BW(span)(a, src[g], wk, init, y, oh, first[g], last[g], K, S, op);
        if (op == OP_CONV && a->act != ACT_NONE && a->act != ACT_RELU) /* the row's output, still in L1 */
            act_span(y, OW * BW_L, a->act, a->alpha, a->beta);
    }
}

BW_ATTR static void BW(conv3s1)(void *ctx, int64_t it) { BW(item)(ctx, it, 3, 1, OP_CONV); }
BW_ATTR static void BW(conv3s2)(void *ctx, int64_t it) { BW(item)(ctx, it, 3, 2, OP_CONV); }
BW_ATTR static void BW(conv5s1)(void *ctx, int64_t it) { BW(item)(ctx, it, 5, 1, OP_CONV); }
BW_ATTR static void BW(conv5s2)(void *ctx, int64_t it) { BW(item)(ctx, it, 5, 2, OP_CONV); }
BW_ATTR static void BW(conv_any)(void *ctx, int64_t it) { BW(item)(ctx, it, 0, 0, OP_CONV); }
BW_ATTR static void BW(max3s2)(void *ctx, int64_t it) { BW(item)(ctx, it, 3, 2, OP_MAX); }
BW_ATTR static void BW(max2s2)(void *ctx, int64_t it) { BW(item)(ctx, it, 2, 2, OP_MAX); }
BW_ATTR static void BW(max_any)(void *ctx, int64_t it) { BW(item)(ctx, it, 0, 0, OP_MAX); }
BW_ATTR static void BW(avg_any)(void *ctx, int64_t it) { BW(item)(ctx, it, 0, 0, OP_AVG); }

/* Global average: planes [it * group, ...) summed pixel by pixel in 4 float vectors, flushed into
 * double lanes every 256 pixels (float lanes alone would lose digits on a 112 x 112 plane). */
BW_ATTR static void BW(gap)(void *ctx, int64_t it) {
    const gap_t *a = ctx;
    int64_t p1 = (it + 1) * a->group < a->planes ? (it + 1) * a->group : a->planes;
    for (int64_t p = it * a->group; p < p1; p++) {
        const float *x = a->x + p * a->hw * BW_L;
        double sum[BW_L] = {0};
        for (int64_t b = 0; b < a->hw; b += 256) {
            int64_t e = b + 256 < a->hw ? b + 256 : a->hw, i = b;
            BW_V s0 = BW(splat)(0.0f), s1 = s0, s2 = s0, s3 = s0;
            for (; i + 4 <= e; i += 4) {
                s0 += BW(ld)(x + i * BW_L);
                s1 += BW(ld)(x + (i + 1) * BW_L);
                s2 += BW(ld)(x + (i + 2) * BW_L);
                s3 += BW(ld)(x + (i + 3) * BW_L);
            }
            for (; i < e; i++) s0 += BW(ld)(x + i * BW_L);
            s0 = (s0 + s1) + (s2 + s3);
            for (int l = 0; l < BW_L; l++) sum[l] += (double)s0[l];
        }
        for (int l = 0; l < BW_L; l++) a->y[p * BW_L + l] = (float)(sum[l] / (double)a->hw);
    }
}

static const bw_variant_t BW(variant) = {BW(conv3s1), BW(conv3s2), BW(conv5s1), BW(conv5s2), BW(conv_any),
                                         BW(max3s2),  BW(max2s2),  BW(max_any), BW(avg_any),  BW(gap)};

#undef BW_VMAX
#undef BW_INLINE
#undef BW_TARGET
#undef BW_UNROLL
#undef BW_V
#undef BW_L
#undef BW_XT
#undef BW_ATTR
#undef BW
