"""optcli.FakeQuant (quantize to [qmin, qmax], dequantize) on the GPU against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.harness import check_gpu, one_node_graph


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("attrs", [{"scale": 0.25}, {"scale": 0.125, "zero_point": 3.0, "qmin": 0.0, "qmax": 15.0}])
def test_fake_quant(attrs, precision):
    # Values on a 1/16 grid, off the rounding ties: half stores them exactly, so storage precision
    # cannot move one across a quantization step; some fall outside [qmin, qmax] and clamp.
    x = (np.round(np.random.default_rng(4).standard_normal((2, 6, 3, 5)) * 24) / 16 + 1 / 32).astype(np.float32)
    graph, node = one_node_graph("FakeQuant", {"x": x}, attrs=attrs, domain="optcli")
    check_gpu(graph, node, {"x": x}, precision)
