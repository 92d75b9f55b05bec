"""GPU kernels for 1-D and 2-D pooling: MaxPool, AveragePool and the global pools (one ``pool2d``
kernel, max or average by the ``POOL_MAX`` define).  The window geometry (pads, auto_pad,
strides, dilations, ceil_mode) is resolved on the host by ``optcli.ops.spatial.window``, the
same code the numpy reference uses."""

from __future__ import annotations

from optcli.gpu.layout import dims4, packed_elements
from optcli.gpu.ops_elementwise import data_check
from optcli.gpu.registry import Launch, epilogue_arg, fake_quant_defines, gpu_kernel
from optcli.ir import Graph, Node
from optcli.ops.spatial import window


def _check(node: Node, graph: Graph) -> str | None:
    if len([o for o in node.outputs if o]) > 1:
        return "MaxPool with the Indices output"
    reason = data_check(node, graph)
    if reason:
        return reason
    shape = graph.shape_of(node.inputs[0])
    if len(shape) not in (3, 4):
        return f"{node.op_type} over {len(shape) - 2} spatial dims (the GPU kernel pools 1-D and 2-D)"
    if node.op_type == "MaxPool" and int(node.attrs.get("storage_order", 0)):
        return "MaxPool storage_order=1"
    if node.op_type in ("MaxPool", "AveragePool"):
        try:
            window(node.attrs, shape[2:], node.attrs["kernel_shape"], bool(node.attrs.get("ceil_mode", 0)))
        except (ValueError, KeyError) as exc:
            return f"{node.op_type} window: {exc}"
    return None


@gpu_kernel(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"], check=_check)
def pool(ctx, node) -> list[Launch]:
    x, y = node.inputs[0], node.outputs[0]
    spatial = ctx.shape(x)[2:]
    _, _, h, w = dims4(ctx.shape(x))
    if node.op_type.startswith("Global"):
        geom = [h, w, 1, 1, 0, 0, 0, 0, 1, 1]
        oh = ow = 1
        include_pad = 0
    else:
        win = window(node.attrs, spatial, node.attrs["kernel_shape"], bool(node.attrs.get("ceil_mode", 0)))
        # a 1-D pool is a 2-D one with a 1-row window (rank 3 packs as N, C, 1, L)
        lift = (lambda v, one: list(v)) if len(spatial) == 2 else (lambda v, one: [one, *v])
        oh, ow = lift(win.out, 1)
        geom = [*lift(win.kernel, 1), *lift(win.strides, 1), *lift(win.pad_begin, 0), *lift(win.declared_end, 0),
                *lift(win.dilations, 1)]
        include_pad = int(node.attrs.get("count_include_pad", 0))
    count = packed_elements(ctx.shape(y)) // 4
    return [Launch("pool.cl", "pool2d", [ctx.tensor(x), ctx.tensor(y), count, h, w, oh, ow, *geom, include_pad,
                                        epilogue_arg(node.attrs)],
                   (count,), {"POOL_MAX": int(node.op_type.endswith("MaxPool")), **fake_quant_defines(node.attrs)})]
