"""GPU kernels for stand-alone activations: the element-wise ``map4`` kernel (identity
``UNARY_OP``) with the same ``activate`` epilogue the fused kernels use, selected by a define.
``map4`` zeroes the padding channels, which activations such as Sigmoid would otherwise fill."""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.gpu.dialect import ACTIVATION_CODES
from optcli.gpu.layout import dims4, packed_elements
from optcli.gpu.registry import Launch, common_check, gpu_kernel
from optcli.ir import Graph, Node

# op -> (epilogue name, alpha, beta) from the node's attributes
_SIMPLE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish"}


def _epilogue_of(node: Any, consts) -> tuple[str, float, float] | None:
    if node.domain == "optcli" and node.op_type == "Swish":
        return "swish", 0.0, 0.0
    if node.op_type in _SIMPLE:
        return _SIMPLE[node.op_type], 0.0, 0.0
    if node.op_type == "LeakyRelu":
        return "leaky_relu", float(node.attrs.get("alpha", 0.01)), 0.0
    if node.op_type == "HardSigmoid":
        return "hard_sigmoid", float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    if node.op_type == "Clip":
        bounds = []
        for index, attr, default in ((1, "min", -np.inf), (2, "max", np.inf)):
            name = node.inputs[index] if index < len(node.inputs) else ""
            if name:
                value = consts(name)
                if value is None or value.size != 1:
                    return None
                bounds.append(float(value.reshape(-1)[0]))
            else:
                bounds.append(float(node.attrs.get(attr, default)))
        return "clip", bounds[0], bounds[1]
    return None


def _check(node: Node, graph: Graph) -> str | None:
    if _epilogue_of(node, graph.const) is None:
        return "Clip bounds must be constants"
    return common_check(node, graph)


@gpu_kernel(["Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip"], check=_check)
def unary_activation(ctx, node) -> list[Launch]:
    name, alpha, beta = _epilogue_of(node, ctx.const)
    shape = ctx.shape(node.outputs[0])
    _, channels, h, w = dims4(shape)
    count = packed_elements(shape) // 4
    return [Launch("elementwise.cl", "map4", [ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0]), count,
                                              channels, h * w], (count,),
                   {"UNARY_OP": 0, "ACTIVATION": ACTIVATION_CODES[name], "ACT_ALPHA": alpha, "ACT_BETA": beta})]


gpu_kernel("Swish", domain="optcli", check=_check)(unary_activation)
