"""Load checks for the compiled bodies of If/Loop/Scan steps (format version 2, docs/nb-format.md).

``opt`` runs the cleanup and fusion passes on bodies (``passes/compile_bodies.py``), so a body in
a file may hold what onnx's checker cannot judge: ``optcli`` ops (``FullyConnected``...), the
fused epilogue attributes on standard ops (``Add`` with ``activation``), standard ops newer than
the file's opset (``Gelu`` made by fusion).  A body comes from the file, so it is untrusted like
any step: each such node is checked here as a step of the main plan is (``step_checks``: input
slots, attribute types, the epilogue's names), must be an op a body may hold whose kernel fits any
node, and is then replaced, in a copy handed to onnx's checker, by an attribute-less node of a
domain the checker does not know, so the checker still sees the body's structure (scopes, single
assignment, the standard nodes' attributes) without refusing what it has no schema for.
"""

from __future__ import annotations

import onnx

from optcli.ops.activation import QUANT_ATTR
from optcli.ops.control_flow import BODY_OPTCLI_OPS
from optcli.ops.reference import CONTROL_FLOW, attribute_values
from optcli.ops.registry import has_native_kernel, kernels_for
from optcli.plan import Step

PLACEHOLDER_DOMAIN = "optcli.checked"
EPILOGUE = ("activation", "activation_alpha", "activation_beta", QUANT_ATTR)  # as step_checks.EPILOGUE


def checked_copy(proto: bytes, opset: int, problem_of) -> tuple[bytes, str]:
    """(the node for onnx's checker, the first problem found in its bodies or "").  ``problem_of``
    is step_checks' check of one step: ``problem_of(step) -> str``."""
    node = onnx.NodeProto()
    node.ParseFromString(proto)
    if node.op_type not in CONTROL_FLOW:
        return proto, ""
    problem = _walk(node, opset, problem_of)
    return node.SerializeToString(deterministic=True), problem


def _walk(node: onnx.NodeProto, opset: int, problem_of) -> str:
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else (
            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else [])
        for body in graphs:
            for inner in body.node:
                if inner.domain == PLACEHOLDER_DOMAIN:
                    return f"in its body '{body.name[:40]}', node '{inner.name[:40]}' is in a domain no op is in"
                problem = _walk(inner, opset, problem_of) if inner.op_type in CONTROL_FLOW else ""
                if not problem and _ours(inner, opset):
                    problem = _node_problem(inner, opset, problem_of)
                    _make_placeholder(inner)
                if problem:
                    return f"in its body '{body.name[:40]}', node '{inner.name[:40]}' ({inner.op_type[:40]}): {problem}"
    return ""


def _ours(node: onnx.NodeProto, opset: int) -> bool:
    """A node only optcli can judge: its domain, an epilogue attribute, or an op newer than the opset."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain == "optcli" or any(a.name in EPILOGUE for a in node.attribute):
        return True
    if domain != "":
        return False
    import onnx.defs

    try:
        onnx.defs.get_schema(node.op_type, opset, "")
        return False
    except onnx.defs.SchemaError:
        pass
    try:  # fusion makes ops newer than a model's opset (Gelu, LayerNormalization, HardSwish)
        onnx.defs.get_schema(node.op_type, onnx.defs.onnx_opset_version(), "")
        return True
    except onnx.defs.SchemaError:
        return False  # no such op: onnx's checker says so


def _node_problem(node: onnx.NodeProto, opset: int, problem_of) -> str:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain == "optcli" and node.op_type not in BODY_OPTCLI_OPS:
        return f"op optcli.{node.op_type[:40]} cannot be in a body"
    if any(a.ref_attr_name for a in node.attribute):
        return "an attribute refers to a function's"
    if not any(k.applies is None for k in kernels_for(node.op_type, domain)) or \
            not has_native_kernel(node.op_type, domain, list(node.output)):
        return "no optcli kernel runs it"
    attrs, opaque = attribute_values(node)
    if opaque:
        return "an attribute is of a kind the op does not take"
    step = Step(node.op_type, domain, node.name, "arm", "", list(node.input), list(node.output), attrs, None)
    return problem_of(step)


def _make_placeholder(node: onnx.NodeProto) -> None:
    node.domain = PLACEHOLDER_DOMAIN
    del node.attribute[:]
