// ReduceSum / Mean / Max / Min over any set of the packed dims (N, C, H, W), one work item per
// float4 of the kept-dims result.  The result is written element by element into the output's
// own packed layout (keepdims=0 may move the channel axis); the work item that writes the
// output's last channel zeroes the lanes after it.

// op: 0 sum, 1 mean (sum * scale), 2 max, 3 min
INLINE FLOAT4 combine(FLOAT4 a, FLOAT4 b, int op) {
    if (op == 2) return fmax(a, b);
    if (op == 3) return fmin(a, b);
    return a + b;
}

INLINE float identity_of(int op) {
    return op == 2 ? -INFINITY : (op == 3 ? INFINITY : 0.0f);
}

KERNEL(reduce4, IN(x), OUT(y), INT(count), INT(N), INT(C), INT(H), INT(W), INT(rn), INT(rc), INT(rh), INT(rw),
       INT(oC), INT(oH), INT(oW), INT(op), FLOAT(scale))
{
    const int i = GID(0);
    if (i >= count) return;
    const int kC = rc ? 1 : C;
    const int kH = rh ? 1 : H;
    const int kW = rw ? 1 : W;
    const int kc4 = (kC + 3) / 4;
    const int w = i % kW;
    const int h = (i / kW) % kH;
    const int s = (i / (kW * kH)) % kc4;
    const int n = i / (kW * kH * kc4);
    const int c4 = (C + 3) / 4;
    const float id = identity_of(op);
    FLOAT4 acc = F4S(id);
    for (int nn = rn ? 0 : n; nn < (rn ? N : n + 1); ++nn) {
        for (int ss = rc ? 0 : s; ss < (rc ? c4 : s + 1); ++ss) {
            const int c = ss * 4;
            for (int hh = rh ? 0 : h; hh < (rh ? H : h + 1); ++hh) {
                for (int ww = rw ? 0 : w; ww < (rw ? W : w + 1); ++ww) {
                    FLOAT4 v = LOAD4(x, ((nn * c4 + ss) * H + hh) * W + ww);
                    if (rc) v = F4(v.x, c + 1 < C ? v.y : id, c + 2 < C ? v.z : id, c + 3 < C ? v.w : id);
                    acc = combine(acc, v, op);
                }
            }
        }
    }
    if (rc) {
        const FLOAT4 pair = combine(F4(acc.x, acc.y, id, id), F4(acc.z, acc.w, id, id), op);
        const float total = combine(F4(pair.x, id, id, id), F4(pair.y, id, id, id), op).x;
        acc = F4(total, id, id, id);
    }
    if (op == 1) acc = acc * scale;
    const float lanes[4] = {acc.x, acc.y, acc.z, acc.w};
    const int oc4 = (oC + 3) / 4;
    for (int k = 0; k < 4; ++k) {
        const int kc = s * 4 + k;
        if (kc >= kC) break;
        const int at = ((n * kC + kc) * kH + h) * kW + w;  // logical row-major index
        const int ow = at % oW;
        const int oh = (at / oW) % oH;
        const int oc = (at / (oW * oH)) % oC;
        const int on = at / (oW * oH * oC);
        const int p = (((on * oc4 + oc / 4) * oH + oh) * oW + ow) * 4;
        STORE1(lanes[k], y, p + oc % 4);
        if (oc == oC - 1) {
            for (int z = oc % 4 + 1; z < 4; ++z) STORE1(0.0f, y, p + z);
        }
    }
}
