"""Every barrier-free GPU kernel, rendered to Metal, run on the host through the shim and
compared with the numpy reference at fp32 and fp16 tolerances (``cases.py``: every registered
kernel, entry, unary / binary op and fused epilogue).  fp16 stores tensors as half (_Float16
here, round to nearest even as on Apple GPUs) and computes in float, as the Metal kernels do."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from optcli.gpu.layout import c4, dims4, pack, packed_elements, unpack
from optcli.gpu.registry import get_gpu_kernel, gpu_kernels_for
from optcli.gpu.variants import synchronizing_entries
from tests.gpu.harness import reference
from tests.helpers import assert_close
from tests.metal import shim
from tests.metal.cases import CASES

pytestmark = pytest.mark.skipif(shim.compilers() is None, reason="no clang (pip install ziglang)")
PRECISIONS = ["fp32", "fp16"]


def kernel_of(graph, node, kid):
    kern = get_gpu_kernel(kid) if kid else next(
        (k for k in gpu_kernels_for(node.op_type, node.domain) if k.check(node, graph) is None), None)
    assert kern is not None, f"no GPU kernel applies to {node.describe()}"
    reason = kern.check(node, graph)
    assert reason is None, f"{kern.id} does not apply: {reason}"
    return kern


def planned_launches(precision: str):
    """The launches of every case, without running them (for prebuilding and coverage)."""
    for case in CASES:
        graph, node, inputs, kid = case.build()
        kern = kernel_of(graph, node, kid)
        shapes = {n: tuple(graph.shape_of(n)) for n in [*node.inputs, *node.outputs] if n}
        ctx = shim.HostLaunchContext(shapes, dict(graph.initializers), {}, precision)
        yield case, kern, kern.launch(ctx, node)


@pytest.fixture(scope="module", autouse=True)
def prebuilt():
    """Compile every library the cases need up front, in parallel (clang runs out of process)."""
    if shim.compilers() is None:
        return
    wanted = {}
    for precision in PRECISIONS:
        for _, _, launches in planned_launches(precision):
            for launch in launches:
                defines = {**launch.defines, "STORAGE_HALF": int(precision == "fp16")}
                wanted[(launch.source, tuple(sorted(defines.items())))] = (launch.source, defines)
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(lambda sd: shim.program(*sd), wanted.values()))


def _padding_lanes_zero(packed: np.ndarray, shape, what: str) -> None:
    n, c, h, w = dims4(shape)
    if c % 4:
        lanes = packed[: packed_elements(shape)].reshape(n, c4(c), h, w, 4)[:, -1, :, :, c % 4:]
        assert np.all(lanes == 0), f"{what}: padding lanes not zero"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel(case, precision):
    graph, node, inputs, kid = case.build()
    kern = kernel_of(graph, node, kid)
    expected = reference(graph, node, inputs)
    actual, seen, buffers = shim.run_node(kern, graph, node, inputs, precision)
    outputs = [o for o in node.outputs if o]
    for name, a, e in zip(outputs, actual, [e for o, e in zip(node.outputs, expected) if o]):
        assert_close(a, np.asarray(e, np.float32), precision, what=f"{case.id} {name} ({precision}, Metal shim)")
        _padding_lanes_zero(buffers[name], graph.shape_of(name), f"{case.id} {name}")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_pack_unpack(precision):
    """The layout kernels read / write a plain NCHW buffer on one side."""
    storage = np.float16 if precision == "fp16" else np.float32
    x = np.random.default_rng(0).standard_normal((2, 6, 3, 5)).astype(storage)
    packed = np.full(packed_elements(x.shape), 7.0, storage)
    prog = shim.program("layout.cl", {"STORAGE_HALF": int(precision == "fp16")})
    grid = (5, 3, 2 * c4(6))
    src = np.ascontiguousarray(x.reshape(-1))
    prog.run("pack_nc4hw4", [src, packed, 2, 6, 3, 5, src.size, packed.size], grid)  # then the buffers' sizes
    assert np.array_equal(packed, pack(x, storage))
    plain = np.full(x.size, 7.0, storage)
    prog.run("unpack_nc4hw4", [packed, plain, 2, 6, 3, 5, packed.size, plain.size], grid)
    assert np.array_equal(plain.reshape(x.shape), unpack(packed, x.shape, storage))


def test_every_kernel_is_executed():
    """Each registered GPU kernel and each entry of each source meets a case (barrier-free ones
    run; kernels whose work items cooperate would be compile-only: there are none today)."""
    from optcli.gpu.registry import all_gpu_kernels
    from optcli.gpu.variants import kernel_entries

    kernels, entries = set(), {("layout.cl", "pack_nc4hw4"), ("layout.cl", "unpack_nc4hw4")}
    for _case, kern, launches in planned_launches("fp32"):
        kernels.add(kern.id)
        entries |= {(launch.source, launch.entry) for launch in launches}
    copies = {k.id for k in all_gpu_kernels() if k.variant == "copy"}  # Upload / Download: buffer copies
    missing = {k.id for k in all_gpu_kernels()} - copies - kernels - {"gpu.optcli.Pack.default",
                                                                        "gpu.optcli.Unpack.default"}
    assert not missing, f"GPU kernels with no Metal shim case: {sorted(missing)}"
    every = {(s, e) for s, names in kernel_entries().items() for e in names}
    assert every - entries - synchronizing_entries() == set()
    assert synchronizing_entries() == set(), "update docs/targets.md: these kernels are compile-checked only"
