// Normalisation over rows of consecutive float4s of a packed (NC4HW4) tensor, whose lanes are
// four independent rows (four channels): LayerNormalization over W or over H, W (the last axis
// of a sequence [N, T, D], packed N, C=T, 1, W=D) and InstanceNormalization (per image and
// channel, over H, W).  Two passes (mean, then the variance of the centred values, as the
// reference does), arithmetic in float.  Lanes past the channel count are written as zero.

// Row i is float4s [i * L, (i + 1) * L); R rows share one channel slice, whose index picks the
// lane mask.  The scale / shift float4 of element k of a row in slice s is at k * KS + s * SS:
// KS = 1, SS = 0 for LayerNormalization (one value per position, the same in every lane),
// KS = 0, SS = 1 for InstanceNormalization (one value per channel, a lane each).
KERNEL(norm_rows, IN(x), IN(scale), IN(shift), OUT(y), INT(count), INT(L), INT(R), INT(C), INT(KS), INT(SS),
       FLOAT(eps))
{
    const int i = GID(0);
    if (i >= count) return;
    const int base = i * L;
    const int s = (i / R) % ((C + 3) / 4);
    FLOAT4 sum = F4S(0.0f);
    for (int k = 0; k < L; ++k) sum += LOAD4(x, base + k);
    const FLOAT4 mean = sum / (float)L;
    FLOAT4 sq = F4S(0.0f);
    for (int k = 0; k < L; ++k) {
        const FLOAT4 d = LOAD4(x, base + k) - mean;
        sq += d * d;
    }
    const FLOAT4 inv = F4S(1.0f) / sqrt(sq / (float)L + F4S(eps));
    const int c = s * 4;
    const FLOAT4 mask = F4(1.0f, c + 1 < C ? 1.0f : 0.0f, c + 2 < C ? 1.0f : 0.0f, c + 3 < C ? 1.0f : 0.0f);
    for (int k = 0; k < L; ++k) {
        const int p = k * KS + s * SS;
        const FLOAT4 v = (LOAD4(x, base + k) - mean) * inv * LOAD4(scale, p) + LOAD4(shift, p);
        STORE4(select(F4S(0.0f), v, mask > F4S(0.0f)), y, base + k);
    }
}
