"""Program builds are bounded (issue 12): the programs a file can make the runtime build are the
finite set of ``optcli.gpu.variants``.  A fused activation's alpha / beta (and a fused
FakeQuant's parameters) are a kernel argument, not a define: 100 steps differing only in
``activation_alpha`` build one program, and each still gets its own alpha."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.gpu.layout import pack, packed_elements, unpack
from optcli.gpu.registry import get_gpu_kernel
from optcli.runtime.opencl.device import ClDevice, ClLaunchContext, cl
from optcli.runtime.opencl.program_cache import ProgramCache
from tests.gpu.harness import device, reference
from tests.gpu.test_conv import conv_case, ir_graph
from tests.helpers import assert_close

ALPHAS = [0.01 * (i + 1) for i in range(100)]


def test_a_hundred_alphas_build_one_program(tmp_path):
    dev = ClDevice(device().device, cache=ProgramCache(tmp_path))  # its own program table and disk cache
    kern = get_gpu_kernel("gpu.onnx.Conv.1x1")
    x, consts, _ = conv_case((1, 6, 5, 5), 7, (1, 1))
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    results = {}
    for alpha in ALPHAS:
        graph, node = ir_graph("Conv", {"x": x}, consts, {"activation": "leaky_relu", "activation_alpha": alpha})
        shapes = {"x": x.shape, "y0": tuple(graph.shape_of("y0"))}
        buffers = {"x": cl.Buffer(dev.context, flags, hostbuf=pack(x)),
                   "y0": cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, packed_elements(shapes["y0"]) * 4)}
        ctx = ClLaunchContext(dev, shapes, dict(graph.initializers), buffers)
        ctx.namespace = kern.id
        for launch in kern.launch(ctx, node):
            assert all(isinstance(v, int) for v in launch.defines.values()), launch.defines
            ctx.bind(launch, node.name).enqueue(dev.queue)
        if alpha in (ALPHAS[0], ALPHAS[-1]):
            host = np.empty(packed_elements(shapes["y0"]), np.float32)
            cl.enqueue_copy(dev.queue, host, buffers["y0"])
            results[alpha] = (unpack(host, shapes["y0"]), reference(graph, node, {"x": x})[0])
    dev.queue.finish()
    assert dev.builds == 1 and len(dev._programs) == 1, f"{dev.builds} builds, {len(dev._programs)} programs"
    for alpha, (got, want) in results.items():  # each launch kept its own alpha
        assert_close(got, want, "fp32", what=f"leaky_relu alpha {alpha}")
    assert not np.allclose(results[ALPHAS[0]][0], results[ALPHAS[-1]][0])


def _chain_model(alphas: list[float]) -> onnx.ModelProto:
    """x -> (Conv 1x1 -> LeakyRelu(alpha_i)) x len(alphas): fuses into one Conv step per alpha."""
    rng = np.random.default_rng(5)
    nodes, inits, prev = [], [], "x"
    for i, alpha in enumerate(alphas):
        inits += [numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"]),
                  helper.make_node("LeakyRelu", [f"c{i}"], [f"r{i}"], alpha=alpha)]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "alphas", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_file_of_a_hundred_alphas_loads_with_one_conv_program(monkeypatch):
    """The issue's file: 100 steps differing only in activation_alpha (76 s and 100 programs at
    load before); through opt and load, every Conv step asks for the same program."""
    model = _chain_model(ALPHAS)
    result = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"})
    convs = [s for s in result.report["steps"] if s["op"] == "Conv"]
    assert len(convs) == len(ALPHAS) and all(s["target"] == "opencl" for s in convs)
    asked: set[tuple] = set()
    program = ClDevice.program

    def recording(self, source, defines):
        asked.add((source, tuple(sorted(defines.items()))))
        return program(self, source, defines)

    monkeypatch.setattr(ClDevice, "program", recording)
    predictor = optcli.load(result.data, require_gpu=True)
    conv_programs = {key for key in asked if key[0] == "conv.cl"}
    assert len(conv_programs) == 1, sorted(conv_programs)
    assert len(asked) <= 3, sorted(asked)  # the conv, and the layout kernels at the borders
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)}
    want = optcli.load(result.data, targets=["arm"]).run(feeds)
    for name, value in predictor.run(feeds).items():
        assert_close(value, want[name], "fp32", what=f"{name} of the alpha chain on opencl")
