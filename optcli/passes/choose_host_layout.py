"""Host layout: run the host plan's conv regions in the channel-blocked layout (NCHWc).

After kernel selection, each host node whose target has a kernel of the blocked layout for it
(``Target.blocked_kernel``: convs, pools, the element-wise ops between them; ``ops/blocked.py``)
is a candidate; candidates that pass values to each other form a region.  A region with at least
``MIN_CONVS`` convs runs blocked: its nodes take their blocked kernels, and the two conversions
go only at its borders, as ``insert_copies`` does for the GPU: ``ToBlocked`` where a value made
outside (a graph input, a plain step's output) is read inside, ``FromBlocked`` where a value
made inside is read outside or is a graph output.  A conv that starts a region (a stem) reads
its plain input itself.  Inside a region nothing converts.

A blocked value keeps its logical NCHW shape in the plan (the runtime derives the blocked
buffer from it and the block width it picks when the plan runs), so nothing downstream of this
pass changes but the names: region values become ``name@nchwc``; readers outside still read
``name``.
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN, Graph, Node, Value
from optcli.ops import get_kernel
from optcli.ops.blocked import LAYOUT
from optcli.ops.shape_functions import fixed
from optcli.passes.base import PassContext

NAME = "choose_host_layout"
DESCRIPTION = "run the host's conv regions in the channel-blocked layout (NCHWc), converting only at their borders"
MIN_CONVS = 2  # a region of one conv would pay two conversions for it
CONVS_PER_BORDER = 3  # and one whose convs are few for its borders pays more in conversions than it saves


def _blocked_value(graph: Graph, name: str) -> bool:
    """A value a region can hold blocked: a float32 image [N, C, H, W] whose C is fixed, so the
    border knows how many channels to give back."""
    shape = graph.shape_of(name)
    return (graph.dtype_of(name) == "float32" and shape is not None and len(shape) == 4
            and fixed(shape[1]) is not None)


def _regions(graph: Graph, candidates: dict[int, Node]) -> list[list[Node]]:
    """Connected groups of candidates (linked by the values they pass), in graph order."""
    parent = {k: k for k in candidates}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    producers = graph.producers()
    for node in candidates.values():
        for name in node.inputs:
            p = producers.get(name) if name else None
            if p is not None and id(p) in candidates:
                parent[root(id(p))] = root(id(node))
    groups: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if id(node) in candidates:
            groups.setdefault(root(id(node)), []).append(node)
    return list(groups.values())


def _worth_it(graph: Graph, group: list[Node], readers: dict[str, list[Node]]) -> bool:
    """Whether a region's convs pay for its conversions: MIN_CONVS convs at least, and
    CONVS_PER_BORDER per border value (read in from outside, or out to a plain reader or the
    graph's outputs).  Measured (docs/design.md): MobileNets, EfficientNet and the mediapipe
    models have one or two borders in all; BlazeFace's channel Pads, MixNet's Split/Concat and
    RegNet's grouped convs cut theirs into pieces of two or three convs a border, which ran
    slower blocked than plain."""
    convs = sum(n.op_type == "Conv" for n in group)
    if convs < MIN_CONVS:
        return False
    inside = {id(n) for n in group}
    made = {o for n in group for o in n.outputs if o}
    reads_in = {name for n in group for name in n.inputs
                if name and name not in made and name not in graph.initializers}
    outputs = set(graph.output_names())
    reads_out = {o for o in made if o in outputs or any(id(r) not in inside for r in readers.get(o, []))}
    return convs >= CONVS_PER_BORDER * (len(reads_in) + len(reads_out))


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    targets = {t.name: t for t in ctx.targets}
    candidates: dict[int, Node] = {}
    for node in graph.nodes:
        target = targets.get(node.target)
        if target is None or target.device != "cpu" or not node.outputs:
            continue
        if all(not o or _blocked_value(graph, o) for o in node.outputs) and target.blocked_kernel(node, graph):
            candidates[id(node)] = node
    readers = graph.consumers()
    kept = [group for group in _regions(graph, candidates) if _worth_it(graph, group, readers)]
    region = [n for group in kept for n in group]
    counts = {"regions": len(kept), "blocked_steps": len(region), "to_blocked": 0, "from_blocked": 0}
    if not region:
        return counts
    inside = {id(n) for n in region}
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    producers, outputs = graph.producers(), graph.output_names()
    inserted_after: dict[int, list[Node]] = {}  # graph position (-1: before everything) -> new nodes

    def value_like(name: str, new: str) -> None:
        v = graph.values.get(name) or Value(name, graph.dtype_of(name) or "float32", graph.shape_of(name))
        graph.values[new] = Value(new, v.dtype, v.shape)

    # Choose each region node's kernel while every name is still the plain one (the kernels'
    # predicates read the graph's shapes): a kernel that reads the inputs coming from outside
    # plain where there is one (the stem convs), else the blocked one, fed by a ToBlocked.
    chosen: dict[int, str] = {}
    for node in region:
        target = targets[node.target]
        plain = frozenset(k for k, name in enumerate(node.inputs)
                          if name and name not in graph.initializers and id(producers.get(name)) not in inside)
        chosen[id(node)] = target.blocked_kernel(node, graph, plain) or target.blocked_kernel(node, graph)

    blocked: dict[str, str] = {}  # plain name -> its blocked copy
    for node in region:
        for k, name in enumerate(node.outputs):
            if name:
                blocked[name] = node.outputs[k] = graph.unique_name(f"{name}@{LAYOUT}")
                value_like(name, blocked[name])
                outside = [r for r in readers.get(name, []) if id(r) not in inside]
                if outside or name in outputs:
                    channels = int(fixed(graph.shape_of(name)[1]))
                    inserted_after.setdefault(index[id(node)], []).append(
                        Node("FromBlocked", [blocked[name]], [name], {"channels": channels},
                             graph.unique_name(f"from_blocked_{name}"), OPTCLI_DOMAIN, node.target,
                             kernel=f"{OPTCLI_DOMAIN}.FromBlocked.default"))
                    counts["from_blocked"] += 1

    for node in region:
        kern = get_kernel(chosen[id(node)])
        for k, name in enumerate(node.inputs):
            if k not in kern.blocked_inputs:
                continue
            if name not in blocked:  # made outside the region: converted once, after its producer
                blocked[name] = graph.unique_name(f"{name}@{LAYOUT}")
                value_like(name, blocked[name])
                producer = producers.get(name)
                inserted_after.setdefault(index[id(producer)] if producer is not None else -1, []).append(
                    Node("ToBlocked", [name], [blocked[name]], {}, graph.unique_name(f"to_blocked_{name}"),
                         OPTCLI_DOMAIN, node.target, kernel=f"{OPTCLI_DOMAIN}.ToBlocked.default"))
                counts["to_blocked"] += 1
            node.inputs[k] = blocked[name]
        node.kernel = kern.id

    ordered: list[Node] = list(inserted_after.get(-1, []))
    for i, node in enumerate(graph.nodes):
        ordered.append(node)
        ordered.extend(inserted_after.get(i, []))
    graph.nodes = ordered
    return counts
