// 2-D convolution kernels over packed (NC4HW4) tensors.
//
// Indices below count float4s: the slice s of image n at (h, w) is ((n * C4 + s) * H + h) * W + w.
// Each work item computes 4 output channels (one output slice, the float4 lanes) for up to 4
// output pixels, accumulating in float.  Weights are re-laid on the host so that the 4x4 block
// mapping one input slice onto one output slice is 4 consecutive float4s: block[l] holds the
// weights of input lane l for the 4 output lanes.  Weights of padding lanes are zero, so the
// kernels never depend on the input's padding channels; outputs' padding lanes are written as
// zero (masked after the epilogue, which need not map 0 to 0).

// v.x * w0 + v.y * w1 + v.z * w2 + v.w * w3: one input slice through one 4x4 weight block.
INLINE FLOAT4 mac4(FLOAT4 acc, FLOAT4 v, FLOAT4 w0, FLOAT4 w1, FLOAT4 w2, FLOAT4 w3)
{
    return acc + w0 * v.x + w1 * v.y + w2 * v.z + w3 * v.w;
}

// Zero the lanes of an output slice past the real channel count (valid = channels left).
INLINE FLOAT4 mask_lanes(FLOAT4 v, int valid)
{
    if (valid < 4) v.w = 0.0f;
    if (valid < 3) v.z = 0.0f;
    if (valid < 2) v.y = 0.0f;
    return v;
}

// The epilogue (a macro: `activate` reads the kernel's EPILOGUE argument), then the lane mask.
#define finish(acc, o4, M) mask_lanes(activate(acc), (M) - (o4) * 4)

// Pointwise: 1x1 kernel, no padding, stride 1 or 2, one group.  4 output pixels along the
// flattened output plane.  grid: (ceil(OH*OW / 4), O4, N).  w: [O4][C4][4].
KERNEL(conv2d_1x1, IN(x), IN(w), IN(bias), OUT(y), INT(C4), INT(H), INT(W), INT(M), INT(OH), INT(OW),
       INT(stride), EPILOGUE)
{
    const int pb = GID(0) * 4;
    const int o4 = GID(1);
    const int n = GID(2);
    const int P = OH * OW;
    if (pb >= P) return;
    const int O4 = (M + 3) / 4;
    int xi[4];
    for (int j = 0; j < 4; ++j) {
        const int p = min(pb + j, P - 1);
        xi[j] = (p / OW) * stride * W + (p % OW) * stride;
    }
    const int plane = H * W;
    int xo = n * C4 * plane;
    int wi = o4 * C4 * 4;
    const FLOAT4 b = LOAD4(bias, o4);
    FLOAT4 a0 = b, a1 = b, a2 = b, a3 = b;
    for (int s = 0; s < C4; ++s) {
        const FLOAT4 w0 = LOAD4(w, wi), w1 = LOAD4(w, wi + 1), w2 = LOAD4(w, wi + 2), w3 = LOAD4(w, wi + 3);
        a0 = mac4(a0, LOAD4(x, xo + xi[0]), w0, w1, w2, w3);
        a1 = mac4(a1, LOAD4(x, xo + xi[1]), w0, w1, w2, w3);
        a2 = mac4(a2, LOAD4(x, xo + xi[2]), w0, w1, w2, w3);
        a3 = mac4(a3, LOAD4(x, xo + xi[3]), w0, w1, w2, w3);
        xo += plane;
        wi += 4;
    }
    const int yo = (n * O4 + o4) * P + pb;
    STORE4(finish(a0, o4, M), y, yo);
    if (pb + 1 < P) STORE4(finish(a1, o4, M), y, yo + 1);
    if (pb + 2 < P) STORE4(finish(a2, o4, M), y, yo + 2);
    if (pb + 3 < P) STORE4(finish(a3, o4, M), y, yo + 3);
}

// Direct convolution, one group or several.  4 output pixels along a row.  Output slice o4
// reads SPAN input slices from the first slice of its first channel's group (all of them for
// one group); weights outside a channel's group are zero.  KH x KW taps of any stride, padding
// (negative too) and dilation.  grid: (ceil(OW / 4), O4, N * OH).  w: [O4][SPAN][KH*KW][4].
KERNEL(conv2d_direct, IN(x), IN(w), IN(bias), OUT(y), INT(C4), INT(H), INT(W), INT(M), INT(OH), INT(OW),
       INT(KH), INT(KW), INT(SH), INT(SW), INT(PH), INT(PW), INT(DH), INT(DW), INT(SPAN), INT(CG), INT(MG),
       EPILOGUE)
{
    const int ow0 = GID(0) * 4;
    const int o4 = GID(1);
    const int n = GID(2) / OH;
    const int oh = GID(2) % OH;
    if (ow0 >= OW) return;
    const int O4 = (M + 3) / 4;
    const int lo = ((o4 * 4) / MG) * CG / 4;
    const int iw0 = ow0 * SW - PW;
    const int ih0 = oh * SH - PH;
    const FLOAT4 b = LOAD4(bias, o4);
    FLOAT4 a0 = b, a1 = b, a2 = b, a3 = b;
    const FLOAT4 zero = F4S(0.0f);
    for (int s = 0; s < SPAN; ++s) {
        const int si = lo + s;
        if (si >= C4) break;
        const int xs = (n * C4 + si) * H;
        int wi = (o4 * SPAN + s) * KH * KW * 4;
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = ih0 + kh * DH;
            if (ih < 0 || ih >= H) {
                wi += KW * 4;
                continue;
            }
            const int xr = (xs + ih) * W;
            for (int kw = 0; kw < KW; ++kw) {
                const FLOAT4 w0 = LOAD4(w, wi), w1 = LOAD4(w, wi + 1), w2 = LOAD4(w, wi + 2), w3 = LOAD4(w, wi + 3);
                wi += 4;
                const int iw = iw0 + kw * DW;
                const FLOAT4 v0 = (iw >= 0 && iw < W) ? LOAD4(x, xr + iw) : zero;
                const FLOAT4 v1 = (iw + SW >= 0 && iw + SW < W) ? LOAD4(x, xr + iw + SW) : zero;
                const FLOAT4 v2 = (iw + 2 * SW >= 0 && iw + 2 * SW < W) ? LOAD4(x, xr + iw + 2 * SW) : zero;
                const FLOAT4 v3 = (iw + 3 * SW >= 0 && iw + 3 * SW < W) ? LOAD4(x, xr + iw + 3 * SW) : zero;
                a0 = mac4(a0, v0, w0, w1, w2, w3);
                a1 = mac4(a1, v1, w0, w1, w2, w3);
                a2 = mac4(a2, v2, w0, w1, w2, w3);
                a3 = mac4(a3, v3, w0, w1, w2, w3);
            }
        }
    }
    const int yo = ((n * O4 + o4) * OH + oh) * OW + ow0;
    STORE4(finish(a0, o4, M), y, yo);
    if (ow0 + 1 < OW) STORE4(finish(a1, o4, M), y, yo + 1);
    if (ow0 + 2 < OW) STORE4(finish(a2, o4, M), y, yo + 2);
    if (ow0 + 3 < OW) STORE4(finish(a3, o4, M), y, yo + 3);
}

// Direct 3x3, one group: conv2d_direct with the taps fixed at compile time (unrolled).
// grid: (ceil(OW / 4), O4, N * OH).  w: [O4][C4][9][4].
KERNEL(conv2d_3x3, IN(x), IN(w), IN(bias), OUT(y), INT(C4), INT(H), INT(W), INT(M), INT(OH), INT(OW),
       INT(SH), INT(SW), INT(PH), INT(PW), INT(DH), INT(DW), EPILOGUE)
{
    const int ow0 = GID(0) * 4;
    const int o4 = GID(1);
    const int n = GID(2) / OH;
    const int oh = GID(2) % OH;
    if (ow0 >= OW) return;
    const int O4 = (M + 3) / 4;
    const int ih0 = oh * SH - PH;
    const int iw0 = ow0 * SW - PW;
    int iws[12];
    bool okw[12];
    for (int kw = 0; kw < 3; ++kw) {
        for (int j = 0; j < 4; ++j) {
            const int iw = iw0 + kw * DW + j * SW;
            okw[kw * 4 + j] = iw >= 0 && iw < W;
            iws[kw * 4 + j] = okw[kw * 4 + j] ? iw : 0;
        }
    }
    const FLOAT4 b = LOAD4(bias, o4);
    FLOAT4 a0 = b, a1 = b, a2 = b, a3 = b;
    const FLOAT4 zero = F4S(0.0f);
    int wi = o4 * C4 * 36;
    for (int s = 0; s < C4; ++s) {
        const int xs = (n * C4 + s) * H;
        for (int kh = 0; kh < 3; ++kh) {
            const int ih = ih0 + kh * DH;
            if (ih < 0 || ih >= H) {
                wi += 12;
                continue;
            }
            const int xr = (xs + ih) * W;
            for (int kw = 0; kw < 3; ++kw) {
                const FLOAT4 w0 = LOAD4(w, wi), w1 = LOAD4(w, wi + 1), w2 = LOAD4(w, wi + 2), w3 = LOAD4(w, wi + 3);
                wi += 4;
                const int k = kw * 4;
                a0 = mac4(a0, okw[k] ? LOAD4(x, xr + iws[k]) : zero, w0, w1, w2, w3);
                a1 = mac4(a1, okw[k + 1] ? LOAD4(x, xr + iws[k + 1]) : zero, w0, w1, w2, w3);
                a2 = mac4(a2, okw[k + 2] ? LOAD4(x, xr + iws[k + 2]) : zero, w0, w1, w2, w3);
                a3 = mac4(a3, okw[k + 3] ? LOAD4(x, xr + iws[k + 3]) : zero, w0, w1, w2, w3);
            }
        }
    }
    const int yo = ((n * O4 + o4) * OH + oh) * OW + ow0;
    STORE4(finish(a0, o4, M), y, yo);
    if (ow0 + 1 < OW) STORE4(finish(a1, o4, M), y, yo + 1);
    if (ow0 + 2 < OW) STORE4(finish(a2, o4, M), y, yo + 2);
    if (ow0 + 3 < OW) STORE4(finish(a3, o4, M), y, yo + 3);
}

// One input channel of a 4-pixel row segment, as a float4 per pixel lane j (mult > 1 path).
INLINE float pick(FLOAT4 v, int lane)
{
    return lane == 0 ? v.x : lane == 1 ? v.y : lane == 2 ? v.z : v.w;
}

// Depthwise: group == C, output channel c * MULT + j reads input channel c only.  With
// MULT == 1 output slice o4 is input slice o4, one vector multiply-add per tap; otherwise each
// lane gathers its own input channel.  grid: (ceil(OW / 4), O4, N * OH).  w: [O4][KH*KW] (lanes).
KERNEL(conv2d_depthwise, IN(x), IN(w), IN(bias), OUT(y), INT(C4), INT(H), INT(W), INT(M), INT(OH), INT(OW),
       INT(KH), INT(KW), INT(SH), INT(SW), INT(PH), INT(PW), INT(DH), INT(DW), INT(MULT),
       EPILOGUE)
{
    const int ow0 = GID(0) * 4;
    const int o4 = GID(1);
    const int n = GID(2) / OH;
    const int oh = GID(2) % OH;
    if (ow0 >= OW) return;
    const int O4 = (M + 3) / 4;
    const int ih0 = oh * SH - PH;
    const int iw0 = ow0 * SW - PW;
    const FLOAT4 b = LOAD4(bias, o4);
    FLOAT4 a0 = b, a1 = b, a2 = b, a3 = b;
    const FLOAT4 zero = F4S(0.0f);
    // Input slice and lane of each output lane (all the same slice when MULT == 1).
    const int C = (M / MULT);
    int src[4];
    for (int l = 0; l < 4; ++l) src[l] = min((o4 * 4 + l) / MULT, C - 1);
    int wi = o4 * KH * KW;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * DH;
        if (ih < 0 || ih >= H) {
            wi += KW;
            continue;
        }
        for (int kw = 0; kw < KW; ++kw) {
            const FLOAT4 wv = LOAD4(w, wi);
            wi += 1;
            const int iw = iw0 + kw * DW;
            if (MULT == 1) {
                const int xr = ((n * C4 + o4) * H + ih) * W;
                a0 += wv * ((iw >= 0 && iw < W) ? LOAD4(x, xr + iw) : zero);
                a1 += wv * ((iw + SW >= 0 && iw + SW < W) ? LOAD4(x, xr + iw + SW) : zero);
                a2 += wv * ((iw + 2 * SW >= 0 && iw + 2 * SW < W) ? LOAD4(x, xr + iw + 2 * SW) : zero);
                a3 += wv * ((iw + 3 * SW >= 0 && iw + 3 * SW < W) ? LOAD4(x, xr + iw + 3 * SW) : zero);
            } else {
                for (int j = 0; j < 4; ++j) {
                    const int iwj = iw + j * SW;
                    if (iwj < 0 || iwj >= W) continue;
                    FLOAT4 v;
                    v.x = pick(LOAD4(x, ((n * C4 + src[0] / 4) * H + ih) * W + iwj), src[0] % 4);
                    v.y = pick(LOAD4(x, ((n * C4 + src[1] / 4) * H + ih) * W + iwj), src[1] % 4);
                    v.z = pick(LOAD4(x, ((n * C4 + src[2] / 4) * H + ih) * W + iwj), src[2] % 4);
                    v.w = pick(LOAD4(x, ((n * C4 + src[3] / 4) * H + ih) * W + iwj), src[3] % 4);
                    if (j == 0) a0 += wv * v;
                    else if (j == 1) a1 += wv * v;
                    else if (j == 2) a2 += wv * v;
                    else a3 += wv * v;
                }
            }
        }
    }
    const int yo = ((n * O4 + o4) * OH + oh) * OW + ow0;
    STORE4(finish(a0, o4, M), y, yo);
    if (ow0 + 1 < OW) STORE4(finish(a1, o4, M), y, yo + 1);
    if (ow0 + 2 < OW) STORE4(finish(a2, o4, M), y, yo + 2);
    if (ow0 + 3 < OW) STORE4(finish(a3, o4, M), y, yo + 3);
}

// Transposed convolution as a gather: output (oh, ow) takes input (ih, iw) through tap (kh, kw)
// where oh + PH - kh * DH == ih * SH (and likewise along w).  One output pixel, 4 output
// channels; groups as in conv2d_direct.  grid: (OW, O4, N * OH).  w: [O4][SPAN][KH*KW][4].
KERNEL(conv_transpose2d, IN(x), IN(w), IN(bias), OUT(y), INT(C4), INT(H), INT(W), INT(M), INT(OH), INT(OW),
       INT(KH), INT(KW), INT(SH), INT(SW), INT(PH), INT(PW), INT(DH), INT(DW), INT(SPAN), INT(CG), INT(MG),
       EPILOGUE)
{
    const int ow = GID(0);
    const int o4 = GID(1);
    const int n = GID(2) / OH;
    const int oh = GID(2) % OH;
    if (ow >= OW) return;
    const int O4 = (M + 3) / 4;
    const int lo = ((o4 * 4) / MG) * CG / 4;
    FLOAT4 acc = LOAD4(bias, o4);
    for (int kh = 0; kh < KH; ++kh) {
        const int th = oh + PH - kh * DH;
        if (th < 0 || th % SH != 0 || th / SH >= H) continue;
        const int ih = th / SH;
        for (int kw = 0; kw < KW; ++kw) {
            const int tw = ow + PW - kw * DW;
            if (tw < 0 || tw % SW != 0 || tw / SW >= W) continue;
            const int iw = tw / SW;
            for (int s = 0; s < SPAN; ++s) {
                const int si = lo + s;
                if (si >= C4) break;
                const int wi = (((o4 * SPAN + s) * KH + kh) * KW + kw) * 4;
                acc = mac4(acc, LOAD4(x, ((n * C4 + si) * H + ih) * W + iw),
                           LOAD4(w, wi), LOAD4(w, wi + 1), LOAD4(w, wi + 2), LOAD4(w, wi + 3));
            }
        }
    }
    STORE4(finish(acc, o4, M), y, ((n * O4 + o4) * OH + oh) * OW + ow);
}
