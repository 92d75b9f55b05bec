"""Native host kernels: the Python side of the optional C library whose sources are
``kernels/host/*.c`` (built by setup.py into ``_optcli_native*.so`` here), for the host CPU (``arm``)
target.  Where the library is absent the numpy kernels in ``optcli/ops/`` run instead.

This face re-exports what the package calls as ``native.<name>``; the code lives in:

- ``library``: loading (``_lib``, the one ctypes handle, None without the library), the ABI table,
  ``available``/``status``, thread control and threadpoolctl, ``NativeError``;
- ``caches``: data addresses of read-only arrays, geometry arrays, ``derived``;
- one wrapper module per C file: ``window`` (depthwise conv, pooling), ``stem``, ``gemm``, ``fc_rows``,
  ``epilogue``, ``elementwise``, ``blocked_conv`` and ``blocked_window`` (the NCHWc layout, imported
  by optcli/ops/blocked.py when it needs them), ``qgemm`` and ``qelementwise`` (the integer convs, dense
  layers and adds of optcli.QConv, optcli.QMatMul and optcli.QAdd, imported by optcli/ops/qconv.py,
  qmatmul.py and qadd.py).
"""

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.caches import derived
from optcli.native.elementwise import (
    activation,
    activation_,
    add,
    add_period,
    from_half,
    layer_norm,
    prepared_layer_norm,
    row_mean,
    softmax_mid,
    softmax_rows,
    to_half,
)
from optcli.native.epilogue import bias_activation_, channel_affine, prepared_channel_prelu
from optcli.native.fc_rows import prepared_fc, prepared_fc_rows
from optcli.native.gemm import conv2d_gemm, gemm_conv, pack_panels, prepared_conv2d_gemm, prepared_gemm_conv
from optcli.native.library import (
    LIB_PREFIX,
    NativeError,
    available,
    get_num_threads,
    library_path,
    note_unavailable,
    set_num_threads,
    status,
    vector_width,
)
from optcli.native.stem import prepared_stem_conv2d, stem_conv2d, stem_fits, stem_fits_grouped
from optcli.native.upsample import transpose_conv_taps, upsample_nearest
from optcli.native.window import depthwise_conv2d, depthwise_fits, pool2d, prepared_depthwise_conv2d

__all__ = [
    "ACTIVATION_CODES", "LIB_PREFIX", "NativeError", "activation", "activation_", "add", "add_period", "available",
    "bias_activation_", "channel_affine", "conv2d_gemm", "depthwise_conv2d", "depthwise_fits", "derived", "from_half",
    "gemm_conv", "prepared_channel_prelu",
    "get_num_threads", "layer_norm", "library", "library_path", "note_unavailable", "pack_panels", "pool2d",
    "prepared_conv2d_gemm", "prepared_depthwise_conv2d", "prepared_fc", "prepared_fc_rows", "prepared_layer_norm",
    "prepared_stem_conv2d",
    "prepared_gemm_conv", "row_mean", "set_num_threads", "softmax_mid", "softmax_rows", "status", "stem_conv2d",
    "stem_fits", "stem_fits_grouped", "to_half", "transpose_conv_taps", "upsample_nearest", "vector_width",
]
