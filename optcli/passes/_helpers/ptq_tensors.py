"""Which activations full int8 PTQ quantizes, and which of them must share one scale.

``quantize_int8`` writes its result as QDQ chains (QuantizeLinear -> DequantizeLinear around each
quantized tensor, as onnxruntime's ``quantize_static`` does) so that the passes which lower such
chains to integer steps on the host (``fuse_qdq_conv``, ``fuse_qdq_add``, ``fuse_qdq_movement``,
``fuse_qdq_lookup``, ``fuse_qdq_se``) serve optcli's own PTQ as they serve onnxruntime's, and the
GPU gets the same quantization as a float view (``fold_qdq``).  An integer step needs its inputs AND
its output quantized; a quantized tensor whose producer or readers stay float costs a FakeQuant step
and adds error for nothing.  So the tensors are chosen from the ops that have an integer step:

* the seeds: the activation input of every quantized op (Conv, Gemm, MatMul, ...) and the output of
  those with an integer step (2-D Conv, MatMul and Gemm), taken after a MatMul's bias Add and a following
  Relu / Clip, which the step absorbs;
* grown through the ops that have an integer step when one of their inputs or outputs is quantized:
  two-operand Adds of one shape, the squeeze-excite Mul and GlobalAveragePool, element-wise functions
  of one tensor (byte tables), and the ops that only move bytes (MaxPool, Pad, Reshape, Concat, Split...);
* never a graph output (the model's outputs stay float: quantizing the logits adds error and saves
  nothing), a tensor a control-flow body reads, a non-float tensor, or an input of an op kept in
  float (``--precision=auto``).

The ops that only move bytes run on the 8-bit tensor only when their input and output share one
scale and zero point (``fuse_qdq_movement``): their tensors form groups, calibrated as one range.
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN, Graph, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import is_std

# ops whose outputs are copies of their (data) inputs: one group, one scale (fuse_qdq_movement's list)
_MOVERS = {"MaxPool": (0,), "Pad": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
           "Transpose": (0,), "Slice": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,), "Resize": (0,),
           "Split": (0,), "Concat": None}
# element-wise functions of one tensor: fuse_qdq_lookup turns them into byte tables
_UNARY = frozenset({"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu", "Selu",
                    "Softplus", "Erf", "Abs", "Neg", "Add", "Sub", "Mul", "Div", "Min", "Max", "Gelu"})
_OPTCLI_UNARY = frozenset({"Swish"})  # optcli's fusions of exporters' patterns (x * Sigmoid(x))
# the activations a conv's float epilogue takes (activation_codes.ACTIVATIONS; optcli.Swish beside them)
_EPILOGUE = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu"})
# compute ops whose integer step writes a quantized output (the others read a quantized input only), by the rank
# of the weight the step takes: QConv (2-D convs: fuse_qdq_conv) and QMatMul (fuse_qdq_matmul), whose chain may
# hold a bias Add after a MatMul.  A 1-D conv's output quantized would only cost a FakeQuant.
INTEGER_OUTPUT_OPS = {"Conv": 4, "MatMul": 2, "Gemm": 2}


class _Union:
    """Union-find over tensor names: the groups that share one quantization."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, a: str) -> str:
        self.parent.setdefault(a, a)
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)  # the smaller name leads: deterministic


def _activation_after(graph: Graph, consumers: dict, name: str, absorbed: set[int], epilogues: bool) -> str:
    """``name``, or the output of the activation that is its only reader: a Relu / Clip, which the integer step
    absorbs; with ``epilogues`` (GPU plans) any activation a float kernel's epilogue takes.  It is noted in
    ``absorbed``, and the tensor between the two stays float and unquantized."""
    act = graph_queries.sole_consumer(graph, consumers, name)
    clamp = (is_std(act, "Relu") or is_std(act, "Clip")) and all(
        graph.const(i) is not None for i in act.inputs[1:] if i)
    fused = epilogues and act is not None and act.proto is None and len(_dynamic(graph, act)) == 1 and (
        (act.domain in ("", "ai.onnx") and act.op_type in _EPILOGUE) or
        (act.domain == OPTCLI_DOMAIN and act.op_type in _OPTCLI_UNARY))
    if clamp or fused:
        absorbed.add(id(act))
        return act.outputs[0]
    return name


def _bias_after(graph: Graph, consumers: dict, matmul: Node) -> str:
    """A MatMul's output, or that of the Add of a constant bias [M] that is its only reader (the QMatMul
    step takes it: exporters write a dense layer as MatMul + Add)."""
    name = matmul.outputs[0]
    add = graph_queries.sole_consumer(graph, consumers, name)
    if not is_std(add, "Add") or len(add.inputs) != 2:
        return name
    other = add.input(1) if add.input(0) == name else add.input(0)
    bias, w = graph.const(other), graph.const(matmul.input(1))
    return add.outputs[0] if bias is not None and w is not None and bias.shape == (w.shape[-1],) else name


def _dynamic(graph: Graph, node: Node) -> list[str]:
    return [i for i in node.inputs if i and graph.const(i) is None]


def _is_unary(graph: Graph, node: Node) -> bool:
    """An element-wise function of one tensor: one dynamic input, the others one-element constants."""
    ours = node.domain == OPTCLI_DOMAIN and node.op_type in _OPTCLI_UNARY and node.proto is None
    if not (ours or (is_std(node, node.op_type) and node.op_type in _UNARY)) or len(_dynamic(graph, node)) != 1:
        return False
    return all(graph.const(i).size == 1 for i in node.inputs if i and graph.const(i) is not None)


def _is_gate_mul(graph: Graph, node: Node) -> bool:
    """The squeeze-excite Mul: a feature map [N, C, ...] times a per-channel gate [N, C, 1, ...]."""
    if not is_std(node, "Mul") or len(_dynamic(graph, node)) != 2:
        return False
    a, b = (graph_queries.static_shape(graph, i) for i in node.inputs)
    if a is None or b is None or len(a) != len(b) or len(a) < 3:
        return False
    gate = lambda s: (*s[:2], *([1] * (len(s) - 2)))  # noqa: E731
    return tuple(b) == gate(a) or tuple(a) == gate(b)


def _is_same_shape_add(graph: Graph, node: Node) -> bool:
    if not is_std(node, "Add") or len(_dynamic(graph, node)) != 2:
        return False
    a, b = (graph_queries.static_shape(graph, i) for i in node.inputs)
    return a is not None and a == b


def _data_inputs(graph: Graph, node: Node) -> list[str]:
    which = _MOVERS[node.op_type]
    names = node.inputs if which is None else [node.input(k) for k in which]
    return [i for i in names if i and graph.const(i) is None]


def choose(graph: Graph, quantized_ops: list[Node], keep_float: list[Node], for_gpu: bool = False
           ) -> tuple[list[str], dict[str, str]]:
    """(the tensors to quantize, in graph order; each one's group leader: tensors of one group share
    one scale and zero point).  ``for_gpu``: the plan has a GPU target, whose float view fuses a conv's
    activation into its epilogue (a FakeQuant between them would cost two steps) and has no byte tables
    (growing through element-wise functions would only add FakeQuant steps)."""
    consumers = graph_queries.consumers(graph)
    forbidden = graph.output_names() | graph_queries.implicit_refs(graph)
    forbidden |= {i for n in keep_float for i in n.inputs if i}
    chosen: set[str] = set()
    absorbed: set[int] = set()  # the Relu / Clip nodes an integer step takes as its epilogue

    def take(name: str) -> bool:
        if name in chosen or name in forbidden or graph.const(name) is not None or graph.dtype_of(name) != "float32":
            return False
        chosen.add(name)
        return True

    for node in quantized_ops:
        take(node.inputs[0])
        w = graph.const(node.inputs[1])
        if INTEGER_OUTPUT_OPS.get(node.op_type) == getattr(w, "ndim", None) and len(node.outputs) == 1:
            out = _bias_after(graph, consumers, node) if node.op_type == "MatMul" else node.outputs[0]
            take(_activation_after(graph, consumers, out, absorbed, for_gpu))

    # grow through the ops with integer steps until nothing changes
    growers: list[tuple[Node, list[str], list[str], bool]] = []  # (node, data inputs, outputs, mover)
    for node in graph.nodes:
        outputs = [o for o in node.outputs if o]
        if is_std(node, "Split") and outputs:
            growers.append((node, _data_inputs(graph, node), outputs, True))
            continue
        if len(outputs) != 1:
            continue
        if is_std(node, node.op_type) and node.op_type in _MOVERS and (node.op_type != "Pad" or len(node.inputs) > 1):
            growers.append((node, _data_inputs(graph, node), outputs, True))
        elif _is_same_shape_add(graph, node) or _is_gate_mul(graph, node):
            output = _activation_after(graph, consumers, node.outputs[0], absorbed, for_gpu)
            growers.append((node, _dynamic(graph, node), [output], False))
        elif is_std(node, "GlobalAveragePool") or (_is_unary(graph, node) and not for_gpu):
            growers.append((node, _dynamic(graph, node), outputs, False))
    growers = [g for g in growers if id(g[0]) not in absorbed]
    changed = True
    while changed:
        changed = False
        for _node, inputs, outputs, _ in growers:
            if any(t in chosen for t in (*inputs, *outputs)):
                for t in (*inputs, *outputs):
                    changed |= take(t)

    groups = _Union()
    for _node, inputs, outputs, mover in growers:
        if mover:
            members = [t for t in (*inputs, *outputs) if t in chosen]
            for t in members[1:]:
                groups.join(members[0], t)
    order = [v.name for v in graph.inputs] + [o for n in graph.nodes for o in n.outputs if o]
    ordered = [t for t in dict.fromkeys(order) if t in chosen]
    return ordered, {t: groups.find(t) for t in ordered}
