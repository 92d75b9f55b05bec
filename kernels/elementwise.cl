// Element-wise kernels over packed (NC4HW4) tensors: one work item per float4.

KERNEL(unary4, IN(x), OUT(y), INT(count))
{
    const int i = GID(0);
    if (i >= count) return;
    STORE4(activate(LOAD4(x, i)), y, i);
}
