/* The GEMM convolutions: Y[M, N] = act(W[M, K] @ X[K, N] + bias[M] + R[M, N]), fp32, one pass
 * over Y, for a batch of images that share W (1x1 convs: X is an image's [C, H*W] as it lies).
 *
 * Why not BLAS plus an epilogue: on the 1x1 convs of the MobileNet family K is small (16..960)
 * and N large, so the product is close to memory-bound and a second pass over Y for bias and
 * activation (and a third for a residual) costs as much as a good part of the GEMM.  Here every
 * MR x NR register tile starts from its bias, runs through its K, adds its residual, goes
 * through the activation and is stored once.
 *
 * Blocking (BLIS-like): a work item is (image, band of NB columns, band of rows).  For each
 * K block (as long as keeps a packed panel in half the L1) the item packs its columns of X into
 * NR-wide panels (contiguous, zero past N: the micro-kernel reads B sequentially whatever the row
 * stride of X; the band's panels stay in L2), then takes W's rows MR at a time, each such tile of
 * W in L1 against all the band's panels in turn.  W is not packed: a tile reads its MR rows of W
 * at k as MR broadcasts from MR sequential streams in L1, so there is no per-call packing cost and
 * no cache of packed weights to keep coherent.  Partial sums of all but the last K block go through
 * Y (still in L2).  The work item itself is in gemm_kernel.h, once per vector width.
 *
 * Two shapes take other work items: under NARROW_COLS columns (squeeze-excitation convs and conv
 * heads on [1, C, 1, 1], classifier heads on their weight transposed) every output is a dot
 * product along K (GK(narrow)), since no 16- or 32-column tile fits; and small planes (16 to
 * TRANSPOSED_COLS columns: the 1x1 convs on 7x7 and 14x14), given W.T's panels packed once by the
 * caller, run as Y.T = X.T @ W.T vectorised along M (GK(transposed)), where 49 columns filled 64.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "optcli_native.h"
#include "simd.h"

#define PANEL_FLOATS 6144      /* a packed panel of X, K block x NR floats: 24 KiB, half an L1 */
#define L2_FLOATS (64 * 1024)  /* 256 KiB: an item's packed band of X, in L2 */
#define THIN_ROWS 4            /* GK_TM: products of this few rows take the thin work item */
#define NARROW_COLS 16         /* products of fewer columns take the narrow work item (dot products) */
#define TRANSPOSED_COLS 256    /* products of NARROW_COLS..this many columns may be taken transposed */
#define ALONE_MACS (1 << 20)   /* below ~1M multiply-adds (~10 us on one core) waking a worker costs more */

/* A 2-D convolution's geometry, for the implicit GEMM: X is never formed, its columns are
 * packed straight from the zero-padded input (C x HP x WP per image): row k = (c, kh, kw) of X at
 * column n = (oh, ow) is xp[c][oh * sh + kh * dh][ow * sw + kw * dw]. */
typedef struct {
    int64_t C, HP, WP, KH, KW, sh, sw, dh, dw, OH, OW;
} conv_t;

typedef struct {
    const float *w, *x, *bias, *res;
    int res_row;               /* res is one row of N floats, added to every row of every image (a
                                  fully connected layer's bias: optcli_fc_f32) */
    int64_t rld, rimg;         /* res's row and image strides (set by run(): N and M * N, or 0 for a row) */
    const float *wt;           /* W.T [K, M], for the transposed item (NULL: not given) */
    float *y;
    const conv_t *conv;        /* NULL: X is a matrix [K, N] per image */
    float *packed;             /* X packed once for all row bands (NULL: each item packs its own) */
    int given_packed;          /* packed by the caller (optcli_fc_pack_f32): run() neither packs nor frees it */
    int64_t given_nr;          /* the panel width it was packed for: another variant's is not used */
    int64_t pstride;           /* floats of packed X per image */
    int64_t xstride;           /* floats per image of x */
    int64_t M, K, N;
    int64_t groups;            /* grouped convs: image b is group b % groups of its input, with that
                                  group's rows of W and bias (0 or 1: one W for every image) */
    int64_t kc, nb, mb;        /* K block, columns and rows per item */
    int64_t nn, nm;            /* column bands and row bands per image */
    int act;
    float alpha, beta;
    _Atomic int failed;
    /* the narrow path: its bands, the calling thread (it takes bands from the front, the
     * workers from the back), and the bands counted, taken from the front and from the back */
    int64_t bands;
    pthread_t caller;
    _Atomic int64_t claims, front, back;
} gemm_t;

/* Variants of the work item, by vector width: 4 floats (one NEON register: GCC builds wider
 * generic vectors on aarch64 through the stack, and the accumulators would not stay in registers),
 * 8 floats on x86-64 (an AVX2+FMA clone picked at load, as in simd.h), and 16 floats on x86-64 CPUs
 * with AVX-512, where BLAS libraries use the 512-bit registers and 8-float tiles run at half their
 * speed.  The AVX-512 one is picked here at run time (the CPU is asked once). */
/* v16f: simd.h */

typedef struct {
    int mr, nr;               /* a register tile's rows, and columns (two vectors) */
    const opt_item_fn *items; /* the work item, per activation code */
    const opt_item_fn *thin;  /* the same for thin products (GK_TM rows or fewer) */
    opt_item_fn prepack;      /* packs X for all row bands at once */
    opt_item_fn narrow;       /* products of fewer than NARROW_COLS columns, X transposed */
    opt_item_fn transposed;   /* small planes, Y.T = X.T @ W.T (see optcli_gemm_conv_t_f32) */
    void (*pack_wt)(const float *w, float *wt, int64_t m, int64_t k); /* W into W.T's panels */
} variant_t;

#define GK_V v4f
#define GK_L 4
#define GK_SPLAT(a) {a, a, a, a}
#define GK_MR 8 /* 8 x 2 vectors: 16 accumulators, 8 broadcasts and 2 loads of NEON's 32 registers */
#define GK_NC 2 /* narrow: 8 rows x 2 columns, 16 accumulators */
#define GK_ATTR
#define GK(name) gk4_##name
#include "gemm_kernel.h"

#define GK_V v8f
#define GK_L 8
#define GK_SPLAT(a) {a, a, a, a, a, a, a, a}
#define GK_MR 6 /* 6 x 2 vectors: 12 accumulators of AVX2's 16 registers */
#define GK_NC 1 /* narrow: 8 rows x 1 column, 8 accumulators (two columns would spill) */
#define GK_ATTR HOT_CLONES
#define GK(name) gk8_##name
#include "gemm_kernel.h"

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 14))
#define HAVE_GK16 1
#define GK_V v16f
#define GK_L 16
#define GK_SPLAT(a) {a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}
#define GK_MR 12 /* 12 x 2 vectors: 24 accumulators of 32 registers */
#define GK_NC 2  /* narrow: 8 rows x 2 columns, 16 accumulators */
#define GK_ATTR __attribute__((target("arch=x86-64-v4")))
#define GK(name) gk16_##name
#include "gemm_kernel.h"
#endif

static const variant_t *_Atomic g_variant; /* set once (pthread_once), or by the tests' optcli_gemm_variant */
static pthread_once_t g_variant_once = PTHREAD_ONCE_INIT;

static void pick_variant(void) {
#if defined(__x86_64__) || defined(__i386__)
    g_variant = &gk8_variant;
#else
    g_variant = &gk4_variant;
#endif
#ifdef HAVE_GK16
    if (opt_cpu_has_avx512()) g_variant = &gk16_variant;
#endif
}

OPT_API int optcli_gemm_variant(int lanes) {
    pthread_once(&g_variant_once, pick_variant);
    if (lanes == 4) {
        g_variant = &gk4_variant;
    } else if (lanes == 8) {
        g_variant = &gk8_variant;
    } else if (lanes == 16) {
#ifdef HAVE_GK16
        if (!opt_cpu_has_avx512()) return -1;
        g_variant = &gk16_variant;
#else
        return -1;
#endif
    } else if (lanes == 0) {
        pick_variant();
    } else if (lanes != -1) {
        return -1;
    }
    return g_variant->nr / 2;
}

static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* K blocks of equal size, none above what keeps a packed panel (nr columns) in L1. */
static int64_t k_block(int64_t K, int64_t nr) {
    int64_t kmax = PANEL_FLOATS / nr, kblocks = (K + kmax - 1) / kmax;
    return (K + kblocks - 1) / kblocks;
}

/* Blocks and work items for g (w, x, bias, res, y, M, K, N, act set), then the job itself. */
static int run(gemm_t *g, int64_t batch) {
    pthread_once(&g_variant_once, pick_variant);
    const variant_t v = *g_variant;
    const int64_t M = g->M, K = g->K, N = g->N, mr = v.mr, nr = v.nr;
    g->rld = g->res_row ? 0 : N;
    g->rimg = g->res_row ? 0 : M * N;
    g->kc = k_block(K, nr);
    if (g->given_packed && g->given_nr != nr) { /* packed for another variant (the tests switch them) */
        g->packed = NULL;
        g->given_packed = 0;
    }
    /* Items: about 4 per thread (a thread that is not scheduled leaves its share to the others).
     * Each column band reads all of its rows of W and each row band packs all of its columns of
     * X, so split the columns when X is the larger (N > M) and the rows when W is (the late
     * layers: a 512 x 4608 W read once per band of 49 columns would come from memory over and
     * over).  A column band is never wider than the L2 holds packed. */
    int threads = optcli_get_num_threads();
    /* One thread takes the whole product as one item: split, each row band would pack its columns
     * of X again (MTCNN R-net's 28 -> 48 3x3 conv on 11x11, 81 columns: two row bands each).  So
     * does a product below ALONE_MACS at any thread count: it runs on the caller alone anyway, and
     * split for 2 threads the same conv took 25 us where one item took 18. */
    int64_t macs = batch * M * K * N, alone = macs < ALONE_MACS,
            want = threads == 1 || alone || batch >= 4 * threads ? 1 : (4 * threads + batch - 1) / batch;
    if (N < NARROW_COLS && !g->conv) { /* dot products along K: see GK(narrow) */
        /* X transposed, each column contiguous (one column is already): N x K floats per image,
         * small beside W's M x K */
        float *xt = NULL;
        if (N > 1) {
            xt = malloc((size_t)(batch * N * K) * sizeof(float));
            if (!xt) return OPT_ENOMEM;
            for (int64_t b = 0; b < batch; b++)
                for (int64_t k = 0; k < K; k++)
                    for (int64_t n = 0; n < N; n++) xt[(b * N + n) * K + k] = g->x[b * g->xstride + k * N + n];
            g->x = xt;
            g->xstride = N * K;
        }
        /* W is read once, in bands of whole 8-row tiles, about 8 per thread: a worker that
         * wakes late (or is not scheduled) still finds bands left to take.  The calling thread
         * takes them from the first row on and the workers from the last one back, so each
         * thread reads about the same rows call after call (where they meet depends on when a
         * worker wakes) and finds them in its own L2 when W fits the caches together. */
        int64_t bands = batch >= 8 * threads ? 1 : (8 * threads + batch - 1) / batch;
        g->mb = round_up((M + bands - 1) / bands, 8);
        g->nm = (M + g->mb - 1) / g->mb;
        g->bands = batch * g->nm;
        g->caller = pthread_self();
        /* memory-bound: a second thread pays from far fewer multiply-adds than a tiled product */
        int64_t helpers = macs < (1 << 15) ? 1 : threads;
        opt_parallel(v.narrow, g, helpers < g->bands ? helpers : g->bands, 0);
        free(xt);
        return 0;
    }
    if (g->wt && !g->conv && M % (nr / 2) == 0) { /* see GK(transposed) */
        /* Items: bands of whole panels of W.T (nr columns of M) by bands of columns (whole
         * tiles of mr), about 4 per thread: M first (X is shared, in L2), N as well where M has
         * too few panels (a 32-channel output is one panel) */
        g->mb = round_up((M + want - 1) / want, nr);
        g->nm = (M + g->mb - 1) / g->mb;
        g->nb = N;
        if (g->nm < want) {
            int64_t split = (want + g->nm - 1) / g->nm;
            g->nb = round_up((N + split - 1) / split, mr);
        }
        g->nn = (N + g->nb - 1) / g->nb;
        opt_parallel(v.transposed, g, batch * g->nm * g->nn, alone);
        return 0;
    }
    if (M <= THIN_ROWS && !g->conv) { /* bands of columns only, no packing: see GK(thin_block) */
        /* one band per thread: the wider a band, the longer the runs each row of X is read in */
        int64_t per = 4 * (nr / 2), bands = batch >= threads ? 1 : (threads + batch - 1) / batch;
        g->nb = round_up((N + bands - 1) / bands, per);
        g->nn = (N + g->nb - 1) / g->nb;
        /* memory-bound (each weight read once): worth a second thread from far fewer multiply-adds */
        opt_parallel(v.thin[g->act], g, batch * g->nn, macs < (1 << 17) ? 1 : 0);
        return 0;
    }
    int64_t cmax = L2_FLOATS / g->kc / nr * nr;
    if (cmax < nr) cmax = nr;
    g->nb = round_up(N > M ? (N + want - 1) / want : N, nr);
    if (g->nb > cmax) g->nb = cmax;
    g->nn = (N + g->nb - 1) / g->nb;
    g->mb = M;
    if (g->nn < want) {
        int64_t split = (want + g->nn - 1) / g->nn;
        g->mb = round_up((M + split - 1) / split, mr);
    }
    g->nm = (M + g->mb - 1) / g->mb;
    int cap = (int)alone;
    if (g->conv && g->nn == 1 && g->nm > 1 && !g->packed) {
        /* Row bands of one column band would each gather the same columns from the input again:
         * pack them once, shared, in a job of its own (a plain X packs with vector copies, cheaper
         * than a second job's wake-up).  Without the memory, each item packs its own as usual. */
        g->pstride = K * round_up(N, nr);
        g->packed = malloc((size_t)(batch * g->pstride) * sizeof(float));
        if (g->packed) opt_parallel(v.prepack, g, batch * ((K + g->kc - 1) / g->kc), cap);
    }
    opt_parallel(v.items[g->act], g, batch * g->nn * g->nm, cap);
    if (!g->given_packed) free(g->packed);
    g->packed = NULL;
    return g->failed ? OPT_ENOMEM : 0;
}

OPT_API int optcli_gemm_conv_f32(const float *w, const float *x, const float *bias, const float *res, float *y,
                                 int64_t batch, int64_t M, int64_t K, int64_t N, int act, float alpha, float beta) {
    if (batch < 0 || M < 0 || K < 1 || N < 0 || act < 0 || act >= ACT_COUNT) return OPT_EINVAL;
    if (batch == 0 || M == 0 || N == 0) return 0;
    gemm_t g = {.w = w, .x = x, .bias = bias, .res = res, .y = y, .xstride = K * N, .M = M, .K = K, .N = N,
                .act = act, .alpha = alpha, .beta = beta};
    return run(&g, batch);
}

/* A fully connected layer over any number of rows: y [rows, N] = act(x [rows, K] @ w [K, N] + bias [N]),
 * w as the model holds it.  The GEMM with x as its W and w as its X (no transposes: Y comes out
 * row-major), the bias a residual row added to every row of Y in the tiles' epilogue, where
 * numpy's product, its bias Add and the activation were three passes (a transformer's layers on
 * 16-512 tokens; fc_rows.c takes the few-row products of a decoder's Loop). */
OPT_API int optcli_fc_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t K,
                          int64_t N, int act, float alpha, float beta, const float *packed, int64_t nr) {
    if (rows < 0 || K < 1 || N < 0 || act < 0 || act >= ACT_COUNT) return OPT_EINVAL;
    if (rows == 0 || N == 0) return 0;
    gemm_t g = {.w = x, .x = w, .res = bias, .res_row = bias != NULL, .y = y, .xstride = K * N, .M = rows, .K = K,
                .N = N, .act = act, .alpha = alpha, .beta = beta, .packed = (float *)packed,
                .given_packed = packed != NULL, .given_nr = nr, .pstride = K * round_up(N, nr > 0 ? nr : 1)};
    return run(&g, 1);
}

/* w [K, N] into the panels the GEMM's tiles read (nr columns each, per K block: run()'s layout for
 * X packed once), for optcli_fc_f32's `packed`: a constant weight packed at load, where every call
 * packed it again, item by item (a transformer's [128, 512] weight: 64 K floats copied per call, and
 * row bands of one column band each copied theirs).  Returns the panel width nr (> 0) of the
 * variant in use; with packed NULL only that (the caller then makes K * round_up(N, nr) floats). */
OPT_API int64_t optcli_fc_pack_f32(const float *w, float *packed, int64_t K, int64_t N) {
    pthread_once(&g_variant_once, pick_variant);
    const variant_t v = *g_variant;
    if (K < 1 || N < 1) return OPT_EINVAL;
    if (!packed) return v.nr;
    gemm_t g = {.x = w, .xstride = K * N, .M = 1, .K = K, .N = N, .packed = packed,
                .pstride = K * round_up(N, v.nr), .kc = k_block(K, v.nr)};
    for (int64_t it = 0; it < (K + g.kc - 1) / g.kc; it++) v.prepack(&g, it);
    return v.nr;
}

/* W [M, K] into the panels of W.T that the transposed product reads (see GK(transposed)): panels
 * of nr columns of M (the GEMM's tile width now in use, returned), each [K, nr] row-major, the
 * last one [K, nr / 2] when M is an odd number of vectors; M * K floats in all.  Returns 0 (and
 * writes nothing) where M is not a multiple of the vector width: those products are not taken
 * transposed. */
OPT_API int optcli_gemm_pack_wt_f32(const float *w, float *wt, int64_t M, int64_t K) {
    pthread_once(&g_variant_once, pick_variant);
    const variant_t *v = g_variant;
    if (M < 1 || K < 1 || M % (v->nr / 2)) return 0;
    v->pack_wt(w, wt, M, K);
    return v->nr;
}

/* The product of optcli_gemm_conv_f32 with W also given as wt, its panels from
 * optcli_gemm_pack_wt_f32 (nr: the width that returned): products of 16 to TRANSPOSED_COLS
 * columns (1x1 convs on 7x7 and 14x14 planes) are taken as Y.T = X.T @ W.T, vectorised along M,
 * where 49 columns would fill 64-column tiles; other shapes, or panels packed for another tile
 * width, as optcli_gemm_conv_f32 does (w is read then). */
OPT_API int optcli_gemm_conv_t_f32(const float *w, const float *wt, int64_t nr, const float *x, const float *bias,
                                   const float *res, float *y, int64_t batch, int64_t M, int64_t K, int64_t N, int act,
                                   float alpha, float beta) {
    if (batch < 0 || M < 0 || K < 1 || N < 0 || act < 0 || act >= ACT_COUNT) return OPT_EINVAL;
    if (batch == 0 || M == 0 || N == 0) return 0;
    pthread_once(&g_variant_once, pick_variant);
    int take = wt && nr == g_variant->nr && M % (nr / 2) == 0 && N >= NARROW_COLS && N <= TRANSPOSED_COLS;
    gemm_t g = {.w = w, .x = x, .bias = bias, .res = res, .y = y, .xstride = K * N, .M = M, .K = K, .N = N,
                .act = act, .alpha = alpha, .beta = beta, .wt = take ? wt : NULL};
    return run(&g, batch);
}

/* One group of a grouped conv is a one-group conv of its channels, and NCHW lays the groups of
 * an image one after the other in x, in W, in the bias and in y: so the groups of all images are
 * simply more "images" of the one-group GEMM, each with its own rows of W (gemm_t.groups).  The
 * work items then spread over the groups too, which suits RegNet's many narrow groups. */
static int conv_gemm(const float *w, const float *xp, const float *bias, const float *res, float *y,
                     const int64_t *geom, int64_t groups, int act, float alpha, float beta) {
    int64_t batch = geom[0] * groups, M = geom[1];
    conv_t q = {.C = geom[2], .HP = geom[3], .WP = geom[4], .KH = geom[5], .KW = geom[6], .sh = geom[7],
                .sw = geom[8], .dh = geom[9], .dw = geom[10], .OH = geom[11], .OW = geom[12]};
    if (geom[0] < 0 || M < 0 || q.C < 1 || q.KH < 1 || q.KW < 1 || q.sh < 1 || q.sw < 1 || q.dh < 1 || q.dw < 1 ||
        q.OH < 0 || q.OW < 0 || act < 0 || act >= ACT_COUNT)
        return OPT_EINVAL;
    /* every tap of every output must lie in the padded input */
    if (q.OH && q.OW && ((q.OH - 1) * q.sh + (q.KH - 1) * q.dh >= q.HP || (q.OW - 1) * q.sw + (q.KW - 1) * q.dw >= q.WP))
        return OPT_EINVAL;
    if (batch == 0 || M == 0 || q.OH * q.OW == 0) return 0;
    gemm_t g = {.w = w, .x = xp, .bias = bias, .res = res, .y = y, .conv = &q, .xstride = q.C * q.HP * q.WP,
                .M = M, .K = q.C * q.KH * q.KW, .N = q.OH * q.OW, .groups = groups, .act = act, .alpha = alpha,
                .beta = beta};
    return run(&g, batch);
}

OPT_API int optcli_conv2d_gemm_f32(const float *w, const float *xp, const float *bias, const float *res, float *y,
                                   const int64_t *geom, int act, float alpha, float beta) {
    return conv_gemm(w, xp, bias, res, y, geom, 1, act, alpha, beta);
}

/* geom as for optcli_conv2d_gemm_f32, but per group: M and C are one group's output and input
 * channels (the input has groups * C channels, W groups * M rows). */
OPT_API int optcli_conv2d_gemm_grouped_f32(const float *w, const float *xp, const float *bias, float *y,
                                           const int64_t *geom, int64_t groups, int act, float alpha, float beta) {
    if (groups < 1) return OPT_EINVAL;
    return conv_gemm(w, xp, bias, NULL, y, geom, groups, act, alpha, beta);
}
