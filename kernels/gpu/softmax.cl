// Softmax / LogSoftmax (log_out) along one axis of a packed (NC4HW4) tensor, three passes
// (max, sum of exponentials, write) by one work item per row.  Lanes past the channel count
// are left out of the sums and written as zero.

INLINE FLOAT4 lane_mask(int s, int channels) {
    const int c = s * 4;
    return F4(1.0f, c + 1 < channels ? 1.0f : 0.0f, c + 2 < channels ? 1.0f : 0.0f, c + 3 < channels ? 1.0f : 0.0f);
}

// Along the channel axis: one work item per (n, h, w).
KERNEL(softmax_channel, IN(x), OUT(y), INT(count), INT(C), INT(H), INT(W), INT(log_out))
{
    const int i = GID(0);
    if (i >= count) return;
    const int plane = H * W;
    const int c4 = (C + 3) / 4;
    const int base = (i / plane) * c4 * plane + i % plane;
    float m = -INFINITY;
    for (int s = 0; s < c4; ++s) {
        const FLOAT4 v = select(F4S(-INFINITY), LOAD4(x, base + s * plane), lane_mask(s, C) > F4S(0.0f));
        m = fmax(m, fmax(fmax(v.x, v.y), fmax(v.z, v.w)));
    }
    float sum = 0.0f;
    for (int s = 0; s < c4; ++s) {
        const FLOAT4 e = exp(LOAD4(x, base + s * plane) - F4S(m)) * lane_mask(s, C);
        sum += e.x + e.y + e.z + e.w;
    }
    // (v - m) - log(sum), not v - (m + log(sum)): near 1e4 the sum m + log(sum) would round to
    // float's 1e-3 step there and lose the small log-probabilities.
    const float log_sum = log(sum);
    const float inv = 1.0f / sum;
    for (int s = 0; s < c4; ++s) {
        const FLOAT4 v = LOAD4(x, base + s * plane);
        const FLOAT4 r = log_out ? (v - F4S(m)) - F4S(log_sum) : exp(v - F4S(m)) * inv;
        STORE4(r * lane_mask(s, C), y, base + s * plane);
    }
}

// Along a non-channel axis: float4 `k` of row `i` is at base + k * inner; lanes are
// independent rows.
KERNEL(softmax_axis, IN(x), OUT(y), INT(count), INT(L), INT(inner), INT(C), INT(plane), INT(log_out))
{
    const int i = GID(0);
    if (i >= count) return;
    const int base = (i / inner) * L * inner + i % inner;
    const FLOAT4 mask = lane_mask((base / plane) % ((C + 3) / 4), C);
    FLOAT4 m = F4S(-INFINITY);
    for (int k = 0; k < L; ++k) m = fmax(m, LOAD4(x, base + k * inner));
    FLOAT4 sum = F4S(0.0f);
    for (int k = 0; k < L; ++k) sum += exp(LOAD4(x, base + k * inner) - m);
    const FLOAT4 log_sum = log(sum);
    for (int k = 0; k < L; ++k) {
        const FLOAT4 v = LOAD4(x, base + k * inner);
        const FLOAT4 r = log_out ? (v - m) - log_sum : exp(v - m) / sum;
        STORE4(r * mask, y, base + k * inner);
    }
}
