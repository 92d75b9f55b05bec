/* Integer dense layers (optcli.QMatMul, optcli/ops/qmatmul.py): y [R, M] = requant(x [R, K] (u8 / s8) times
 * w [K, M] (s8) plus an int32 bias), x and y row-major as the plan holds them.
 *
 * Why not the 1x1 conv GEMM (qpointwise.c): its vectors run along the pixels, so a MatMul has to be turned
 * into one (x transposed to [K, R], the result back from [M, R]).  Those two byte transposes cost more than
 * the products at R = 128, K = 256, M = 512 (26-38 us of 64 us, numpy's strided copies), and a classifier
 * head (R = 1) filled one of a tile's 16 columns.  Here the vectors run along the output columns M: the
 * weights are packed once (the wrapper, optcli/native/qgemm.py: pack_columns) into tiles of 16 columns,
 * [tile][K / 4][16 columns][4 k] bytes, and each row's 4 bytes of x at a time are broadcast against them,
 * so any R uses whole vectors and x and y are read and written in place.
 *
 * Exact on every path, as qpointwise.c: vpdpbusd (AVX-512 VNNI, AVX-VNNI) and sdot (aarch64) add four
 * products to an int32 lane exactly; on AVX2 without VNNI vpmaddubsw sums two u8 x s8 products in a
 * saturating int16, so the wrapper splits the weights (split = 1) into a main part whose pairs cannot clip
 * and a sparse residual (per tile, (quad, 64 bytes) entries) added after the main loop, every path adding
 * the residual.  x is read as u8 on x86 (s8 inputs flipped by an xor with 0x80) and as s8 by sdot (u8 inputs
 * flipped); the flip's offset and x's zero point are taken out per column with the weights' column sums:
 * bias' = bias - (x_zp + offset) * sum_k w[k, m], modulo 2^32 as every sum here.  The epilogue is
 * opt_requant_row's (float(acc + bias') * multiplier, clamped, rounded half to even, plus the zero point)
 * with per-column bias and multiplier vectors.
 */
#include <stdlib.h>
#include <string.h>

#include "optcli_native.h"
#include "qconv_kernel.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#define QM_NT 16 /* columns per packed tile */
#define QM_ENTRY 17 /* a residual entry in int32: its quad, then 64 weight bytes */
#define QM_MAX_K 65536

typedef struct {
    const uint8_t *x;
    uint8_t *y;
    const int8_t *w;      /* [tiles][Q][16][4] */
    const int32_t *rptr;  /* [tiles + 1]: tile t's residual entries are [rptr[t], rptr[t + 1]) */
    const int32_t *rent;  /* [entries][QM_ENTRY] */
    int32_t *bias;        /* bias' per column, [tiles * 16] (0 past M) */
    float *mult;          /* [tiles * 16] (1 past M) */
    int64_t R, K, M, Q, Qf, tiles, rb, cg, rblocks;
    uint32_t flip;        /* xor of each x byte: 0x80 where the path reads x with the other sign */
    float lo, hi;         /* the clamp, less the zero point */
    int32_t yzp;
} qm_t;

static inline int64_t qm_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Quad q of a row of x (its bytes 4q .. 4q + 3, zeros past K), flipped: the lowest byte first. */
static inline uint32_t qm_xquad(const qm_t *p, const uint8_t *row, int64_t q) {
    uint32_t v = 0;
    const int64_t k = 4 * q;
    memcpy(&v, row + k, (size_t)qm_min(4, p->K - k));
    return v ^ p->flip;
}

/* 4 bytes of x as they lie (the main loop's quads, below Qf: all within K). */
static inline uint32_t qm_load4(const uint8_t *s) {
    uint32_t v;
    memcpy(&v, s, 4);
    return v;
}

static inline uint8_t qm_requant(const qm_t *p, uint32_t acc, int64_t m) {
    float v = (float)(int32_t)(acc + (uint32_t)p->bias[m]) * p->mult[m];
    v = v < p->lo ? p->lo : (v > p->hi ? p->hi : v);
    return (uint8_t)((int32_t)rintf(v) + p->yzp);
}

/* The plain C block: rows [r0, r0 + rows) by tiles [t0, t0 + nt), x read as u8 (the x86 paths' flip). */
static void qm_block_plain(const qm_t *p, int64_t r0, int64_t rows, int64_t t0, int64_t nt) {
    for (int64_t r = r0; r < r0 + rows; r++) {
        const uint8_t *row = p->x + r * p->K;
        for (int64_t t = t0; t < t0 + nt; t++) {
            uint32_t acc[QM_NT] = {0};
            const int8_t *w = p->w + t * p->Q * 64;
            for (int64_t q = 0; q < p->Q; q++, w += 64) {
                const uint32_t xq = qm_xquad(p, row, q);
                for (int j = 0; j < QM_NT; j++)
                    for (int i = 0; i < 4; i++) acc[j] += (uint32_t)((int32_t)((xq >> (8 * i)) & 0xff) * w[4 * j + i]);
            }
            for (int64_t e = p->rptr[t]; e < p->rptr[t + 1]; e++) {
                const int32_t *ent = p->rent + e * QM_ENTRY;
                const int8_t *rw = (const int8_t *)(ent + 1);
                const uint32_t xq = qm_xquad(p, row, ent[0]);
                for (int j = 0; j < QM_NT; j++)
                    for (int i = 0; i < 4; i++) acc[j] += (uint32_t)((int32_t)((xq >> (8 * i)) & 0xff) * rw[4 * j + i]);
            }
            const int64_t m0 = t * QM_NT, n = qm_min(QM_NT, p->M - m0);
            for (int64_t j = 0; j < n; j++) p->y[r * p->M + m0 + j] = qm_requant(p, acc[j], m0 + j);
        }
    }
}

#ifdef QG_X86
/* ---- AVX-512 VNNI: RB rows x CB tiles of 16 int32 lanes, vpdpbusd on whole weights ----
 * The accumulators are named variables a<row><tile> (an array of them, even indexed by constants, left GCC
 * copying every one between registers each quad and spilling one); the rows and tiles past RB and CB are
 * dead code. */
#define V512_ROWS(X) X(0) X(1) X(2) X(3)
#define V512_FOR_TILE(r, c) if (RB > r && CB > c) a##r##c = _mm512_dpbusd_epi32(a##r##c, x##r, w##c);
#define V512_QUAD(XQ)                                                                                            \
    do {                                                                                                       \
        __m512i x0 = _mm512_setzero_si512(), x1 = x0, x2 = x0, x3 = x0, w0 = x0, w1 = x0, w2 = x0, w3 = x0;      \
        if (RB > 0) { const int r = 0; x0 = _mm512_set1_epi32((int)(XQ)); }                                   \
        if (RB > 1) { const int r = 1; x1 = _mm512_set1_epi32((int)(XQ)); }                                   \
        if (RB > 2) { const int r = 2; x2 = _mm512_set1_epi32((int)(XQ)); }                                   \
        if (RB > 3) { const int r = 3; x3 = _mm512_set1_epi32((int)(XQ)); }                                   \
        if (CB > 0) w0 = _mm512_loadu_si512((const void *)(wt + q * 64));                                     \
        if (CB > 1) w1 = _mm512_loadu_si512((const void *)(wt + (Q + q) * 64));                               \
        if (CB > 2) w2 = _mm512_loadu_si512((const void *)(wt + (2 * Q + q) * 64));                           \
        if (CB > 3) w3 = _mm512_loadu_si512((const void *)(wt + (3 * Q + q) * 64));                           \
        V512_FOR_TILE(0, 0) V512_FOR_TILE(1, 0) V512_FOR_TILE(2, 0) V512_FOR_TILE(3, 0)                        \
        V512_FOR_TILE(0, 1) V512_FOR_TILE(1, 1) V512_FOR_TILE(2, 1) V512_FOR_TILE(3, 1)                        \
        V512_FOR_TILE(0, 2) V512_FOR_TILE(1, 2) V512_FOR_TILE(2, 2) V512_FOR_TILE(3, 2)                        \
        V512_FOR_TILE(0, 3) V512_FOR_TILE(1, 3) V512_FOR_TILE(2, 3) V512_FOR_TILE(3, 3)                        \
    } while (0)

/* Row r's 16 accumulators of tile t: the last, partial quad's products and the residual entries' added (apart
 * from the main loop: inside it, the extra quad left GCC copying every accumulator each quad), requantized and
 * stored. */
__attribute__((target(VNNI512_TARGET), always_inline)) static inline void v512_finish(const qm_t *p, __m512i acc,
                                                                                    const uint8_t *xrow,
                                                                                    int64_t row, int64_t t) {
    if (p->Qf < p->Q)
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32((int)qm_xquad(p, xrow, p->Qf)),
                                  _mm512_loadu_si512((const void *)(p->w + (t * p->Q + p->Qf) * 64)));
    for (int64_t e = p->rptr[t]; e < p->rptr[t + 1]; e++) {
        const int32_t *ent = p->rent + e * QM_ENTRY;
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32((int)qm_xquad(p, xrow, ent[0])),
                                  _mm512_loadu_si512((const void *)(ent + 1)));
    }
    const int64_t m0 = t * QM_NT, n = qm_min(QM_NT, p->M - m0);
    const __m512 f = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_add_epi32(acc, _mm512_loadu_si512((const void *)(p->bias + m0)))),
        _mm512_loadu_ps(p->mult + m0));
    const __m512i v = _mm512_add_epi32(
        _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(f, _mm512_set1_ps(p->hi)), _mm512_set1_ps(p->lo))),
        _mm512_set1_epi32(p->yzp));
    _mm512_mask_cvtepi32_storeu_epi8(p->y + row * p->M + m0, (__mmask16)(n >= QM_NT ? 0xFFFF : (1u << n) - 1u), v);
}

__attribute__((target(VNNI512_TARGET), always_inline)) static inline void v512_body(const qm_t *p, int64_t r0,
                                                                                  const int RB, int64_t t0,
                                                                                  const int CB) {
    const int64_t Q = p->Q;
    const uint8_t *xr[4];
    for (int r = 0; r < 4; r++) xr[r] = p->x + (r0 + (r < RB ? r : 0)) * p->K;
    const int8_t *wt = p->w + t0 * Q * 64;
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
            a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    for (int64_t q = 0; q < p->Qf; q++) V512_QUAD(qm_load4(xr[r] + 4 * q) ^ p->flip);
#define V512_FINISH(r, c) if (RB > r && CB > c) v512_finish(p, a##r##c, xr[r], r0 + r, t0 + c);
    V512_FINISH(0, 0) V512_FINISH(1, 0) V512_FINISH(2, 0) V512_FINISH(3, 0)
    V512_FINISH(0, 1) V512_FINISH(1, 1) V512_FINISH(2, 1) V512_FINISH(3, 1)
    V512_FINISH(0, 2) V512_FINISH(1, 2) V512_FINISH(2, 2) V512_FINISH(3, 2)
    V512_FINISH(0, 3) V512_FINISH(1, 3) V512_FINISH(2, 3) V512_FINISH(3, 3)
#undef V512_FINISH
}
#undef V512_QUAD
#undef V512_FOR_TILE
#undef V512_ROWS

/* ---- AVX2 (vpmaddubsw on split weights) and AVX-VNNI (vpdpbusd on 8 lanes): a tile is two ymm ---- */
#define QM_YMM_QUAD(STEP, XQ)                                                                                   \
    do {                                                                                                       \
        __m256i xb[4];                                                                                         \
        for (int r = 0; r < RB; r++) xb[r] = _mm256_set1_epi32((int)(XQ));                                    \
        for (int c = 0; c < 2 * CB; c++) {                                                                     \
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(wt + ((c / 2) * Q + q) * 64 + (c % 2) * 32)); \
            for (int r = 0; r < RB; r++) acc[r][c] = STEP(acc[r][c], xb[r], wv);                               \
        }                                                                                                      \
    } while (0)
#define QM_AVX2_BODY(NAME, TARGET, STEP)                                                                        \
    __attribute__((target(TARGET), always_inline)) static inline void NAME(const qm_t *p, int64_t r0, const int RB, \
                                                                          int64_t t0, const int CB) {          \
        const int64_t Q = p->Q;                                                                                \
        const uint8_t *xr[4];                                                                                  \
        for (int r = 0; r < RB; r++) xr[r] = p->x + (r0 + r) * p->K;                                           \
        const int8_t *wt = p->w + t0 * Q * 64;                                                                 \
        const __m256i ones = _mm256_set1_epi16(1);                                                             \
        (void)ones;                                                                                            \
        __m256i acc[4][8];                                                                                     \
        for (int r = 0; r < RB; r++)                                                                           \
            for (int c = 0; c < 2 * CB; c++) acc[r][c] = _mm256_setzero_si256();                               \
        for (int64_t q = 0; q < p->Qf; q++) QM_YMM_QUAD(STEP, qm_load4(xr[r] + 4 * q) ^ p->flip);              \
        for (int c = 0; c < CB && p->Qf < Q; c++) { /* the last, partial quad (see v512_finish) */             \
            const int8_t *wl = wt + (c * Q + p->Qf) * 64;                                                      \
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)wl);                                        \
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wl + 32));                                 \
            for (int r = 0; r < RB; r++) {                                                                     \
                const __m256i xb = _mm256_set1_epi32((int)qm_xquad(p, xr[r], p->Qf));                          \
                acc[r][2 * c] = STEP(acc[r][2 * c], xb, w0);                                                   \
                acc[r][2 * c + 1] = STEP(acc[r][2 * c + 1], xb, w1);                                           \
            }                                                                                                  \
        }                                                                                                      \
        for (int c = 0; c < CB; c++)                                                                           \
            for (int64_t e = p->rptr[t0 + c]; e < p->rptr[t0 + c + 1]; e++) {                                  \
                const int32_t *ent = p->rent + e * QM_ENTRY;                                                   \
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(ent + 1));                             \
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(ent + 9));                             \
                for (int r = 0; r < RB; r++) {                                                                 \
                    const __m256i xb = _mm256_set1_epi32((int)qm_xquad(p, xr[r], ent[0]));                     \
                    acc[r][2 * c] = STEP(acc[r][2 * c], xb, w0);                                               \
                    acc[r][2 * c + 1] = STEP(acc[r][2 * c + 1], xb, w1);                                       \
                }                                                                                              \
            }                                                                                                  \
        for (int c = 0; c < 2 * CB; c++) {                                                                     \
            const int64_t m0 = (t0 + c / 2) * QM_NT + (c % 2) * 8, n = qm_min(8, p->M - m0);                   \
            if (n <= 0) continue;                                                                              \
            for (int r = 0; r < RB; r++) qm_store8(p, acc[r][c], m0, n, p->y + (r0 + r) * p->M + m0);          \
        }                                                                                                      \
    }

/* 8 accumulators of columns [m0, m0 + 8) requantized, n <= 8 of them stored at d: the byte of each lane picked
 * by a shuffle (the values lie within the output's dtype after the clamp). */
__attribute__((target("avx2"), always_inline)) static inline void qm_store8(const qm_t *p, __m256i acc, int64_t m0,
                                                                          int64_t n, uint8_t *d) {
    const __m256 f = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p->bias + m0)))),
        _mm256_loadu_ps(p->mult + m0));
    const __m256 c = _mm256_max_ps(_mm256_min_ps(f, _mm256_set1_ps(p->hi)), _mm256_set1_ps(p->lo));
    const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(c), _mm256_set1_epi32(p->yzp));
    const __m256i bytes = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                  -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                  -1, -1, -1, -1));
    const __m128i lo4 = _mm256_castsi256_si128(bytes), hi4 = _mm256_extracti128_si256(bytes, 1);
    const uint64_t out = (uint64_t)(uint32_t)_mm_cvtsi128_si32(lo4) | (uint64_t)(uint32_t)_mm_cvtsi128_si32(hi4) << 32;
    memcpy(d, &out, (size_t)n); /* (the lowest byte first: column m0 first) */
}

#define QM_MADDUBS(acc, xb, w) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((xb), (w)), ones))
#define QM_DPBUSD256(acc, xb, w) _mm256_dpbusd_avx_epi32((acc), (xb), (w))
QM_AVX2_BODY(avx2_body, "avx2", QM_MADDUBS)
QM_AVX2_BODY(v256_body, VNNI256_TARGET, QM_DPBUSD256)
#endif

#if defined(__aarch64__)
/* ---- aarch64 with the dot product: sdot, x read as s8; a tile is four int32x4 of 4 columns ---- */
__attribute__((target("arch=armv8.2-a+dotprod"), always_inline)) static inline void sdot_body(const qm_t *p,
                                                                                            int64_t r0, const int RB,
                                                                                            int64_t t0,
                                                                                            const int CB) {
    const int64_t Q = p->Q;
    const uint8_t *xr[4];
    for (int r = 0; r < RB; r++) xr[r] = p->x + (r0 + r) * p->K;
    const int8_t *wt = p->w + t0 * Q * 64;
    int32x4_t acc[4][16];
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < 4 * CB; c++) acc[r][c] = vdupq_n_s32(0);
#define SDOT_QUAD(XQ)                                                                                            \
    do {                                                                                                       \
        int8x16_t xb[4];                                                                                       \
        for (int r = 0; r < RB; r++) xb[r] = vreinterpretq_s8_u32(vdupq_n_u32(XQ));                            \
        for (int c = 0; c < 4 * CB; c++) {                                                                     \
            const int8x16_t wv = vld1q_s8(wt + ((c / 4) * Q + q) * 64 + (c % 4) * 16);                         \
            for (int r = 0; r < RB; r++) acc[r][c] = vdotq_s32(acc[r][c], xb[r], wv);                          \
        }                                                                                                      \
    } while (0)
    for (int64_t q = 0; q < p->Qf; q++) SDOT_QUAD(qm_load4(xr[r] + 4 * q) ^ p->flip);
#undef SDOT_QUAD
    for (int c = 0; c < CB && p->Qf < Q; c++) /* the last, partial quad (see v512_finish) */
        for (int r = 0; r < RB; r++) {
            const int8x16_t xb = vreinterpretq_s8_u32(vdupq_n_u32(qm_xquad(p, xr[r], p->Qf)));
            for (int v = 0; v < 4; v++)
                acc[r][4 * c + v] = vdotq_s32(acc[r][4 * c + v], xb, vld1q_s8(wt + (c * Q + p->Qf) * 64 + 16 * v));
        }
    for (int c = 0; c < CB; c++)
        for (int64_t e = p->rptr[t0 + c]; e < p->rptr[t0 + c + 1]; e++) {
            const int32_t *ent = p->rent + e * QM_ENTRY;
            const int8_t *rw = (const int8_t *)(ent + 1);
            for (int r = 0; r < RB; r++) {
                const int8x16_t xb = vreinterpretq_s8_u32(vdupq_n_u32(qm_xquad(p, xr[r], ent[0])));
                for (int v = 0; v < 4; v++) acc[r][4 * c + v] = vdotq_s32(acc[r][4 * c + v], xb, vld1q_s8(rw + 16 * v));
            }
        }
    for (int c = 0; c < CB; c++) {
        const int64_t m0 = (t0 + c) * QM_NT, n = qm_min(QM_NT, p->M - m0);
        for (int r = 0; r < RB; r++) {
            int32_t sums[QM_NT];
            for (int v = 0; v < 4; v++) vst1q_s32(sums + 4 * v, acc[r][4 * c + v]);
            uint8_t *d = p->y + (r0 + r) * p->M + m0;
            for (int64_t j = 0; j < n; j++) d[j] = qm_requant(p, (uint32_t)sums[j], m0 + j);
        }
    }
}
#endif

/* One function per (rows, tiles) block a path runs, the bodies inlined with constant bounds so their
 * accumulators live in registers. */
#define QM_BLOCK(BODY, TARGET, RB, CB)                                                                          \
    __attribute__((target(TARGET), noinline)) static void BODY##_##RB##x##CB(const qm_t *p, int64_t r0,        \
                                                                             int64_t t0) {                     \
        BODY(p, r0, RB, t0, CB);                                                                               \
    }
#define QM_BLOCKS(BODY, TARGET)                                                                                 \
    QM_BLOCK(BODY, TARGET, 1, 1)                                                                               \
    QM_BLOCK(BODY, TARGET, 2, 1)                                                                               \
    QM_BLOCK(BODY, TARGET, 3, 1)                                                                               \
    QM_BLOCK(BODY, TARGET, 4, 1)                                                                               \
    QM_BLOCK(BODY, TARGET, 1, 4)                                                                               \
    QM_BLOCK(BODY, TARGET, 2, 2)
typedef void (*qm_block_fn)(const qm_t *p, int64_t r0, int64_t t0);
typedef struct {
    qm_block_fn by_rows[4]; /* rows 1..4 by one tile */
    qm_block_fn one_row4;   /* one row by 4 tiles (a classifier head: four independent sums per row) */
    qm_block_fn two_rows2;  /* two rows by 2 tiles */
    qm_block_fn full;       /* 4 rows by 4 tiles (NULL where the registers do not hold it) */
} qm_blocks_t;

#ifdef QG_X86
QM_BLOCKS(v512_body, VNNI512_TARGET)
QM_BLOCK(v512_body, VNNI512_TARGET, 4, 4)
QM_BLOCKS(avx2_body, "avx2")
QM_BLOCKS(v256_body, VNNI256_TARGET)
static const qm_blocks_t QM_V512 = {{v512_body_1x1, v512_body_2x1, v512_body_3x1, v512_body_4x1}, v512_body_1x4,
                                    v512_body_2x2, v512_body_4x4};
/* (4 x 4 tiles would need 32 ymm accumulators: the AVX2 paths stop at 8) */
static const qm_blocks_t QM_AVX2 = {{avx2_body_1x1, avx2_body_2x1, avx2_body_3x1, avx2_body_4x1}, avx2_body_1x4,
                                    avx2_body_2x2, NULL};
static const qm_blocks_t QM_V256 = {{v256_body_1x1, v256_body_2x1, v256_body_3x1, v256_body_4x1}, v256_body_1x4,
                                    v256_body_2x2, NULL};
#endif
#if defined(__aarch64__)
QM_BLOCKS(sdot_body, "arch=armv8.2-a+dotprod")
static const qm_blocks_t QM_SDOT = {{sdot_body_1x1, sdot_body_2x1, sdot_body_3x1, sdot_body_4x1}, sdot_body_1x4,
                                    sdot_body_2x2, NULL};
#endif

typedef struct {
    qm_t p;
    const qm_blocks_t *blocks; /* NULL: the plain C block */
} qm_call_t;

/* Rows [r0, r0 + rows) by tiles [t0, t0 + nt) in the path's blocks: 4 x 4 where it has them, else 2 x 2 pairs
 * or one row by 4 tiles, then rows by one tile. */
static void qm_block(const qm_call_t *c, int64_t r0, int64_t rows, int64_t t0, int64_t nt) {
    const qm_t *p = &c->p;
    const qm_blocks_t *b = c->blocks;
    if (!b) {
        qm_block_plain(p, r0, rows, t0, nt);
        return;
    }
    int64_t t = t0;
    if (rows == 1)
        for (; t + 4 <= t0 + nt; t += 4) b->one_row4(p, r0, t);
    else if (rows == 4 && b->full)
        for (; t + 4 <= t0 + nt; t += 4) b->full(p, r0, t);
    else if (rows == 2)
        for (; t + 2 <= t0 + nt; t += 2) b->two_rows2(p, r0, t);
    for (; t < t0 + nt; t++) b->by_rows[rows - 1](p, r0, t);
}

/* Work item i: a band of rows (up to p.rb, in blocks of 4) by a group of tiles (up to p.cg); the items of one
 * group of tiles run one after another, so its weights stay in cache from band to band. */
static void qm_item(void *ctx, int64_t i) {
    const qm_call_t *c = ctx;
    const qm_t *p = &c->p;
    const int64_t g = i / p->rblocks, band = i % p->rblocks;
    const int64_t t0 = g * p->cg, nt = qm_min(p->cg, p->tiles - t0);
    const int64_t r_end = qm_min(p->R, (band + 1) * p->rb);
    for (int64_t r = band * p->rb; r < r_end; r += 4) qm_block(c, r, qm_min(4, r_end - r), t0, nt);
}

/* Which dot-product path runs: the VNNI ones on any weights, vpmaddubsw only on split ones, sdot, or plain C. */
static const qm_blocks_t *qm_path(int split, uint32_t *offset_flip, int xs) {
    *offset_flip = xs ? 0x80808080u : 0; /* x86 and plain C read x as u8 */
#ifdef QG_X86
    if (opt_qconv_vnni512 == 1) return &QM_V512;
    if (opt_qconv_vnni256 == 1) return &QM_V256;
    if (opt_qconv_avx2 == 1 && split) return &QM_AVX2;
#endif
#if defined(__aarch64__)
    if (opt_qconv_sdot == 1) {
        *offset_flip = xs ? 0 : 0x80808080u; /* sdot reads x as s8 */
        return &QM_SDOT;
    }
#endif
    (void)split;
    return NULL;
}

OPT_API int optcli_qmatmul_rows(const void *x, const int8_t *w, const int32_t *aux, const float *mult, void *y,
                                const int64_t *dims, const int32_t *qp) {
    if (!x || !w || !aux || !mult || !y || !dims || !qp) return OPT_EINVAL;
    const int64_t R = dims[0], K = dims[1], M = dims[2], split = dims[3];
    const int32_t xzp = qp[0], yzp = qp[1], qmin = qp[2], qmax = qp[3], xs = qp[4], ys = qp[5];
    if (R < 0 || K < 1 || K > QM_MAX_K || M < 1 || M > INT32_MAX / 4 || R > INT64_MAX / (K > M ? K : M) ||
        (split != 0 && split != 1) || (xs != 0 && xs != 1) || (ys != 0 && ys != 1))
        return OPT_EINVAL;
    const int32_t xlo = xs ? -128 : 0, ylo = ys ? -128 : 0;
    if (xzp < xlo || xzp > xlo + 255 || yzp < ylo || yzp > ylo + 255 || qmin < ylo || qmax > ylo + 255 || qmin > qmax)
        return OPT_EINVAL;
    qm_call_t c = {.p = {.x = x, .y = y, .w = w, .R = R, .K = K, .M = M, .yzp = yzp}};
    qm_t *p = &c.p;
    p->Q = (K + 3) / 4;
    p->Qf = K / 4;
    p->tiles = (M + QM_NT - 1) / QM_NT;
    const int32_t *wsum = aux, *bias = aux + M, *res = aux + 2 * M;
    p->rptr = res;
    p->rent = res + p->tiles + 1;
    if (res[0] != 0) return OPT_EINVAL;
    for (int64_t t = 0; t < p->tiles; t++)
        if (res[t + 1] < res[t]) return OPT_EINVAL;
    for (int64_t e = 0; e < res[p->tiles]; e++)
        if (p->rent[e * QM_ENTRY] < 0 || p->rent[e * QM_ENTRY] >= p->Q) return OPT_EINVAL;
    if (R == 0) return 0;
    c.blocks = qm_path((int)split, &p->flip, xs);
    /* x_read = x + offset: +128 for s8 read as u8, -128 for u8 read as s8 */
    const int32_t offset = !p->flip ? 0 : xs ? 128 : -128;
    p->lo = (float)(qmin - yzp);
    p->hi = (float)(qmax - yzp);
    const int64_t cols = p->tiles * QM_NT;
    p->bias = malloc((size_t)cols * sizeof(int32_t));
    p->mult = malloc((size_t)cols * sizeof(float));
    if (!p->bias || !p->mult) {
        free(p->bias), free(p->mult);
        return OPT_ENOMEM;
    }
    for (int64_t m = 0; m < cols; m++) {
        const uint32_t b = m < M ? (uint32_t)bias[m] : 0u;
        p->bias[m] = m < M ? (int32_t)(b - (uint32_t)(xzp + offset) * (uint32_t)wsum[m]) : 0;
        p->mult[m] = m < M ? mult[m] : 1.0f;
    }
    /* bands of 16 rows by groups of 4 tiles (64 columns); fewer rows: one band, narrower groups for the threads */
    p->rb = R > 16 ? 16 : R;
    p->rblocks = (R + p->rb - 1) / p->rb;
    const int threads = optcli_get_num_threads();
    p->cg = 4;
    while (p->cg > 1 && p->rblocks * ((p->tiles + p->cg - 1) / p->cg) < 4 * (int64_t)threads) p->cg /= 2;
    const int64_t groups = (p->tiles + p->cg - 1) / p->cg;
    const double macs = (double)R * (double)K * (double)M; /* (R * K * M may pass int64 in a crafted call) */
    opt_parallel(qm_item, &c, groups * p->rblocks, macs < (double)(1 << 17) ? 1 : 0);
    free(p->bias), free(p->mult);
    return 0;
}
