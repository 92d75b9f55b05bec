"""Weight compression: choose how each weight is stored in the `.nb` (the file, not the math).

With ``--quant_model --quant_type=QUANT_INT8`` (or ``QUANT_INT16``) the weights of Conv,
ConvTranspose, Gemm, MatMul and FullyConnected are stored as integers, symmetric, one scale per
output channel; with ``--enable_fp16`` every float weight is stored as half.  The loader turns
them back into float32 once (``optcli/ops/weight_quant.py``), so kernels and targets are unchanged: this
shrinks what an app downloads (about 4x for int8, 2x for int16 and fp16) at the cost of the
rounding error, which ``opt --verify`` measures.

The choice is recorded in ``ctx.results.weight_formats``: {initializer name: (scheme, axis)}.
"""

from __future__ import annotations

from optcli.ir import Graph
from optcli.passes.base import PassContext

NAME = "compress_weights"
DESCRIPTION = "store weights as int8/int16 per output channel or as fp16 (--quant_model, --enable_fp16)"

MIN_ELEMENTS = 64  # smaller tensors (biases, scales) gain nothing worth their rounding error

# op -> (weight input index, output-channel axis of that weight)
_WEIGHT_AXIS = {
    ("", "Conv"): (1, 0),
    ("", "ConvTranspose"): (1, 1),
    ("", "MatMul"): (1, -1),
    ("optcli", "FullyConnected"): (1, -1),
}


def _gemm_axis(node) -> tuple[int, int]:
    return 1, (0 if int(node.attrs.get("transB", 0)) else -1)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    scheme = ctx.weight_scheme  # "int8", "int16", "fp16" or None
    # Weights that arrived quantized (fold_qdq) keep their own integers and scales.
    formats: dict[str, tuple] = {k: v for k, v in ctx.results.weight_hints.items()
                                 if k in graph.initializers}
    if not scheme:
        ctx.results.weight_formats = formats
        return {"weights": len(formats)} if formats else {}
    readers = graph.consumers()
    if scheme == "fp16":
        for name, w in graph.initializers.items():
            if w.dtype.name == "float32" and w.size >= MIN_ELEMENTS:
                formats.setdefault(name, ("fp16", 0))
    else:
        for node in graph.nodes:
            key = (node.domain, node.op_type)
            spec = _gemm_axis(node) if key == ("", "Gemm") else _WEIGHT_AXIS.get(key)
            if spec is None or len(node.inputs) <= spec[0]:
                continue
            name = node.inputs[spec[0]]
            w = graph.const(name)
            if name in formats or w is None or w.dtype.name != "float32" or w.size < MIN_ELEMENTS or w.ndim < 2:
                continue
            # A weight shared with a reader that is not a weight slot keeps float: one format per tensor.
            if any(r is not node and r.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul", "FullyConnected")
                   for r in readers.get(name, [])):
                continue
            formats[name] = (scheme, spec[1] % w.ndim)
    ctx.results.weight_formats = formats
    return {"weights": len(formats)}
