// Layout conversions between a plain NCHW buffer and the channel-packed NC4HW4 layout.
// Both sides are in storage precision; padding channels are written as zero.

KERNEL(pack_nc4hw4, IN(src), OUT(dst), INT(N), INT(C), INT(H), INT(W))
{
    const int w = GID(0), h = GID(1), nc4 = GID(2);
    if (w >= W || h >= H || nc4 >= N * ((C + 3) / 4)) return;
    const int C4 = (C + 3) / 4, n = nc4 / C4, c = (nc4 % C4) * 4;
    const int plane = H * W, base = (n * C + c) * plane + h * W + w;
    FLOAT4 v = F4S(0.0f);
    v.x = LOAD1(src, base);
    if (c + 1 < C) v.y = LOAD1(src, base + plane);
    if (c + 2 < C) v.z = LOAD1(src, base + 2 * plane);
    if (c + 3 < C) v.w = LOAD1(src, base + 3 * plane);
    STORE4(v, dst, (nc4 * H + h) * W + w);
}

KERNEL(unpack_nc4hw4, IN(src), OUT(dst), INT(N), INT(C), INT(H), INT(W))
{
    const int w = GID(0), h = GID(1), nc4 = GID(2);
    if (w >= W || h >= H || nc4 >= N * ((C + 3) / 4)) return;
    const int C4 = (C + 3) / 4, n = nc4 / C4, c = (nc4 % C4) * 4;
    const int plane = H * W, base = (n * C + c) * plane + h * W + w;
    const FLOAT4 v = LOAD4(src, (nc4 * H + h) * W + w);
    STORE1(v.x, dst, base);
    if (c + 1 < C) STORE1(v.y, dst, base + plane);
    if (c + 2 < C) STORE1(v.z, dst, base + 2 * plane);
    if (c + 3 < C) STORE1(v.w, dst, base + 3 * plane);
}
