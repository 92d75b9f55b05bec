// Matrix products with a constant right operand, and per-channel affine maps, over packed
// (NC4HW4) tensors.  Indices count float4s; arithmetic is float; padding lanes of outputs are
// written as zero (masked after the epilogue).

INLINE FLOAT4 mac4(FLOAT4 acc, FLOAT4 v, FLOAT4 w0, FLOAT4 w1, FLOAT4 w2, FLOAT4 w3)
{
    return acc + w0 * v.x + w1 * v.y + w2 * v.z + w3 * v.w;
}

INLINE FLOAT4 mask_lanes(FLOAT4 v, int valid)
{
    if (valid < 4) v.w = 0.0f;
    if (valid < 3) v.z = 0.0f;
    if (valid < 2) v.y = 0.0f;
    return v;
}

// y[M, N] = a[M, K] @ w + bias, for a left operand of rank <= 2: packed as M rows of K4 slices,
// so the reduction runs along the channel slices and output columns are the float4 lanes.
// 4 rows x 4 columns per work item.  grid: (ceil(M / 4), N4).  w: [N4][K4][4 k lanes] float4s
// of 4 column lanes; bias: [N4 * 4].
KERNEL(gemm_rows, IN(a), IN(w), IN(bias), OUT(y), INT(M), INT(K4), INT(N), EPILOGUE)
{
    const int m0 = GID(0) * 4;
    const int n4 = GID(1);
    if (m0 >= M) return;
    const int N4 = (N + 3) / 4;
    const int r0 = m0 * K4;
    const int r1 = min(m0 + 1, M - 1) * K4, r2 = min(m0 + 2, M - 1) * K4, r3 = min(m0 + 3, M - 1) * K4;
    const FLOAT4 b = LOAD4(bias, n4);
    FLOAT4 a0 = b, a1 = b, a2 = b, a3 = b;
    int wi = n4 * K4 * 4;
    for (int k = 0; k < K4; ++k) {
        const FLOAT4 w0 = LOAD4(w, wi), w1 = LOAD4(w, wi + 1), w2 = LOAD4(w, wi + 2), w3 = LOAD4(w, wi + 3);
        a0 = mac4(a0, LOAD4(a, r0 + k), w0, w1, w2, w3);
        a1 = mac4(a1, LOAD4(a, r1 + k), w0, w1, w2, w3);
        a2 = mac4(a2, LOAD4(a, r2 + k), w0, w1, w2, w3);
        a3 = mac4(a3, LOAD4(a, r3 + k), w0, w1, w2, w3);
        wi += 4;
    }
    const int valid = N - n4 * 4;
    STORE4(mask_lanes(activate(a0), valid), y, m0 * N4 + n4);
    if (m0 + 1 < M) STORE4(mask_lanes(activate(a1), valid), y, (m0 + 1) * N4 + n4);
    if (m0 + 2 < M) STORE4(mask_lanes(activate(a2), valid), y, (m0 + 2) * N4 + n4);
    if (m0 + 3 < M) STORE4(mask_lanes(activate(a3), valid), y, (m0 + 3) * N4 + n4);
}

// y = x @ w + bias over the last axis of a rank-3/4 left operand, which the packed layout
// stores along W: each of the R = N * C4 * H rows holds K float4s whose lanes are 4 channels.
// A work item computes 4 output columns for the 4 channels of one row.
// grid: (ceil(NOUT / 4), R).  w: [K][N4 * 4] (plain, columns padded); bias: [N4 * 4].
KERNEL(gemm_lanes, IN(x), IN(w), IN(bias), OUT(y), INT(K), INT(NOUT), INT(C), INT(H), INT(R), EPILOGUE)
{
    const int j0 = GID(0) * 4;
    const int r = GID(1);
    if (j0 >= NOUT || r >= R) return;
    const int N4 = (NOUT + 3) / 4;
    const int C4 = (C + 3) / 4;
    const FLOAT4 bv = LOAD4(bias, j0 / 4);
    FLOAT4 a0 = F4S(bv.x), a1 = F4S(bv.y), a2 = F4S(bv.z), a3 = F4S(bv.w);
    int xi = r * K;
    int wi = j0 / 4;
    for (int k = 0; k < K; ++k) {
        const FLOAT4 v = LOAD4(x, xi + k);
        const FLOAT4 wv = LOAD4(w, wi);
        a0 += v * wv.x;
        a1 += v * wv.y;
        a2 += v * wv.z;
        a3 += v * wv.w;
        wi += N4;
    }
    const int valid = C - ((r / H) % C4) * 4;
    const int yo = r * NOUT + j0;
    STORE4(mask_lanes(activate(a0), valid), y, yo);
    if (j0 + 1 < NOUT) STORE4(mask_lanes(activate(a1), valid), y, yo + 1);
    if (j0 + 2 < NOUT) STORE4(mask_lanes(activate(a2), valid), y, yo + 2);
    if (j0 + 3 < NOUT) STORE4(mask_lanes(activate(a3), valid), y, yo + 3);
}

// y = x * scale[c] + shift[c] per channel, then the epilogue (BatchNormalization folded on the
// host, ChannelAffine).  One float4 per work item.  grid: (count).  scale, shift: [C4 * 4].
KERNEL(channel_affine, IN(x), IN(scale), IN(shift), OUT(y), INT(count), INT(HW), INT(C), EPILOGUE)
{
    const int i = GID(0);
    if (i >= count) return;
    const int s = (i / HW) % ((C + 3) / 4);
    const FLOAT4 v = FMA(LOAD4(x, i), LOAD4(scale, s), LOAD4(shift, s));
    STORE4(mask_lanes(activate(v), C - s * 4), y, i);
}
