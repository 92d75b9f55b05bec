// Winograd F(2x2, 3x3) convolution over packed (NC4HW4) tensors (see conv.cl for the
// conventions: indices count float4s, 4x4 weight blocks of 4 consecutive float4s, output
// padding lanes written as zero).  Separate from conv.cl so that a program holding it is built
// only for models that select it.

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

// The epilogue (a macro: `activate` reads the kernel's EPILOGUE argument), then the lane mask.
#define finish(acc, o4, M) mask_lanes(activate(acc), (M) - (o4) * 4)

// Stride 1, dilation 1, one group.  Three launches over T = N * TH * TW tiles of 2x2 outputs:
//   winograd_input:   v[xi][s][t]  = (B^T d B)[xi] for the 4x4 input patch d of tile t, slice s
//   winograd_product: m[xi][o4][t] = sum over input slices of v[xi][s][t] through u[xi][o4][s]
//   winograd_output:  y = A^T m A (2x2 per tile) + bias, epilogue
// The transformed weights u = G g G^T are computed on the host: u: [16][O4][C4][4].

// One row or column of B^T d B: (d0 - d2, d1 + d2, d2 - d1, d1 - d3).
#define WINO_BT(d0, d1, d2, d3, r0, r1, r2, r3) \
    r0 = d0 - d2; r1 = d1 + d2; r2 = d2 - d1; r3 = d1 - d3;

// grid: (T, C4).  v: [16][C4][T] float4.
KERNEL(winograd_input, IN(x), OUT(v), INT(C4), INT(H), INT(W), INT(PH), INT(PW), INT(TH), INT(TW), INT(T))
{
    const int t = GID(0);
    const int s = GID(1);
    if (t >= T) return;
    const int n = t / (TH * TW);
    const int th = (t / TW) % TH;
    const int tw = t % TW;
    const int ih0 = th * 2 - PH;
    const int iw0 = tw * 2 - PW;
    const int xs = (n * C4 + s) * H;
    FLOAT4 d[16];
    for (int i = 0; i < 4; ++i) {
        const int ih = ih0 + i;
        for (int j = 0; j < 4; ++j) {
            const int iw = iw0 + j;
            d[i * 4 + j] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? LOAD4(x, (xs + ih) * W + iw) : F4S(0.0f);
        }
    }
    FLOAT4 e[16];
    for (int j = 0; j < 4; ++j) {  // columns: rows of B^T applied along h
        WINO_BT(d[j], d[4 + j], d[8 + j], d[12 + j], e[j], e[4 + j], e[8 + j], e[12 + j])
    }
    for (int i = 0; i < 4; ++i) {  // then along w
        WINO_BT(e[i * 4], e[i * 4 + 1], e[i * 4 + 2], e[i * 4 + 3], d[i * 4], d[i * 4 + 1], d[i * 4 + 2], d[i * 4 + 3])
    }
    for (int xi = 0; xi < 16; ++xi) STORE4(d[xi], v, (xi * C4 + s) * T + t);
}

// 16 independent [T x C] @ [C x M] products, 4 tiles x 4 output channels per work item.
// grid: (ceil(T / 4), O4, 16).  m: [16][O4][T] float4.
KERNEL(winograd_product, IN(v), IN(u), OUT(m), INT(C4), INT(O4), INT(T))
{
    const int t0 = GID(0) * 4;
    const int o4 = GID(1);
    const int xi = GID(2);
    if (t0 >= T) return;
    const int t1 = min(t0 + 1, T - 1), t2 = min(t0 + 2, T - 1), t3 = min(t0 + 3, T - 1);
    FLOAT4 a0 = F4S(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int vi = xi * C4 * T;
    int ui = (xi * O4 + o4) * C4 * 4;
    for (int s = 0; s < C4; ++s) {
        const FLOAT4 w0 = LOAD4(u, ui), w1 = LOAD4(u, ui + 1), w2 = LOAD4(u, ui + 2), w3 = LOAD4(u, ui + 3);
        a0 = mac4(a0, LOAD4(v, vi + t0), w0, w1, w2, w3);
        a1 = mac4(a1, LOAD4(v, vi + t1), w0, w1, w2, w3);
        a2 = mac4(a2, LOAD4(v, vi + t2), w0, w1, w2, w3);
        a3 = mac4(a3, LOAD4(v, vi + t3), w0, w1, w2, w3);
        vi += T;
        ui += 4;
    }
    const int mo = (xi * O4 + o4) * T + t0;
    STORE4(a0, m, mo);
    if (t0 + 1 < T) STORE4(a1, m, mo + 1);
    if (t0 + 2 < T) STORE4(a2, m, mo + 2);
    if (t0 + 3 < T) STORE4(a3, m, mo + 3);
}

// grid: (T, O4).
KERNEL(winograd_output, IN(m), IN(bias), OUT(y), INT(M), INT(OH), INT(OW), INT(TH), INT(TW), INT(T),
       EPILOGUE)
{
    const int t = GID(0);
    const int o4 = GID(1);
    if (t >= T) return;
    const int O4 = (M + 3) / 4;
    const int n = t / (TH * TW);
    const int oh = ((t / TW) % TH) * 2;
    const int ow = (t % TW) * 2;
    FLOAT4 q[16];
    for (int xi = 0; xi < 16; ++xi) q[xi] = LOAD4(m, (xi * O4 + o4) * T + t);
    // A^T = [[1, 1, 1, 0], [0, 1, -1, -1]], along h then along w.
    FLOAT4 r[8];
    for (int j = 0; j < 4; ++j) {
        r[j] = q[j] + q[4 + j] + q[8 + j];
        r[4 + j] = q[4 + j] - q[8 + j] - q[12 + j];
    }
    const FLOAT4 b = LOAD4(bias, o4);
    const int yo = ((n * O4 + o4) * OH + oh) * OW + ow;
    for (int i = 0; i < 2; ++i) {
        if (oh + i >= OH) break;
        STORE4(finish(r[i * 4] + r[i * 4 + 1] + r[i * 4 + 2] + b, o4, M), y, yo + i * OW);
        if (ow + 1 < OW) STORE4(finish(r[i * 4 + 1] - r[i * 4 + 2] - r[i * 4 + 3] + b, o4, M), y, yo + i * OW + 1);
    }
}
