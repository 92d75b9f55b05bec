"""Run one IR node through a GPU kernel on the session's OpenCL device (PoCL in CI).

Inputs are packed (NC4HW4) and uploaded, the kernel's launches are bound and enqueued, and the
outputs read back and unpacked, so a kernel can be checked against the numpy reference without
the rest of the runtime.  The device is the runtime's own (``ClDevice.shared``: the first that
passes the smoke test); ``tests/conftest.py`` skips these tests where there is none.  Every launch
bound in ``tests/gpu`` is recorded in ``LAUNCHED`` (``tests/gpu/conftest.py``) for the coverage
guard in ``test_kernel_coverage.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optcli.frontend.onnx_reader import read_model
from optcli.gpu.layout import pack, packed_elements, unpack
from optcli.gpu.registry import get_gpu_kernel, gpu_kernels_for
from optcli.ir import Graph, Node
from optcli.ops.evaluate import evaluate_node
from optcli.runtime.opencl.device import ClDevice, ClLaunchContext, cl, packed_nbytes

# (kernel id, kernel source, entry, precision) of every launch bound in tests/gpu ("" for the id
# where a test binds launches itself without naming the kernel)
LAUNCHED: set[tuple[str, str, str, str]] = set()


def device() -> ClDevice:
    """The session's usable OpenCL device, the one ``optcli.load`` uses."""
    return ClDevice.shared()


def one_node_graph(op_type: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
                   attrs: dict | None = None, n_outputs: int = 1, domain: str = "", opset: int = 17,
                   input_names: list[str] | None = None) -> tuple[Graph, Node]:
    """A one-node IR graph with static shapes (via ONNX shape inference when the op is ONNX)."""
    consts = consts or {}
    names = input_names if input_names is not None else [*inputs, *consts]
    outs = [f"y{i}" for i in range(n_outputs)]
    if domain:
        node = Node(op_type, list(names), outs, dict(attrs or {}), "n0", domain)
        graph = Graph("g", [node], [], [], dict(consts), {}, {"": opset})
        from optcli.ir import Value
        graph.inputs = [Value(k, str(v.dtype), tuple(v.shape)) for k, v in inputs.items()]
        env = {**inputs, **consts}
        result = evaluate_node(node, [env[n] if n else None for n in names], graph.opsets)
        for o, r in zip(outs, result):
            graph.values[o] = Value(o, str(r.dtype), tuple(r.shape))
        for v in graph.inputs:
            graph.values[v.name] = v
        graph.outputs = [graph.values[o] for o in outs]
        return graph, node
    proto = helper.make_node(op_type, names, outs, **(attrs or {}))
    g = helper.make_graph(
        [proto], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    graph = read_model(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))
    return graph, graph.nodes[0]


def run_gpu(graph: Graph, node: Node, inputs: dict[str, np.ndarray], precision: str = "fp32",
            kernel_id: str | None = None) -> list[np.ndarray]:
    kern = get_gpu_kernel(kernel_id) if kernel_id else next(
        (k for k in gpu_kernels_for(node.op_type, node.domain) if k.check(node, graph) is None), None)
    if kern is None:
        raise LookupError(f"no GPU kernel applies to {node.describe()}")
    reason = kern.check(node, graph)
    assert reason is None, f"{kern.id} does not apply: {reason}"
    dev = device()
    storage = np.float16 if precision == "fp16" else np.float32
    buffers = {}
    shapes = {}
    for name in [*node.inputs, *node.outputs]:
        if name and name not in graph.initializers:
            shapes[name] = tuple(graph.shape_of(name))
    for name, x in inputs.items():
        buffers[name] = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                                  hostbuf=pack(x, storage))
    for name in node.outputs:
        if name:
            buffers[name] = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, packed_nbytes(shapes[name], precision))
    ctx = ClLaunchContext(dev, shapes, dict(graph.initializers), buffers, precision)
    ctx.namespace = kern.id  # as OpenClSteps does: names the kernel in LAUNCHED
    for launch in kern.launch(ctx, node):
        ctx.bind(launch, node.name).enqueue(dev.queue)
    results = []
    for name in node.outputs:
        host = np.empty(packed_nbytes(shapes[name], precision) // np.dtype(storage).itemsize, storage)
        cl.enqueue_copy(dev.queue, host, buffers[name])
        results.append(unpack(host[: packed_elements(shapes[name])], shapes[name]))
    dev.queue.finish()
    return results


def reference(graph: Graph, node: Node, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env = {**graph.initializers, **inputs}
    return evaluate_node(node, [env[n] if n else None for n in node.inputs], graph.opsets)


def check_gpu(graph: Graph, node: Node, inputs: dict[str, np.ndarray], precision: str = "fp32",
              kernel_id: str | None = None) -> None:
    """GPU result == numpy reference within the precision's tolerance."""
    from tests.helpers import assert_close

    expected = reference(graph, node, inputs)
    actual = run_gpu(graph, node, inputs, precision, kernel_id)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, precision, what=f"{kernel_id or node.op_type} output {i} ({precision})")


__all__ = ["LAUNCHED", "device", "one_node_graph", "run_gpu", "reference", "check_gpu", "onnx"]
