// Element-wise kernels over packed (NC4HW4) tensors: one work item per float4.
//
// UNARY_OP selects the unary function of map4 and BINARY_OP the operation of binary4 /
// binary4_same; both end in the fused epilogue (`activate`).  Lanes past the channel count are
// written as zero (exp(0) or sigmoid(0) would otherwise leak into the padding).

#ifndef UNARY_OP
#define UNARY_OP 0
#endif
#ifndef BINARY_OP
#define BINARY_OP 0
#endif

// erf4 is the epilogue's (gpu/dialect.py EPILOGUE), shared with the fused GELU.

INLINE FLOAT4 unary_op(FLOAT4 v) {
#if UNARY_OP == 1
    return exp(v);
#elif UNARY_OP == 2
    return -v;
#elif UNARY_OP == 3
    return fabs(v);
#elif UNARY_OP == 4
    return sqrt(v);
#elif UNARY_OP == 5
    return log(v);
#elif UNARY_OP == 6
    return F4S(1.0f) / v;
#elif UNARY_OP == 7
    return erf4(v);
#elif UNARY_OP == 8
    return fmax(v, F4S(0.0f)) + log(F4S(1.0f) + exp(-fabs(v)));
#elif UNARY_OP == 9
    return floor(v);
#elif UNARY_OP == 10
    return ceil(v);
#elif UNARY_OP == 11
    return v * 0.5f * (F4S(1.0f) + erf4(v * 0.70710678118654752f));
#else
    return v;
#endif
}

INLINE FLOAT4 binary_op(FLOAT4 a, FLOAT4 b) {
#if BINARY_OP == 1
    return a - b;
#elif BINARY_OP == 2
    return a * b;
#elif BINARY_OP == 3
    return a / b;
#elif BINARY_OP == 4
    return fmax(a, b);
#elif BINARY_OP == 5
    return fmin(a, b);
#elif BINARY_OP == 6
    return select(a * b, a, a >= F4S(0.0f));
#elif BINARY_OP == 7
    // And on bool tensors, stored as 0/1 in float storage
    return F4(a.x != 0.0f && b.x != 0.0f ? 1.0f : 0.0f, a.y != 0.0f && b.y != 0.0f ? 1.0f : 0.0f,
              a.z != 0.0f && b.z != 0.0f ? 1.0f : 0.0f, a.w != 0.0f && b.w != 0.0f ? 1.0f : 0.0f);
#else
    return a + b;
#endif
}

// Zero the lanes of channel slice `s` that lie past `channels`.
INLINE FLOAT4 mask_channels(FLOAT4 v, int s, int channels) {
    const int c = s * 4;
    return F4(v.x, c + 1 < channels ? v.y : 0.0f, c + 2 < channels ? v.z : 0.0f, c + 3 < channels ? v.w : 0.0f);
}

// unary_op then the epilogue; `plane` = H * W of the packed tensor, `channels` its C.
KERNEL(map4, IN(x), OUT(y), INT(count), INT(channels), INT(plane), EPILOGUE)
{
    const int i = GID(0);
    if (i >= count) return;
    const int s = (i / plane) % ((channels + 3) / 4);
    STORE4(mask_channels(activate(unary_op(LOAD4(x, i))), s, channels), y, i);
}

// Both inputs have the output's packed shape.
KERNEL(binary4_same, IN(a), IN(b), OUT(y), INT(count), INT(channels), INT(plane), EPILOGUE)
{
    const int i = GID(0);
    if (i >= count) return;
    const int s = (i / plane) % ((channels + 3) / 4);
    STORE4(mask_channels(activate(binary_op(LOAD4(a, i), LOAD4(b, i))), s, channels), y, i);
}

// Float4 index of (n, s, h, w) in an operand of packed dims (pn, pc, ph, pw) that broadcasts
// against the output: a size-1 dim reads index 0.  A size-1 channel dim reads lane 0 only.
INLINE int bcast_index(int n, int s, int h, int w, int pn, int pc, int ph, int pw) {
    const int nn = pn == 1 ? 0 : n;
    const int ss = pc == 1 ? 0 : s;
    const int hh = ph == 1 ? 0 : h;
    const int ww = pw == 1 ? 0 : w;
    return ((nn * ((pc + 3) / 4) + ss) * ph + hh) * pw + ww;
}

// Multidirectional broadcasting in the packed 4-D view: each operand's dims are either the
// output's or 1.
KERNEL(binary4, IN(a), IN(b), OUT(y), INT(count), INT(C), INT(H), INT(W),
       INT(an), INT(ac), INT(ah), INT(aw), INT(bn), INT(bc), INT(bh), INT(bw), EPILOGUE)
{
    const int i = GID(0);
    if (i >= count) return;
    const int w = i % W;
    const int h = (i / W) % H;
    const int c4 = (C + 3) / 4;
    const int s = (i / (W * H)) % c4;
    const int n = i / (W * H * c4);
    const int ia = bcast_index(n, s, h, w, an, ac, ah, aw);
    const int ib = bcast_index(n, s, h, w, bn, bc, bh, bw);
    const FLOAT4 va = ac == 1 ? F4S(LOAD1(a, ia * 4)) : LOAD4(a, ia);
    const FLOAT4 vb = bc == 1 ? F4S(LOAD1(b, ib * 4)) : LOAD4(b, ib);
    STORE4(mask_channels(activate(binary_op(va, vb)), s, C), y, i);
}
