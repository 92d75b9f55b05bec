"""GPU kernel for Resize and Upsample: nearest (every nearest_mode) and linear / bilinear over the
spatial dims (H and W of rank-4 tensors, the last dim of rank-3 ones), scales or sizes constant.
The per-axis scale factors are resolved on the host exactly as the numpy reference does; the
kernel maps each output pixel to its source coordinate."""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import dims4, packed_elements
from optcli.gpu.ops_elementwise import data_check
from optcli.gpu.registry import Launch, gpu_kernel
from optcli.ir import Graph, Node

_CTM = {"half_pixel": 1, "half_pixel_symmetric": 2, "pytorch_half_pixel": 3, "align_corners": 4, "asymmetric": 5,
        "tf_half_pixel_for_nn": 6}
_NEAREST = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3, "simple": 4}


def _legacy(node) -> bool:
    return node.op_type == "Upsample" or len(node.inputs) == 2


def _factors(node, const, in_shape) -> list[float] | str:
    """Per-axis scale factor of a Resize/Upsample (the reference's rules), or why not known."""
    rank = len(in_shape)
    if node.op_type == "Upsample":
        name = node.inputs[1] if len(node.inputs) > 1 else ""
        scales = const(name) if name else np.asarray(node.attrs.get("scales", []), np.float32)
        if scales is None:
            return "Upsample scales must be a constant"
        return [float(s) for s in np.asarray(scales).reshape(-1)]
    if _legacy(node):
        scales = const(node.inputs[1])
        return "Resize scales must be a constant" if scales is None else [float(s) for s in scales.reshape(-1)]
    scales_name = node.inputs[2] if len(node.inputs) > 2 else ""
    sizes_name = node.inputs[3] if len(node.inputs) > 3 else ""
    scales = const(scales_name) if scales_name else None
    sizes = const(sizes_name) if sizes_name else None
    if (scales_name and scales is None) or (sizes_name and sizes is None):
        return "Resize scales/sizes must be constants"
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in (node.attrs.get("axes") or range(rank))]
    factors = [1.0] * rank
    if sizes is not None and sizes.size:
        if node.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "Resize keep_aspect_ratio_policy other than stretch"
        for a, s in zip(axes, sizes.reshape(-1).tolist()):
            factors[a] = int(s) / in_shape[a]
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.astype(np.float64).reshape(-1).tolist()):
            factors[a] = s
    else:
        return "Resize without scales or sizes"
    return factors


def _check(node: Node, graph: Graph) -> str | None:
    mode = node.attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        return f"Resize mode {mode}"
    if int(node.attrs.get("antialias", 0)):
        return "Resize antialias"
    ctm = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    if not _legacy(node) and ctm not in _CTM:
        return f"Resize coordinate_transformation_mode {ctm}"
    if not _legacy(node) and node.attrs.get("nearest_mode", "round_prefer_floor") not in _NEAREST:
        return f"Resize nearest_mode {node.attrs.get('nearest_mode')}"
    reason = data_check(node, graph)
    if reason:
        return reason
    shape = graph.shape_of(node.inputs[0])
    if len(shape) not in (3, 4):
        return f"Resize of a rank-{len(shape)} tensor (the GPU kernel resizes rank 3 and 4)"
    factors = _factors(node, graph.const, shape)
    if isinstance(factors, str):
        return factors
    out = graph.shape_of(node.outputs[0])
    if any(factors[a] != 1.0 or out[a] != shape[a] for a in (0, 1)):
        return "Resize of the batch or channel axis (the GPU kernel resizes spatial dims only)"
    return None


@gpu_kernel(["Resize", "Upsample"], check=_check)
def resize(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    factors = _factors(node, ctx.const, in_shape)
    legacy = _legacy(node)
    ctm = _CTM["asymmetric" if legacy else node.attrs.get("coordinate_transformation_mode", "half_pixel")]
    nearest = _NEAREST["simple" if legacy else node.attrs.get("nearest_mode", "round_prefer_floor")]
    _, _, h, w = dims4(in_shape)
    _, _, oh, ow = dims4(out_shape)
    spatial = list(range(2, len(in_shape)))
    scale = {a: factors[a] for a in spatial}
    # an axis the reference leaves alone (factor 1, same length) is read straight through
    mode = {a: 0 if scale[a] == 1.0 and in_shape[a] == out_shape[a] else ctm for a in spatial}
    mode_h, scale_h = (mode[2], scale[2]) if len(in_shape) == 4 else (0, 1.0)
    mode_w, scale_w = mode[spatial[-1]], scale[spatial[-1]]
    count = packed_elements(out_shape) // 4
    linear = int(node.attrs.get("mode", "nearest") != "nearest")
    return [Launch("resize.cl", "resize2d", [ctx.tensor(x), ctx.tensor(y), count, h, w, oh, ow, mode_h, mode_w,
                                             float(np.float32(scale_h)), float(np.float32(scale_w)), linear,
                                             nearest], (count,))]
