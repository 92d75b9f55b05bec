// 2-D pooling over packed (NC4HW4) tensors: one work item per output float4, looping over the
// window.  POOL_MAX selects max (else average); global pools are a window the size of the input.
// Padding channels stay zero: the max or mean of zeros.

#ifndef POOL_MAX
#define POOL_MAX 0
#endif

// (kh, kw, sh, sw) window and strides, (ph, pw) begin pads, (eh, ew) declared end pads,
// (dh, dw) dilations; include_pad: AveragePool's count_include_pad.
KERNEL(pool2d, IN(x), OUT(y), INT(count), INT(H), INT(W), INT(OH), INT(OW), INT(kh), INT(kw), INT(sh), INT(sw),
       INT(ph), INT(pw), INT(eh), INT(ew), INT(dh), INT(dw), INT(include_pad), EPILOGUE)
{
    const int i = GID(0);
    if (i >= count) return;
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int plane = i / (OW * OH);  // n * C4 + slice
    const int h0 = oh * sh - ph;
    const int w0 = ow * sw - pw;
#if POOL_MAX
    FLOAT4 acc = F4S(-INFINITY);
#else
    FLOAT4 acc = F4S(0.0f);
    int rows = 0;
    int cols = 0;
#endif
    for (int a = 0; a < kh; ++a) {
        const int h = h0 + a * dh;
#if !POOL_MAX
        if (include_pad ? (h >= -ph && h < H + eh) : (h >= 0 && h < H)) rows += 1;
#endif
        if (h < 0 || h >= H) continue;
        for (int b = 0; b < kw; ++b) {
            const int w = w0 + b * dw;
            if (w < 0 || w >= W) continue;
            const FLOAT4 v = LOAD4(x, (plane * H + h) * W + w);
#if POOL_MAX
            acc = fmax(acc, v);
#else
            acc += v;
#endif
        }
    }
#if !POOL_MAX
    for (int b = 0; b < kw; ++b) {
        const int w = w0 + b * dw;
        if (include_pad ? (w >= -pw && w < W + ew) : (w >= 0 && w < W)) cols += 1;
    }
    acc = acc / (float)(rows * cols);
#endif
    STORE4(activate(acc), y, i);
}
