"""Layout conversions and host copies: the steps the copy-insertion pass puts at target borders.

``optcli.Upload`` / ``optcli.Download`` copy a plain NCHW tensor between host memory and a
device buffer (the runtime does these with one enqueued copy each; they are the only host
syncs of a run).  ``optcli.Pack`` / ``optcli.Unpack`` convert on the device between that plain
buffer and the packed NC4HW4 layout every other GPU kernel reads and writes.
"""

from __future__ import annotations

from optcli.gpu.layout import c4, dims4
from optcli.gpu.registry import Launch, gpu_kernel
from optcli.ir import OPTCLI_DOMAIN

TRANSFER_OPS = ("Upload", "Download")  # executed by the runtime as buffer copies, not kernels


def _grid(shape) -> tuple[tuple[int, int, int, int], tuple[int, int, int]]:
    n, c, h, w = dims4(shape)
    return (n, c, h, w), (w, h, n * c4(c))


@gpu_kernel("Pack", domain=OPTCLI_DOMAIN)
def pack(ctx, node) -> list[Launch]:
    (n, c, h, w), grid = _grid(ctx.shape(node.inputs[0]))
    return [Launch("layout.cl", "pack_nc4hw4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]),
                                                 n, c, h, w], grid)]


@gpu_kernel("Unpack", domain=OPTCLI_DOMAIN)
def unpack(ctx, node) -> list[Launch]:
    (n, c, h, w), grid = _grid(ctx.shape(node.outputs[0]))
    return [Launch("layout.cl", "unpack_nc4hw4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]),
                                                   n, c, h, w], grid)]


def _transfer(ctx, node) -> list[Launch]:
    raise RuntimeError(f"{node.op_type} is a buffer copy the runtime performs, not a kernel")


for _op in TRANSFER_OPS:
    gpu_kernel(_op, domain=OPTCLI_DOMAIN, variant="copy")(_transfer)
