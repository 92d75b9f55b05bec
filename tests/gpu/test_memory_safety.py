"""Every GPU kernel is memory-safe by construction (issue 12): each buffer parameter has a
length the runtime sets from the buffer it allocated, and every ``LOAD`` / ``STORE`` checks its
index against it, so a launch sized from a crafted file (or a runtime bug) reads zeros and
drops writes instead of touching memory outside its buffers.

On PoCL device memory is host memory: an output is bound as a sub-buffer at the start of a
larger allocation whose tail (the guard region) holds a sentinel, and a write past the output
would land there.  Under oclgrind (``test_oclgrind.py`` runs this directory on it) the same
launches go to plain buffers too, where any access outside an allocation is reported.
"""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.layout import pack, packed_elements
from optcli.gpu.registry import Launch, TensorRef, get_gpu_kernel
from optcli.ir import Node
from optcli.runtime.opencl.device import ClLaunchContext, cl
from optcli.runtime.opencl.devices import is_simulator
from tests.gpu.harness import device

SENTINEL = 7.0
GUARD = 1 << 16  # floats after the output: wider than any stray write below would reach


def _guarded(dev, elements: int, fill: float = SENTINEL):
    """(parent buffer, sub-buffer of its first ``elements`` floats): the kernel sees only the
    sub-buffer (its bound is the sub-buffer's size); the parent's tail is the guard region."""
    parent = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                       hostbuf=np.full(elements + GUARD, fill, np.float32))
    return parent, parent.get_sub_region(0, elements * 4)


def _upload(dev, data: np.ndarray):
    return cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=np.ascontiguousarray(data, np.float32))


def _read(dev, buf, elements: int) -> np.ndarray:
    host = np.empty(elements, np.float32)
    cl.enqueue_copy(dev.queue, host, buf)
    dev.queue.finish()
    return host


def _run(dev, shapes, buffers, launches) -> None:
    ctx = ClLaunchContext(dev, shapes, {}, buffers)
    for launch in launches:
        ctx.bind(launch, "crafted").enqueue(dev.queue)
    dev.queue.finish()


# The attack: a Concat whose second input is recorded far taller than the output allows
# (the file's shapes are individually valid, mutually inconsistent).  concat_part places each
# input element by its own coordinates: rows 4..63 of x1 land past the end of y.
CRAFTED = {"x0": (1, 4, 4, 4), "x1": (1, 4, 64, 4), "y": (1, 8, 4, 4)}


def _crafted_concat(dev, out_buffer):
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(CRAFTED[n]).astype(np.float32) for n in ("x0", "x1")}
    buffers = {n: _upload(dev, pack(x)) for n, x in inputs.items()}
    buffers["y"] = out_buffer
    node = Node("Concat", ["x0", "x1"], ["y"], {"axis": 1}, "crafted")
    _run(dev, CRAFTED, buffers, get_gpu_kernel("gpu.onnx.Concat.default").launch(
        ClLaunchContext(dev, CRAFTED, {}, buffers), node))
    return inputs


def test_crafted_concat_does_not_write_past_its_output():
    dev = device()
    out = packed_elements(CRAFTED["y"])
    parent, y = _guarded(dev, out)
    inputs = _crafted_concat(dev, y)
    host = _read(dev, parent, out + GUARD)
    assert np.all(host[out:] == SENTINEL), f"{int(np.sum(host[out:] != SENTINEL))} floats written past the output"
    # what fits is still placed where it belongs: channels 0..3 are x0 (slice 0 of y)
    assert np.array_equal(host[:64].reshape(4, 4, 4).transpose(2, 0, 1), inputs["x0"][0])


def test_concat_part_offset_beyond_the_output_writes_nothing():
    """A concat_part launch whose offset lies past the output (a runtime bug, or a crafted
    offset): every write is out of range and dropped."""
    dev = device()
    out = packed_elements((1, 4, 4, 4))
    parent, y = _guarded(dev, out, fill=-1.0)
    x = _upload(dev, np.ones(out, np.float32))
    args = [TensorRef("x"), TensorRef("y"), out // 4, 4, 4, 4, 4, 4, 4, 2, 1000]  # axis H, offset 1000
    _run(dev, {}, {"x": x, "y": y}, [Launch("tensor.cl", "concat_part", args, (out // 4,))])
    assert np.all(_read(dev, parent, out + GUARD) == -1.0)


def test_a_read_past_an_input_gives_zeros():
    """copy4 over more float4s than its input holds: the input's guard region (sentinels)
    is never read, the missing part comes back as zeros."""
    dev = device()
    n_in, n_out = 64, 256
    parent, x = _guarded(dev, n_in)
    cl.enqueue_copy(dev.queue, x, np.arange(n_in, dtype=np.float32))
    y = _upload(dev, np.full(n_out, -1.0, np.float32))
    _run(dev, {}, {"x": x, "y": y}, [Launch("tensor.cl", "copy4", [TensorRef("x"), TensorRef("y"), n_out // 4],
                                            (n_out // 4,))])
    got = _read(dev, y, n_out)
    assert np.array_equal(got[:n_in], np.arange(n_in, dtype=np.float32))
    assert np.all(got[n_in:] == 0.0), "a read past the input's end did not give zero"


def test_bounds_come_from_the_buffers_not_the_launch():
    """The bound of each buffer is its allocated length, whatever the launch's sizes say."""
    dev = device()
    parent, y = _guarded(dev, 16)
    x = _upload(dev, np.ones(16, np.float32))
    ctx = ClLaunchContext(dev, {}, {}, {"x": x, "y": y})
    args = ctx.arguments(Launch("tensor.cl", "copy4", [TensorRef("x"), TensorRef("y"), 10**6], (1,)), "t")
    assert [kind for kind, _ in args] == ["buffer", "buffer", "int", "int", "int"]
    assert [value for _, value in args[2:]] == [10**6, 16, 16]  # count, then x_n and y_n


def test_crafted_concat_on_a_plain_buffer():
    """Under oclgrind only: the output is a plain allocation, so a write past it would be
    reported (on PoCL it would corrupt the heap of this process instead)."""
    dev = device()
    if not is_simulator(dev.device):
        pytest.skip("a simulator's test (test_oclgrind.py runs it): here a stray write would corrupt the heap")
    out = packed_elements(CRAFTED["y"])
    y = _upload(dev, np.zeros(out, np.float32))
    _crafted_concat(dev, y)
    _read(dev, y, out)
