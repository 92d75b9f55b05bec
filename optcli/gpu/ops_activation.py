"""GPU kernels for stand-alone activations: the element-wise ``map4`` kernel (identity
``UNARY_OP``) with the same ``activate`` epilogue the fused kernels use, selected by a define
(its alpha / beta are the kernel's EPILOGUE argument).  ``map4`` zeroes the padding channels,
which activations such as Sigmoid would otherwise fill."""

from __future__ import annotations

from optcli.activation_codes import ACTIVATION_CODES
from optcli.gpu.dialect import Epilogue
from optcli.gpu.layout import dims4, packed_elements
from optcli.gpu.registry import Launch, common_check, gpu_kernel
from optcli.ir import Graph, Node
from optcli.ops.activation import activation_as_epilogue


def _check(node: Node, graph: Graph) -> str | None:
    if activation_as_epilogue(node, graph.const) is None:
        return "Clip bounds must be constants"
    return common_check(node, graph)


@gpu_kernel(["Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip"], check=_check)
def unary_activation(ctx, node) -> list[Launch]:
    name, alpha, beta = activation_as_epilogue(node, ctx.const)
    shape = ctx.shape(node.outputs[0])
    _, channels, h, w = dims4(shape)
    count = packed_elements(shape) // 4
    return [Launch("elementwise.cl", "map4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]), count,
                                              channels, h * w, Epilogue(alpha, beta)], (count,),
                   {"UNARY_OP": 0, "ACTIVATION": ACTIVATION_CODES[name]})]


gpu_kernel("Swish", domain="optcli", check=_check)(unary_activation)
