// MatMul of two run-time operands (attention's Q.K^T and P.V) over packed (NC4HW4) tensors,
// rank 2-4 with numpy broadcasting of the leading (batch) axes.  Arithmetic is float; each work
// item writes one float4 of the output, and its lanes past the channel count as zero.
//
// Where a logical [.., R, C] matrix sits in the packed layout (layout.dims4):
//   rank 4 [D0, D1, R, C]: N=D0, C=D1 (in the lanes), H=R, W=C
//   rank 3 [D1, R, C]:     N=D1, C=R (in the lanes), H=1, W=C
//   rank 2 [R, C]:         N=R, C=C (in the lanes), H=W=1
// so the contraction axis (the last) of the left operand lies along W (rank 3/4) or across the
// channel slices (rank 2), and the lanes of the output hold heads, rows or columns by rank.

// Element offset of logical element (i0, i1, r, c) of a packed tensor of rank `rank` whose
// shape aligned to rank 4 is (., d1, R, C); axes a lower rank lacks are ignored.
INLINE int packed_offset(int rank, int d1, int R, int C, int i0, int i1, int r, int c)
{
    if (rank == 4) return (((i0 * ((d1 + 3) / 4) + i1 / 4) * R + r) * C + c) * 4 + (i1 & 3);
    if (rank == 3) return ((i1 * ((R + 3) / 4) + r / 4) * C + c) * 4 + (r & 3);
    return r * ((C + 3) / 4) * 4 + c;
}

// Rank 4 by rank 4 with the same axis 1 (attention heads: [B, H, M, K] x [B, H, K, N]): the
// heads are the lanes of all three tensors, so the product is lane-wise on float4s.  Axis 0 of
// an operand may be 1 (broadcast): its batch stride in float4s (sa, sb) is then 0.  The padding
// lanes (heads past H) of both operands are zero, so are their products.
// grid: (count = D0 * H4 * M * N).
KERNEL(matmul_heads, IN(a), IN(b), OUT(y), INT(count), INT(H), INT(M), INT(N), INT(K), INT(sa), INT(sb))
{
    const int g = GID(0);
    if (g >= count) return;
    const int col = g % N;
    int t = g / N;
    const int m = t % M;
    t /= M;
    const int s = t % ((H + 3) / 4);
    const int b0 = t / ((H + 3) / 4);
    const int ai = b0 * sa + (s * M + m) * K;
    int bi = b0 * sb + s * K * N + col;
    FLOAT4 acc = F4S(0.0f);
    for (int k = 0; k < K; ++k) {
        acc += LOAD4(a, ai + k) * LOAD4(b, bi);
        bi += N;
    }
    STORE4(acc, y, g);
}

// Any ranks 2-4 with batch broadcasting: A [.., M, K] of rank ra and aligned batch dims
// (a0, a1), B [.., K, N] of rank rb and (b0, b1); the output has rank max(ra, rb) and aligned
// shape (., D1, M, N).  A size-1 batch axis of an operand repeats.  Each lane is a dot product
// of scalars read through packed_offset: along k, A's offset steps by 1 (rank 2) or 4, and B's
// by (k / 4) * pb + (k % 4) * qb (its rows are channels at rank 3, plain rows otherwise).
// grid: (count = packed float4s of the output).
KERNEL(matmul_any, IN(a), IN(b), OUT(y), INT(count), INT(ra), INT(a0), INT(a1), INT(rb), INT(b0), INT(b1),
       INT(D1), INT(M), INT(N), INT(K))
{
    const int g = GID(0);
    if (g >= count) return;
    const int ry = max(ra, rb);
    // the output's packed dims (C, H, W) and the logical axis its channels hold
    const int yc = ry == 4 ? D1 : ry == 3 ? M : N;
    const int yh = ry == 4 ? M : 1;
    const int yw = ry == 2 ? 1 : N;
    const int w = g % yw;
    int t = g / yw;
    const int h = t % yh;
    t /= yh;
    const int s = t % ((yc + 3) / 4);
    const int n = t / ((yc + 3) / 4);
    const int sa = ra == 2 ? 1 : 4;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < 4; ++j) {
        const int c = s * 4 + j;
        if (c >= yc) break;
        const int i0 = ry == 4 ? n : 0;
        const int i1 = ry == 4 ? c : ry == 3 ? n : 0;
        const int m = ry == 4 ? h : ry == 3 ? c : n;
        const int col = ry == 2 ? c : w;
        const int ia0 = a0 == 1 ? 0 : i0, ia1 = a1 == 1 ? 0 : i1;
        const int ib0 = b0 == 1 ? 0 : i0, ib1 = b1 == 1 ? 0 : i1;
        const int oa = packed_offset(ra, a1, M, K, ia0, ia1, m, 0);
        const int ob = packed_offset(rb, b1, K, N, ib0, ib1, 0, col);
        const int qb = packed_offset(rb, b1, K, N, ib0, ib1, 1, col) - ob;
        const int pb = packed_offset(rb, b1, K, N, ib0, ib1, 4, col) - ob;
        float sum = 0.0f;
        for (int k = 0; k < K; ++k)
            sum += LOAD1(a, oa + k * sa) * LOAD1(b, ob + (k >> 2) * pb + (k & 3) * qb);
        acc[j] = sum;
    }
    STORE4(F4(acc[0], acc[1], acc[2], acc[3]), y, g);
}
