"""Host-side meaning of the copy and layout steps GPU plans contain.

On the host, tensors are plain NCHW numpy arrays, so uploading, downloading, packing and
unpacking are all the identity.  These kernels let a GPU plan run entirely on the CPU when no
GPU is available (``optcli.load`` falls back with a warning).
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import first_input, shape_fn


@kernel(["Upload", "Download", "Pack", "Unpack"], domain=OPTCLI_DOMAIN)
def identity(inputs, attrs):
    return [inputs[0]]


# A copy or a layout change keeps the value's (logical) shape.
shape_fn(["Upload", "Download", "Pack", "Unpack"], domain=OPTCLI_DOMAIN)(first_input)
