// Resize / Upsample over the two spatial dims of a packed (NC4HW4) tensor: nearest or linear,
// one work item per output float4.  Source coordinates follow ONNX's
// coordinate_transformation_mode, computed in float as onnxruntime does (it decides which
// pixel a near-tie picks).  Padding channels stay zero: every output is a blend of inputs.

// mode: 0 axis not resized, 1 half_pixel, 2 half_pixel_symmetric, 3 pytorch_half_pixel,
// 4 align_corners, 5 asymmetric, 6 tf_half_pixel_for_nn
INLINE float source_coord(int y, int mode, float scale, int in_len, int out_len) {
    const float fy = (float)y;
    const float out_w = scale * (float)in_len;
    if (mode == 1) return (fy + 0.5f) / scale - 0.5f;
    if (mode == 2) return (float)in_len / 2.0f * (1.0f - (float)out_len / out_w) + (fy + 0.5f) / scale - 0.5f;
    if (mode == 3) return out_w == 1.0f ? -0.5f : (fy + 0.5f) / scale - 0.5f;
    if (mode == 4) return out_w == 1.0f ? 0.0f : fy * (float)(in_len - 1) / (out_w - 1.0f);
    if (mode == 5) return fy / scale;
    if (mode == 6) return (fy + 0.5f) / scale;
    return fy;
}

// nearest: 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil, 4 simple (Resize-10,
// Upsample: floor when upsampling, ceil when downsampling)
INLINE int nearest_index(int y, int mode, float scale, int in_len, int out_len, int nearest) {
    const float x = source_coord(y, mode, scale, in_len, out_len);
    float r;
    if (mode == 0) r = x;
    else if (nearest == 0) r = ceil(x - 0.5f);
    else if (nearest == 1) r = floor(x + 0.5f);
    else if (nearest == 2) r = floor(x);
    else if (nearest == 3) r = ceil(x);
    else r = scale < 1.0f ? ceil(x) : floor(x);
    return clamp((int)r, 0, in_len - 1);
}

KERNEL(resize2d, IN(x), OUT(y), INT(count), INT(H), INT(W), INT(OH), INT(OW), INT(mode_h), INT(mode_w),
       FLOAT(scale_h), FLOAT(scale_w), INT(linear), INT(nearest))
{
    const int i = GID(0);
    if (i >= count) return;
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int base = (i / (OW * OH)) * H * W;  // first float4 of this (n, slice) plane
    if (!linear) {
        const int h = nearest_index(oh, mode_h, scale_h, H, OH, nearest);
        const int w = nearest_index(ow, mode_w, scale_w, W, OW, nearest);
        STORE4(LOAD4(x, base + h * W + w), y, i);
        return;
    }
    const float sy = source_coord(oh, mode_h, scale_h, H, OH);
    const float sx = source_coord(ow, mode_w, scale_w, W, OW);
    const float fy = floor(sy);
    const float fx = floor(sx);
    const float ry = sy - fy;
    const float rx = sx - fx;
    const int h0 = clamp((int)fy, 0, H - 1);
    const int h1 = clamp((int)fy + 1, 0, H - 1);
    const int w0 = clamp((int)fx, 0, W - 1);
    const int w1 = clamp((int)fx + 1, 0, W - 1);
    const FLOAT4 top = LOAD4(x, base + h0 * W + w0) * (1.0f - rx) + LOAD4(x, base + h0 * W + w1) * rx;
    const FLOAT4 bottom = LOAD4(x, base + h1 * W + w0) * (1.0f - rx) + LOAD4(x, base + h1 * W + w1) * rx;
    STORE4(top * (1.0f - ry) + bottom * ry, y, i);
}
