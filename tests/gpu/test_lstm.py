"""LSTM GPU kernel (one launch per time step) against the ONNX reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.layout import pack, packed_elements, unpack
from optcli.gpu.registry import gpu_kernels_for
from optcli.runtime.opencl.device import ClLaunchContext, cl, packed_nbytes
from tests.gpu.harness import check_gpu, device, one_node_graph, reference
from tests.helpers import assert_close

RNG = np.random.default_rng(7)
SEQ, BATCH, INPUT, HIDDEN = 4, 2, 3, 5


def _weights(with_bias=True):
    c = {"W": RNG.uniform(-0.5, 0.5, (1, 4 * HIDDEN, INPUT)).astype(np.float32),
         "R": RNG.uniform(-0.5, 0.5, (1, 4 * HIDDEN, HIDDEN)).astype(np.float32)}
    if with_bias:
        c["B"] = RNG.uniform(-0.5, 0.5, (1, 8 * HIDDEN)).astype(np.float32)
    return c


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_lstm_all_outputs(precision):
    x = RNG.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    h0 = RNG.standard_normal((1, BATCH, HIDDEN)).astype(np.float32)
    c0 = RNG.standard_normal((1, BATCH, HIDDEN)).astype(np.float32)
    inputs = {"x": x, "h0": h0, "c0": c0}
    graph, node = one_node_graph("LSTM", inputs, _weights(), {"hidden_size": HIDDEN}, n_outputs=3,
                                 input_names=["x", "W", "R", "B", "", "h0", "c0"])
    check_gpu(graph, node, inputs, precision)


def test_lstm_no_bias_no_state_batch5():
    x = RNG.standard_normal((3, 5, INPUT)).astype(np.float32)
    graph, node = one_node_graph("LSTM", {"x": x}, _weights(False), {"hidden_size": HIDDEN}, n_outputs=1,
                                 input_names=["x", "W", "R"])
    check_gpu(graph, node, {"x": x})


def test_lstm_only_last_state():
    """Y absent (the kernel writes no sequence), initial_h constant: Y_h alone."""
    x = RNG.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    consts = {**_weights(), "h0": RNG.standard_normal((1, BATCH, HIDDEN)).astype(np.float32)}
    graph, node = one_node_graph("LSTM", {"x": x}, consts, {"hidden_size": HIDDEN}, n_outputs=2,
                                 input_names=["x", "W", "R", "B", "", "h0"])
    expected = reference(graph, node, {"x": x})[1]
    node.outputs[0] = ""
    dev = device()
    buffers = {"x": cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=pack(x)),
               "y1": cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, packed_nbytes(expected.shape, "fp32"))}
    ctx = ClLaunchContext(dev, {"x": x.shape, "y1": expected.shape}, dict(graph.initializers), buffers)
    for launch in gpu_kernels_for("LSTM")[0].launch(ctx, node):
        ctx.bind(launch, node.name).enqueue(dev.queue)
    host = np.empty(packed_elements(expected.shape), np.float32)
    cl.enqueue_copy(dev.queue, host, buffers["y1"])
    dev.queue.finish()
    assert_close(unpack(host, expected.shape), expected)


def test_rejects():
    x = RNG.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    check = gpu_kernels_for("LSTM")[0].check
    graph, node = one_node_graph("LSTM", {"x": x}, _weights(), {"hidden_size": HIDDEN, "direction": "bidirectional"},
                                 n_outputs=3)
    assert "direction" in check(node, graph)
    graph, node = one_node_graph("LSTM", {"x": x, "W": _weights()["W"]}, {"R": _weights()["R"]},
                                 {"hidden_size": HIDDEN}, n_outputs=3)
    assert "W must be a constant" in check(node, graph)
