// Data movement over packed (NC4HW4) tensors: a plain copy, one general "remap" for the
// index-only ops (Reshape, Transpose, Slice, DepthToSpace, Expand...), the per-input part of a
// Concat, and Pad.  Work items own one output float4, except concat_part (one input float4);
// every kernel writes the padding lanes of what it produces as zero.

KERNEL(copy4, IN(x), OUT(y), INT(count))
{
    const int i = GID(0);
    if (i >= count) return;
    STORE4(LOAD4(x, i), y, i);
}

// Packed (scalar) index of element (n, c, h, w) of a tensor with packed dims (-, C, H, W).
INLINE int packed_at(int n, int c, int h, int w, int C, int H, int W) {
    return (((n * ((C + 3) / 4) + c / 4) * H + h) * W + w) * 4 + c % 4;
}

// Each output element's logical (row-major) index, split over the 6-D shape (d0..d5, d0
// implied), gives the source's logical index  offset + sum(q_k * s_k).
KERNEL(remap, IN(x), OUT(y), INT(count), INT(oC), INT(oH), INT(oW),
       INT(d1), INT(d2), INT(d3), INT(d4), INT(d5), INT(s0), INT(s1), INT(s2), INT(s3), INT(s4), INT(s5),
       INT(offset), INT(iC), INT(iH), INT(iW))
{
    const int i = GID(0);
    if (i >= count) return;
    const int w = i % oW;
    const int h = (i / oW) % oH;
    const int oc4 = (oC + 3) / 4;
    const int s = (i / (oW * oH)) % oc4;
    const int n = i / (oW * oH * oc4);
    float lanes[4];
    for (int k = 0; k < 4; ++k) {
        const int c = s * 4 + k;
        lanes[k] = 0.0f;
        if (c >= oC) continue;
        int r = ((n * oC + c) * oH + h) * oW + w;
        int src = offset;
        src += (r % d5) * s5; r /= d5;
        src += (r % d4) * s4; r /= d4;
        src += (r % d3) * s3; r /= d3;
        src += (r % d2) * s2; r /= d2;
        src += (r % d1) * s1; r /= d1;
        src += r * s0;
        const int sw = src % iW;
        const int sh = (src / iW) % iH;
        const int sc = (src / (iW * iH)) % iC;
        const int sn = src / (iW * iH * iC);
        lanes[k] = LOAD1(x, packed_at(sn, sc, sh, sw, iC, iH, iW));
    }
    STORE4(F4(lanes[0], lanes[1], lanes[2], lanes[3]), y, i);
}

// One Concat input: its elements land at `offset` along packed axis `axis` (0..3 = N, C, H, W)
// of the output.  The work item holding the output's last channel zeroes the lanes past it.
KERNEL(concat_part, IN(x), OUT(y), INT(count), INT(iC), INT(iH), INT(iW), INT(oC), INT(oH), INT(oW),
       INT(axis), INT(offset))
{
    const int i = GID(0);
    if (i >= count) return;
    const int w = i % iW;
    const int h = (i / iW) % iH;
    const int ic4 = (iC + 3) / 4;
    const int s = (i / (iW * iH)) % ic4;
    const int n = i / (iW * iH * ic4);
    const FLOAT4 v = LOAD4(x, i);
    const float lanes[4] = {v.x, v.y, v.z, v.w};
    const int on = n + (axis == 0 ? offset : 0);
    const int oh = h + (axis == 2 ? offset : 0);
    const int ow = w + (axis == 3 ? offset : 0);
    for (int k = 0; k < 4; ++k) {
        const int c = s * 4 + k;
        if (c >= iC) break;
        const int oc = c + (axis == 1 ? offset : 0);
        const int at = packed_at(on, oc, oh, ow, oC, oH, oW);
        STORE1(lanes[k], y, at);
        if (oc == oC - 1) {
            for (int z = oc % 4 + 1; z < 4; ++z) STORE1(0.0f, y, at - oc % 4 + z);
        }
    }
}

// Source index along one axis for Pad's modes (0 constant: -1 when outside, 1 reflect,
// 2 edge, 3 wrap).
INLINE int pad_source(int i, int size, int mode) {
    if (i >= 0 && i < size) return i;
    if (mode == 0) return -1;
    if (mode == 1) {
        const int period = 2 * size - 2;
        if (period <= 0) return 0;
        int m = i % period;
        if (m < 0) m += period;
        return m < size ? m : period - m;
    }
    if (mode == 2) return clamp(i, 0, size - 1);
    int m = i % size;
    return m < 0 ? m + size : m;
}

KERNEL(pad, IN(x), OUT(y), INT(count), INT(oC), INT(oH), INT(oW), INT(iN), INT(iC), INT(iH), INT(iW),
       INT(pn), INT(pc), INT(ph), INT(pw), INT(mode), FLOAT(value))
{
    const int i = GID(0);
    if (i >= count) return;
    const int w = i % oW;
    const int h = (i / oW) % oH;
    const int oc4 = (oC + 3) / 4;
    const int s = (i / (oW * oH)) % oc4;
    const int n = i / (oW * oH * oc4);
    const int sn = pad_source(n - pn, iN, mode);
    const int sh = pad_source(h - ph, iH, mode);
    const int sw = pad_source(w - pw, iW, mode);
    float lanes[4];
    for (int k = 0; k < 4; ++k) {
        const int c = s * 4 + k;
        const int sc = pad_source(c - pc, iC, mode);
        if (c >= oC) lanes[k] = 0.0f;
        else if (sn < 0 || sc < 0 || sh < 0 || sw < 0) lanes[k] = value;
        else lanes[k] = LOAD1(x, packed_at(sn, sc, sh, sw, iC, iH, iW));
    }
    STORE4(F4(lanes[0], lanes[1], lanes[2], lanes[3]), y, i);
}
