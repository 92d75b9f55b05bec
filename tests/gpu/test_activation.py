"""Stand-alone activations on the GPU against the numpy reference, fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.harness import check_gpu, one_node_graph

X = np.random.default_rng(0).standard_normal((2, 6, 5, 7)).astype(np.float32) * 3


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op, attrs, consts", [
    ("Relu", {}, {}), ("Sigmoid", {}, {}), ("Tanh", {}, {}), ("HardSwish", {}, {}),
    ("LeakyRelu", {"alpha": 0.1}, {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}),
    ("Clip", {}, {"lo": np.array(-1.0, np.float32), "hi": np.array(6.0, np.float32)}),
])
def test_activation(op, attrs, consts, precision):
    graph, node = one_node_graph(op, {"x": X}, consts, attrs)
    check_gpu(graph, node, {"x": X}, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_swish_and_low_rank(precision):
    x = X.reshape(2, 30, 7)[:, :, 0].copy()  # rank 2: packed as N, C
    graph, node = one_node_graph("Swish", {"x": x}, domain="optcli")
    check_gpu(graph, node, {"x": x}, precision)


def test_padding_channels_stay_zero():
    """Sigmoid(0) = 0.5: the kernel must still write zeros into the padding lanes (5 channels -> 3 pads)."""
    from optcli.gpu.layout import pack
    from optcli.gpu.registry import gpu_kernels_for
    from optcli.runtime.opencl.device import ClLaunchContext, cl
    from tests.gpu.harness import device

    x = X[:, :5]
    graph, node = one_node_graph("Sigmoid", {"x": x})
    dev = device()
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    buffers = {"x": cl.Buffer(dev.context, flags, hostbuf=pack(x)),
               "y0": cl.Buffer(dev.context, flags, hostbuf=np.full(pack(x).size, 7.0, np.float32))}
    ctx = ClLaunchContext(dev, {"x": x.shape, "y0": x.shape}, {}, buffers)
    for launch in gpu_kernels_for("Sigmoid")[0].launch(ctx, node):
        ctx.bind(launch, "sigmoid").enqueue(dev.queue)
    raw = np.empty(pack(x).size, np.float32)
    cl.enqueue_copy(dev.queue, raw, buffers["y0"])
    lanes = raw.reshape(2, 2, 5, 7, 4)
    assert np.all(lanes[:, 1, :, :, 1:] == 0.0)
