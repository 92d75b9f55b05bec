/* The blocked dense conv's work items, written once for a vector type (included by blocked_conv.c
 * once per channel block width B).
 *
 * Before including, define BC_V (the vector type: BC_L floats, the block width B), BC_OB (output
 * blocks of a register tile at most), BC_SPLAT(a) (a vector literal of BC_L copies of a), BC_ACC (accumulators a tile may have), BC_XMAX (output pixels
 * of a register tile at most: 12 or 8), BC_ATTR (the target
 * attribute of this variant's item functions, or nothing), BC_TARGET (the same for the inlined
 * helpers) and BC(name) (the name with this variant's suffix); they are undefined at the end.
 *
 * A register tile is OB output blocks (vectors of B output channels) x X output pixels of one row:
 * per input channel and tap, OB weight vectors and X broadcast inputs make OB * X multiply-adds.
 * Input channel ci is lane ci % ib of input block ci / ib: ib = B for a blocked input, 1 for a
 * plain NCHW one (a plane per channel), so one loop reads both.
 */
#define BC_INLINE BC_TARGET ALWAYS_INLINE
#define BC_UNROLL _Pragma("GCC unroll 16")

BC_INLINE BC_V BC(ld)(const float *p) { BC_V v; memcpy(&v, p, sizeof v); return v; }
BC_INLINE void BC(st)(float *p, BC_V v) { memcpy(p, &v, sizeof v); }
/* A broadcast: an initializer, not 0 + a (that is an add, 0 + -0 is +0, before the broadcast),
 * and a macro, not a function returning the vector: GCC lowers a vector built inside an inlined
 * default-target function as for the default target, so the AVX2 clone made each broadcast from
 * eight vinsertps and spilled accumulators around them (2x slower tiles). */
#define BC_VSPLAT(a) ((BC_V)BC_SPLAT(a))

typedef int32_t BC(vi) __attribute__((vector_size(sizeof(BC_V))));

/* Lanes of a where m is set, of b elsewhere. */
BC_INLINE BC_V BC(sel)(BC(vi) m, BC_V a, BC_V b) { return (BC_V)((m & (BC(vi))a) | (~m & (BC(vi))b)); }

/* relu and clip in registers as the tile is stored (a NaN stays NaN, as with np.maximum / np.clip):
 * the bounds made once per tile, after its loops, through volatiles (see GK(bounds) in
 * gemm_kernel.h: hoisted, a bound holds a register the accumulators need; made per vector, a Clip
 * cost a pointwise conv with 16 input channels 60% more than a Relu). */
BC_INLINE BC_V BC(clamp)(const bc_t *a, BC_V v, BC_V lo, BC_V hi) {
    if (a->act == ACT_RELU || a->act == ACT_CLIP) v = BC(sel)(v < lo, lo, v);
    if (a->act == ACT_CLIP) v = BC(sel)(v > hi, hi, v);
    return v;
}

/* A tile's accumulators start from the bias (or zero) on the first block of input channels, from
 * the partial sums in y after that; the last block adds the residual before the store. */
BC_INLINE void BC(init)(const bc_t *a, BC_V acc[BC_OB][BC_XMAX], int64_t n, int64_t ob0, int64_t q0, const int OB,
                        const int X, int first) {
    BC_UNROLL
    for (int o = 0; o < OB; o++) {
        const int64_t at = ((n * a->Mb + ob0 + o) * a->OP + q0) * BC_L;
        BC_V b = a->bias ? BC(ld)(a->bias + (ob0 + o) * BC_L) : BC_VSPLAT(0.0f);
        BC_UNROLL
        for (int x = 0; x < X; x++) acc[o][x] = first ? b : BC(ld)(a->y + at + x * BC_L);
    }
}

BC_INLINE void BC(store)(const bc_t *a, BC_V acc[BC_OB][BC_XMAX], int64_t n, int64_t ob0, int64_t q0, const int OB,
                         const int X, int last) {
    BC_V lo = BC_VSPLAT(0.0f), hi = lo;
    if (last && (a->act == ACT_RELU || a->act == ACT_CLIP)) {
        volatile float lo_bound = a->act == ACT_RELU ? 0.0f : a->alpha, hi_bound = a->beta;
        const float l = lo_bound, h = hi_bound; /* one read each: a splat of the volatile reads it per lane */
        lo = BC_VSPLAT(l);
        hi = BC_VSPLAT(h);
    }
    BC_UNROLL
    for (int o = 0; o < OB; o++) {
        const int64_t at = ((n * a->Mb + ob0 + o) * a->OP + q0) * BC_L;
        BC_UNROLL
        for (int x = 0; x < X; x++) {
            BC_V v = acc[o][x];
            if (last && a->res) v += BC(ld)(a->res + at + x * BC_L);
            if (last) v = BC(clamp)(a, v, lo, hi);
            BC(st)(a->y + at + x * BC_L, v);
        }
    }
}

/* The input channels [b0, b1) for one tile: channel ci is lane ci % ib of input block ci / ib.
 * Block by block, lane by lane: worked out per channel, the block's address took a shift, a
 * multiply and three adds per channel (35 instructions around a pointwise tile's 12 FMAs). */
#define BC_CHANNELS(BODY)                                                            \
    for (int64_t ci = b0; ci < b1;) {                                                \
        const float *xb_ = xn + (ci >> a->ib_shift) * plane;                         \
        const int64_t l0_ = ci & (ib - 1);                                           \
        const int64_t l1_ = ib - l0_ < b1 - ci ? ib : l0_ + (b1 - ci);               \
        for (int64_t l_ = l0_; l_ < l1_; l_++, ci++) {                               \
            const float *xc = xb_ + l_;                                              \
            BODY;                                                                    \
        }                                                                            \
    }

/* Pointwise (1x1, stride 1, no padding): X positions from p0 of the flattened plane. */
BC_INLINE void BC(pw_tile)(const bc_t *a, int64_t n, int64_t ob0, int64_t p0, int64_t b0, int64_t b1, const int OB,
                           const int X) {
    BC_V acc[BC_OB][BC_XMAX];
    BC(init)(a, acc, n, ob0, p0, OB, X, b0 == 0);
    /* weights [group][C][G][B]: the tile's vectors side by side (one address, no spilled offsets) */
    const int64_t ib = a->ib, plane = a->H * a->W * ib, G = BC_OB;
    const float *xn = a->x + n * a->Cbi * plane + p0 * ib, *wg = a->w + (ob0 - a->wob) * a->C * BC_L;
    BC_CHANNELS({
        const float *wc = wg + ci * G * BC_L;
        BC_V wv[BC_OB];
        BC_UNROLL
        for (int o = 0; o < OB; o++) wv[o] = BC(ld)(wc + o * BC_L);
        BC_UNROLL
        for (int x = 0; x < X; x++) {
            BC_V v = BC_VSPLAT(xc[x * ib]);
            BC_UNROLL
            for (int o = 0; o < OB; o++) acc[o][x] += wv[o] * v;
        }
    });
    BC(store)(a, acc, n, ob0, p0, OB, X, b1 == a->C);
}

/* The taps of a tile's window in its input rows kh0..kh1, for one input channel (or block) at
 * xbase with its weights at wbase: BODY sees the tap's input row xr, first column iw, weights wq. */
#define BC_TAPS(xbase, wbase, BODY)                                                   \
    for (int64_t kh = kh0; kh < kh1; kh++) {                                          \
        const float *xr = (xbase) + (ih0 + kh * a->dh) * W * ib;                      \
        for (int64_t kw = 0; kw < a->KW; kw++) {                                      \
            const int64_t iw = iw0 + kw * a->dw;                                      \
            const float *wq = (wbase) + (kh * a->KW + kw) * G * BC_L;                 \
            BODY;                                                                     \
        }                                                                             \
    }

/* A general window: X pixels of output row oh from column ow0; every tap inside the input's
 * columns unless CHECK, where taps outside them read zero (the tiles at a row's edges). */
BC_INLINE void BC(tile)(const bc_t *a, int64_t n, int64_t ob0, int64_t oh, int64_t ow0, int64_t b0, int64_t b1,
                        const int OB, const int X, const int CHECK) {
    BC_V acc[BC_OB][BC_XMAX];
    BC(init)(a, acc, n, ob0, oh * a->OW + ow0, OB, X, b0 == 0);
    const int64_t ib = a->ib, plane = a->H * a->W * ib, taps = a->KH * a->KW, G = BC_OB;
    const int64_t sw = a->sw, iw0 = ow0 * sw - a->pl, W = a->W;
    const float *xn = a->x + n * a->Cbi * plane, *wg = a->w + (ob0 - a->wob) * a->C * taps * BC_L;
    int64_t kh0 = 0, kh1 = a->KH;
    const int64_t ih0 = oh * a->sh - a->pt;
    while (kh0 < kh1 && ih0 + kh0 * a->dh < 0) kh0++;
    while (kh1 > kh0 && ih0 + (kh1 - 1) * a->dh >= a->H) kh1--;
    /* A blocked input's whole blocks: per tap, the block's BC_L lanes unrolled, so the loop that
     * runs is over taps and blocks with BC_L * OB * X multiply-adds inside.  One channel at a time
     * (the loop below) left a loop of KW = 3 trips per channel and tap row around OB * X
     * multiply-adds, its exits mispredicted: ResNet-18's 3x3 convs ran at 0.6x the implicit GEMM's
     * speed, 0.9-1.25x with the lanes unrolled (AVX2, 1 thread, conversions counted to the GEMM). */
    const int64_t wlane = taps * G * BC_L; /* floats from one input channel's weights to the next's */
    int64_t cfull = b1 / BC_L * BC_L; /* the channels in whole blocks (b0 starts one: see kc) */
    if (ib != BC_L || b0 % BC_L || cfull < b0) cfull = b0;
    /* Narrow tiles (a row's edge columns, the last pixels of a short row) sum alternate lanes into
     * separate accumulators, S sets in all, so about 8 multiply-add chains are in flight: a 2 x 1
     * tile with two chains waited on the FMA latency, at a quarter of the FMA units' rate. */
    const int S = OB * X >= 8 ? 1 : OB * X >= 4 ? 2 : 4; /* a constant where the tile is inlined */
    BC_V ex[3][BC_OB][BC_XMAX];
    BC_UNROLL
    for (int e = 0; e < S - 1; e++)
        BC_UNROLL
        for (int o = 0; o < OB; o++)
            BC_UNROLL
            for (int x = 0; x < X; x++) ex[e][o][x] = BC_VSPLAT(0.0f);
    for (int64_t cb = b0 / BC_L; cb < cfull / BC_L; cb++) {
        BC_TAPS(xn + cb * plane, wg + cb * BC_L * wlane, {
            int in[BC_XMAX];
            int64_t at[BC_XMAX];
            BC_UNROLL
            for (int x = 0; x < X; x++) {
                at[x] = iw + x * sw;
                in[x] = !CHECK || (at[x] >= 0 && at[x] < W); /* outside: read the row's start, use 0 */
                at[x] = (in[x] ? at[x] : 0) * BC_L;
            }
            const float *wl = wq; /* stepped by wlane: offsets l * wlane took a register each, spilled */
            BC_UNROLL
            for (int l = 0; l < BC_L; l++, wl += wlane) {
                BC_V wv[BC_OB];
                BC_UNROLL
                for (int o = 0; o < OB; o++) wv[o] = BC(ld)(wl + o * BC_L);
                BC_UNROLL
                for (int x = 0; x < X; x++) {
                    const float xv = xr[at[x] + l];
                    BC_V v = BC_VSPLAT(!CHECK || in[x] ? xv : 0.0f);
                    BC_UNROLL
                    for (int o = 0; o < OB; o++) {
                        if (l % S == 0) acc[o][x] += wv[o] * v;
                        else ex[l % S - 1][o][x] += wv[o] * v;
                    }
                }
            }
        });
    }
    BC_UNROLL
    for (int e = 0; e < S - 1; e++)
        BC_UNROLL
        for (int o = 0; o < OB; o++)
            BC_UNROLL
            for (int x = 0; x < X; x++) acc[o][x] += ex[e][o][x];
    b0 = cfull; /* the rest (a partial last block, a plain input): one channel at a time */
    BC_CHANNELS({
        BC_TAPS(xc, wg + ci * taps * G * BC_L, {
            BC_V wv[BC_OB];
            BC_UNROLL
            for (int o = 0; o < OB; o++) wv[o] = BC(ld)(wq + o * BC_L);
            BC_UNROLL
            for (int x = 0; x < X; x++) {
                const int64_t at = iw + x * sw;
                const int in = !CHECK || (at >= 0 && at < W); /* outside: read the row's start, use 0 */
                const float xv = xr[(in ? at : 0) * ib];
                BC_V v = BC_VSPLAT(in ? xv : 0.0f);
                BC_UNROLL
                for (int o = 0; o < OB; o++) acc[o][x] += wv[o] * v;
            }
        });
    });
    BC(store)(a, acc, n, ob0, oh * a->OW + ow0, OB, X, b1 == a->C);
}

/* Tiles over [first, last) of a row (or of the flattened plane: pointwise), XF pixels at a time
 * (the widest tile for this many output blocks), the rest in narrower ones: tiles never overlap,
 * since a pass over a block of input channels adds to what the pass before left in y. */
#define BC_SPAN(XF, CALL)                                                             \
    for (int64_t q = first; q < last;) {                                              \
        const int64_t n_ = last - q;                                                  \
        const int w_ = n_ >= (XF) ? (XF) : n_ >= 8 ? 8 : n_ >= 6 ? 6 : n_ >= 4 ? 4 : n_ >= 2 ? 2 : 1; \
        CALL(q, w_);                                                                  \
        q += w_;                                                                      \
    }

/* OB output blocks, and the widest tile for them: about 24 accumulators (BC_ACC). */
#define BC_XF(OB) ((BC_ACC / (OB)) >= 12 ? 12 : (BC_ACC / (OB)) >= 8 ? 8 : (BC_ACC / (OB)) >= 6 ? 6 : 4)
#define BC_BY_X(W, F, ...)                                        \
    switch (W) {                                                  \
    case 12: if (BC_XMAX >= 12) F(__VA_ARGS__, 12 <= BC_XMAX ? 12 : 1); break; \
    case 8: F(__VA_ARGS__, 8); break;                             \
    case 6: F(__VA_ARGS__, 6); break;                             \
    case 4: F(__VA_ARGS__, 4); break;                             \
    case 2: F(__VA_ARGS__, 2); break;                             \
    default: F(__VA_ARGS__, 1); break;                            \
    }

#define BC_PW(obn, q, X) BC(pw_tile)(a, n, ob0, q, b0, b1, obn, X)
#define BC_PW_CALL(q, w) BC_BY_X(w, BC_PW, ob_, q)
#define BC_TL(obn, q, X) BC(tile)(a, n, ob0, oh, q, b0, b1, obn, X, 0)
#define BC_TL_CALL(q, w) BC_BY_X(w, BC_TL, ob_, q)
#define BC_CK(obn, q, X) BC(tile)(a, n, ob0, oh, q, b0, b1, obn, X, 1)
#define BC_CK_CALL(q, w) BC_BY_X(w, BC_CK, ob_, q)

/* The spans of one tile kind (pointwise, unchecked, checked), each a function of its own: it holds
 * every (blocks, width) tile inlined, and GCC's data-flow passes grow faster than the size of the
 * function they work on: all of them inlined into the item took the build minutes.  A call per row
 * costs nothing next to a row's multiply-adds. */
#define BC_SPAN_ARGS                                                                                 \
    const bc_t *a, int64_t n, int64_t ob0, int64_t oh, int64_t first, int64_t last, int64_t b0, int64_t b1
#define BC_SPAN_OB(name, CALL, OB)                                                                   \
    BC_ATTR __attribute__((noinline)) static void BC(name##_##OB)(BC_SPAN_ARGS) {                      \
        const int ob_ = (OB) <= BC_OB ? (OB) : 1;                                                    \
        if ((OB) > BC_OB) return; /* no such group on this variant: nothing to compile */            \
        BC_SPAN(BC_XF(ob_), CALL);                                                                   \
    }
#define BC_SPAN_FN(name, CALL)                                                                       \
    BC_SPAN_OB(name, CALL, 1)                                                                        \
    BC_SPAN_OB(name, CALL, 2)                                                                        \
    BC_SPAN_OB(name, CALL, 3)                                                                        \
    BC_SPAN_OB(name, CALL, 4)                                                                        \
    static void BC(name)(BC_SPAN_ARGS, int64_t obn) {                                                \
        if (obn == 1) BC(name##_1)(a, n, ob0, oh, first, last, b0, b1);                              \
        else if (obn == 2) BC(name##_2)(a, n, ob0, oh, first, last, b0, b1);                         \
        else if (obn == 3 && BC_OB >= 3) BC(name##_3)(a, n, ob0, oh, first, last, b0, b1);           \
        else if (BC_OB >= 4) BC(name##_4)(a, n, ob0, oh, first, last, b0, b1);                       \
    }
BC_SPAN_FN(pw_span, BC_PW_CALL)
BC_SPAN_FN(tl_span, BC_TL_CALL)
BC_SPAN_FN(ck_span, BC_CK_CALL)

/* Work item it: image n, a group of BC_OB output blocks, a band of output rows (pointwise: of
 * flattened positions).  The input channels go in blocks of a->kc, whose weights stay in L1
 * while every tile of the band takes them (partial sums in y in between). */
BC_INLINE void BC(item)(bc_t *all, int64_t it) {
    const int64_t band = all->groups_inner ? it / all->ngroups % all->nbands : it % all->nbands;
    const int64_t og = all->groups_inner ? it % all->ngroups : it / all->nbands % all->ngroups;
    const int64_t n = it / all->nbands / all->ngroups;
    /* Conv group g = og / tpg is a one-group conv of cg input channels (from input block or plane
     * g * cg / ib) into its mgb output blocks, its weights packed on their own ([tpg, cg, KH, KW, G,
     * B] per group, one after another); y, bias and residual keep the whole conv's blocks. */
    const int64_t g = og / all->tpg, ob0 = g * all->mgb + og % all->tpg * BC_OB;
    const int64_t left_in_group = (g + 1) * all->mgb - ob0, obn = left_in_group < BC_OB ? left_in_group : BC_OB;
    bc_t grp;
    bc_t *a = all;
    if (all->groups > 1) {
        grp = *all;
        grp.x = all->x + g * all->cg / all->ib * all->H * all->W * all->ib;
        grp.C = all->cg;
        grp.wob = ob0 - og * BC_OB;
        a = &grp;
    }
    const int64_t lo = a->ow_lo, hi = a->ow_hi, OW = a->OW;
    const int64_t per_ch = a->KH * a->KW * BC_OB * BC_L; /* floats of one input channel's weights in a group */
    const float *wg = a->w + (ob0 - a->wob) * a->C * a->KH * a->KW * BC_L;
    for (int64_t b0 = 0; b0 < a->C; b0 += a->kc) {
        const int64_t b1 = b0 + a->kc < a->C ? b0 + a->kc : a->C;
        /* The next pass's weights (after the last, the next group's first pass), fetched while this
         * pass runs, a slice per row: a deep layer's weights (512 x 512 x 3 x 3: 9.4 MB) come from
         * memory once per call, and the first tile of each pass waited on them: 512 x 512 on 7 x 7
         * planes 0.93x the time with the prefetch, 256 x 256 on 14 x 14 0.94x (AVX2, 1 thread).
         * Weights that stay in cache skip it (a->prefetch): there it cost 3-5%. */
        const float *nx = NULL;
        int64_t nfloats = 0;
        if (a->prefetch && b1 < a->C) {
            nx = wg + b1 * per_ch;
            nfloats = ((b1 + a->kc < a->C ? b1 + a->kc : a->C) - b1) * per_ch;
        } else if (a->prefetch && ob0 + BC_OB < a->Mb) {
            nx = wg + a->C * per_ch;
            nfloats = (a->kc < a->C ? a->kc : a->C) * per_ch;
        }
        if (a->pointwise) {
            const int64_t first = band * a->band, last = first + a->band < a->OP ? first + a->band : a->OP;
            BC(pw_span)(a, n, ob0, 0, first, last, b0, b1, obn);
            continue;
        }
        const int64_t oh0 = band * a->band, oh1 = oh0 + a->band < a->OH ? oh0 + a->band : a->OH;
        /* checked tiles cover exactly the edge columns whose window leaves the input (narrow rows
         * entirely), unchecked ones the columns between: a whole tile from each edge, checked,
         * took 12 of a 28-pixel row's columns through the checks, half the conv's time */
        int64_t left = lo, right = hi;
        if (left > OW) left = OW;
        if (right < left) right = left;
        const int64_t rows = oh1 - oh0, slice = nx ? (nfloats + rows - 1) / rows : 0;
        for (int64_t oh = oh0; oh < oh1; oh++) {
            if (nx) {
                const int64_t s0 = (oh - oh0) * slice, s1 = s0 + slice < nfloats ? s0 + slice : nfloats;
                for (int64_t f = s0; f < s1; f += 16) __builtin_prefetch(nx + f, 0, 2);
            }
            if (left >= right) {
                BC(ck_span)(a, n, ob0, oh, 0, OW, b0, b1, obn);
                continue;
            }
            BC(tl_span)(a, n, ob0, oh, left, right, b0, b1, obn);
            if (left > 0) BC(ck_span)(a, n, ob0, oh, 0, left, b0, b1, obn);
            if (right < OW) BC(ck_span)(a, n, ob0, oh, right, OW, b0, b1, obn);
        }
    }
    if (a->act == ACT_NONE || a->act == ACT_RELU || a->act == ACT_CLIP) return;
    /* the item's output, in the cache still: one pass of the activation */
    const int64_t q0 = a->pointwise ? band * a->band : band * a->band * OW;
    const int64_t q1 = a->pointwise ? (q0 + a->band < a->OP ? q0 + a->band : a->OP)
                                    : (band * a->band + a->band < a->OH ? band * a->band + a->band : a->OH) * OW;
    for (int64_t o = 0; o < obn; o++)
        act_span(a->y + ((n * a->Mb + ob0 + o) * a->OP + q0) * BC_L, (q1 - q0) * BC_L, a->act, a->alpha, a->beta);
}

BC_ATTR static void BC(run_item)(void *ctx, int64_t it) { BC(item)(ctx, it); }

#undef BC_SPAN_FN
#undef BC_SPAN_OB
#undef BC_SPAN_ARGS
#undef BC_PW
#undef BC_PW_CALL
#undef BC_TL
#undef BC_TL_CALL
#undef BC_CK
#undef BC_CK_CALL
#undef BC_XF
#undef BC_SPLAT
#undef BC_VSPLAT
#undef BC_CHANNELS
#undef BC_TAPS
#undef BC_XMAX
#undef BC_ACC
#undef BC_BY_X
#undef BC_SPAN
#undef BC_UNROLL
#undef BC_INLINE
#undef BC_V
#undef BC_L
#undef BC_OB
#undef BC_ATTR
#undef BC_TARGET
#undef BC
