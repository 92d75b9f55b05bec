// Simulated quantization on the GPU: quantize to [qmin, qmax] with a per-tensor scale and zero
// point (round half to even, like onnxruntime), then dequantize.  Padding channels stay zero.

KERNEL(fake_quant4, IN(x), OUT(y), INT(count), INT(channels), INT(plane), FLOAT(scale), FLOAT(zero_point),
       FLOAT(qmin), FLOAT(qmax))
{
    const int i = GID(0);
    if (i >= count) return;
    const int c = ((i / plane) % ((channels + 3) / 4)) * 4;
    const FLOAT4 q = clamp(rint(LOAD4(x, i) / scale) + F4S(zero_point), F4S(qmin), F4S(qmax));
    const FLOAT4 v = (q - F4S(zero_point)) * scale;
    STORE4(F4(v.x, c + 1 < channels ? v.y : 0.0f, c + 2 < channels ? v.z : 0.0f, c + 3 < channels ? v.w : 0.0f),
           y, i);
}
