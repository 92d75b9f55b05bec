"""Copy and layout insertion: make every crossing between host and device an explicit step.

After placement, a value produced on the host (a graph input, or the output of a host-CPU step)
and read by a GPU step gets ``Upload`` (host -> device, plain NCHW) then ``Pack`` (-> NC4HW4); a
value produced on a GPU and read on the host (or a graph output) gets ``Unpack`` then
``Download``.  GPU readers read the packed copy (``name@<target>``); host readers and graph
outputs keep the original name.  Each crossing is inserted once however many readers it has.
Constants are not copied here: GPU kernels upload the weights they need once, at load.
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN, Graph, Node, Value
from optcli.passes.base import PassContext

NAME = "insert_copies"
DESCRIPTION = "insert host<->device copies and NCHW<->NC4HW4 layout conversions at target borders"


def _device_of(ctx: PassContext) -> dict[str, str]:
    return {t.name: t.device for t in ctx.targets}


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    device = _device_of(ctx)
    gpu_nodes = [n for n in graph.nodes if device.get(n.target) == "gpu"]
    if not gpu_nodes:
        return {"uploads": 0, "downloads": 0}
    producers = graph.producers()
    on_gpu = {name for n in gpu_nodes for name in n.outputs if name}
    outputs = graph.output_names()
    uploads: dict[str, str] = {}  # host value -> packed device copy
    inserted_before: dict[int, list[Node]] = {}
    counts = {"uploads": 0, "downloads": 0}

    def value_like(name: str, new: str) -> None:
        v = graph.values.get(name) or Value(name, graph.dtype_of(name) or "float32", graph.shape_of(name))
        graph.values[new] = Value(new, v.dtype, v.shape)

    # Uploads: GPU readers of host values (graph inputs or host-step outputs, never constants).
    for node in gpu_nodes:
        for i, name in enumerate(node.inputs):
            if not name or name in graph.initializers or name in on_gpu:
                continue
            if name not in uploads:
                target = node.target
                linear, packed = graph.unique_name(f"{name}@{target}.linear"), graph.unique_name(f"{name}@{target}")
                value_like(name, linear)
                value_like(name, packed)
                steps = [Node("Upload", [name], [linear], {}, graph.unique_name(f"upload_{name}"), OPTCLI_DOMAIN,
                              target),
                         Node("Pack", [linear], [packed], {}, graph.unique_name(f"pack_{name}"), OPTCLI_DOMAIN,
                              target)]
                producer = producers.get(name)
                anchor = graph.nodes.index(producer) + 1 if producer is not None else 0
                inserted_before.setdefault(anchor, []).extend(steps)
                uploads[name] = packed
                counts["uploads"] += 1
            node.inputs[i] = uploads[name]

    # Downloads: GPU-produced values read on the host or returned as graph outputs.
    readers = graph.consumers()
    for node in gpu_nodes:
        for k, name in enumerate(node.outputs):
            if not name:
                continue
            host_readers = [r for r in readers.get(name, []) if device.get(r.target) != "gpu"]
            if not host_readers and name not in outputs:
                continue
            packed = graph.unique_name(f"{name}@{node.target}")
            linear = graph.unique_name(f"{name}@{node.target}.linear")
            value_like(name, packed)
            value_like(name, linear)
            node.outputs[k] = packed
            for r in readers.get(name, []):
                if device.get(r.target) == "gpu":
                    r.inputs = [packed if x == name else x for x in r.inputs]
            steps = [Node("Unpack", [packed], [linear], {}, graph.unique_name(f"unpack_{name}"), OPTCLI_DOMAIN,
                          node.target),
                     Node("Download", [linear], [name], {}, graph.unique_name(f"download_{name}"), OPTCLI_DOMAIN,
                          node.target)]
            inserted_before.setdefault(graph.nodes.index(node) + 1, []).extend(steps)
            counts["downloads"] += 1

    ordered: list[Node] = []
    for index, node in enumerate(graph.nodes):
        ordered.extend(inserted_before.get(index, []))
        ordered.append(node)
    ordered.extend(inserted_before.get(len(graph.nodes), []))
    graph.nodes = ordered
    return counts
