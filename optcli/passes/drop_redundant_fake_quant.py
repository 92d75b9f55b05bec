"""Drop the FakeQuant steps of a pre-quantized model that requantize values already on their grid.

QDQ exporters wrap ops that only move values (Pad, MaxPool, Reshape, Transpose...) in their own
QuantizeLinear/DequantizeLinear pairs with the input's parameters; after ``fold_qdq`` these are
FakeQuants that give back their input bit for bit.  Removing them before the fusions lets a Pad
meet the Conv it feeds (``fold_pad_into_conv``).  ``fuse_fake_quant`` does the same again later,
with the grids the fused epilogues create.
"""

from __future__ import annotations

from typing import Any

from optcli.ir import Graph
from optcli.passes.fuse_fake_quant import walk

NAME = "drop_redundant_fake_quant"
DESCRIPTION = "remove FakeQuant steps whose input is already on their quantization grid"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    return walk(graph, fuse=False)
