"""Remove nodes whose results never reach a graph output, then unused initializers.

Other passes leave such nodes behind (a folded branch, a Dropout mask, a Shape whose reader was
folded away) and exported models carry some of their own; they would otherwise be planned,
allocated and run for nothing.
"""

from __future__ import annotations

from typing import Any

from optcli.ir import Graph
from optcli.passes._helpers.graph_queries import drop_values, implicit_inputs, remove_unused_initializers

NAME = "remove_dead_nodes"
DESCRIPTION = "remove nodes that do not contribute to any graph output, then unused initializers"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    producers = graph.producers()
    live_values: set[str] = set()
    live_nodes: set[int] = set()
    pending = [v.name for v in graph.outputs]
    while pending:
        name = pending.pop()
        if name in live_values:
            continue
        live_values.add(name)
        node = producers.get(name)
        if node is not None and id(node) not in live_nodes:
            live_nodes.add(id(node))
            pending.extend(i for i in node.inputs if i)
            pending.extend(implicit_inputs(node))
    dead = [n for n in graph.nodes if id(n) not in live_nodes]
    graph.nodes = [n for n in graph.nodes if id(n) in live_nodes]
    for node in dead:
        drop_values(graph, *(o for o in node.outputs if o not in live_values))
    return {"nodes": len(dead), "initializers": remove_unused_initializers(graph)}
