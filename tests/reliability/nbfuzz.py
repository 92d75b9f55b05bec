"""Shared pieces of the `.nb` fuzz tests: seed files, resealing, and the allowed outcomes.

``load_or_clear_error`` is the reader's oracle: a file either loads or raises ``NbFormatError``;
any other exception fails the test, and so does a load that takes longer than ``TIME_BUDGET_S``
(a hang guard) or whose peak Python allocation exceeds ``alloc_bound(len(data))``.

``load_run_or_clear_error`` goes on with what loads: ``optcli.load`` (the runtime's checks, the
GPU steps on the session's device when there is one) and a run on a small input, under the same
guards (``RUN_BUDGET_S``, ``alloc_bound + RUN_ALLOWANCE``).  The run must give a result or an
``OptError``; where the plan has GPU steps, a result must agree with the same file run on the
host (``targets="arm"``).
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import time
import tracemalloc

import msgpack
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError, OptError
from optcli.gpu.registry import FAMILIES as GPU_KERNELS
from optcli.nb.layout import CHECKSUM_SIZE, FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, align
from optcli.nb.reader import load_bytes
from optcli.ops.registry import FAMILIES as HOST_KERNELS

# Both kernel registries filled up front: their imports must not count as a load's allocation.
HOST_KERNELS.ensure()
GPU_KERNELS.ensure()

TIME_BUDGET_S = 2.0
RUN_BUDGET_S = 20.0  # load + two runs of a small input (the first GPU load of a kernel builds its program)
RUN_ALLOWANCE = 16 << 20  # bytes a run of a small input may take beyond the load's bound


def alloc_bound(size: int) -> int:
    """Peak bytes a load may allocate for a file of ``size`` bytes.  The msgpack body decodes to
    Python objects (a one-byte item can become a ~100-byte object), weights are views of the file,
    attribute tensors are copied once; plus a fixed allowance for the schema's own bookkeeping."""
    return 128 * size + (4 << 20)


def reseal(without_checksum: bytes) -> bytes:
    return without_checksum + hashlib.sha256(without_checksum).digest()


def rebuild(body: object, blob: bytes, version: int = FORMAT_VERSION, raw_body: bytes | None = None) -> bytes:
    """A well-formed container (header, padding, checksum) around ``body`` and ``blob``."""
    packed = raw_body if raw_body is not None else msgpack.packb(body, use_bin_type=True)
    blob_off = align(HEADER_SIZE + len(packed))
    header = HEADER.pack(MAGIC, version, 0, b"0.1.0", HEADER_SIZE, len(packed), blob_off, len(blob))
    return reseal(header + packed + b"\0" * (blob_off - HEADER_SIZE - len(packed)) + blob)


def parts(data: bytes) -> tuple[dict, bytes]:
    _, _, _, _, _, body_len, blob_off, blob_len = HEADER.unpack_from(data)
    return msgpack.unpackb(data[HEADER_SIZE:HEADER_SIZE + body_len]), data[blob_off:blob_off + blob_len]


def load_or_clear_error(data: bytes, measure_memory: bool = True) -> str:
    """'ok' or the NbFormatError's message; fails on anything else, on a hang, on over-allocation."""
    if measure_memory:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        load_bytes(data)
        outcome = "ok"
    except NbFormatError as exc:
        outcome = str(exc)
        assert outcome and "\n" not in outcome, f"error message is not one clear line: {outcome!r}"
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else 0
        if measure_memory:
            tracemalloc.stop()
    assert elapsed < TIME_BUDGET_S, f"load took {elapsed:.2f} s (hang guard {TIME_BUDGET_S} s)"
    if measure_memory:
        assert peak <= alloc_bound(len(data)), f"load of {len(data)} bytes allocated {peak} bytes at peak"
    return outcome


class Hang(Exception):
    """The run outlived its guard."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Interrupt Python code running past ``seconds`` (a hang in one C call is caught when it returns)."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def small_inputs(predictor, seed: int = 0) -> dict[str, np.ndarray]:
    """An input per model input: its fixed dims where that stays small, else small sizes (the run
    may then refuse them with an InputError, which is an allowed outcome); symbolic and unknown
    dims 2; an input of unknown rank [1, 1, 4, 4]."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in predictor.plan.inputs:
        declared = spec.shape if spec.shape is not None else (1, 1, 4, 4)
        shape = [d if isinstance(d, int) else 2 for d in declared]
        if int(np.prod(shape, dtype=object)) > 4096:
            shape = [min(d, 2) for d in shape]
        dtype = np.dtype(spec.dtype if spec.dtype != "unknown" else "float32")
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[spec.name] = rng.integers(0, 3, shape).astype(dtype)
    return feeds


def _run(data: bytes, feeds, targets) -> dict | str:
    """Outputs, or the OptError's message; anything else propagates (and fails the test)."""
    try:
        predictor = optcli.load(data, targets=targets)
        if feeds is None:
            feeds = small_inputs(predictor)
        return predictor.run(feeds), feeds
    except OptError as exc:
        text = str(exc)
        assert text and "\n" not in text, f"error message is not one clear line: {text!r}"
        return text, feeds


def load_run_or_clear_error(data: bytes, measure_memory: bool = True) -> str:
    """``load_or_clear_error``, then, for a file that loads, ``optcli.load`` and a run on a small
    input: 'ran', or the OptError's message.  Fails on any other exception, a hang, over-allocation,
    or a GPU result that differs from the host's."""
    outcome = load_or_clear_error(data, measure_memory)
    if outcome != "ok":
        return outcome
    if measure_memory:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        with _deadline(RUN_BUDGET_S):
            first, feeds = _run(data, None, None)
            plan = optcli.load(data, targets="arm").plan if not isinstance(first, str) else None
            on_gpu = plan is not None and any(s.cpu_kernel for s in plan.steps)
            host = _run(data, feeds, "arm")[0] if on_gpu else None
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else 0
        if measure_memory:
            tracemalloc.stop()
    assert elapsed < RUN_BUDGET_S, f"load and run took {elapsed:.2f} s"
    if measure_memory:
        assert peak <= alloc_bound(len(data)) + RUN_ALLOWANCE, f"load and run allocated {peak} bytes at peak"
    if isinstance(first, str):
        return first
    if isinstance(host, dict):
        fp16 = "fp16" in str(plan.metadata.get("precision", ""))
        for name, value in first.items():
            a, b = np.asarray(value), np.asarray(host[name])
            assert a.shape == b.shape, f"output '{name}': GPU shape {a.shape}, host {b.shape}"
            if a.dtype.kind == "f" and a.size:
                tol = 2e-2 if fp16 else 1e-4
                assert np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True), f"output '{name}': GPU and host differ"
            else:
                assert np.array_equal(a, b), f"output '{name}': GPU and host differ"
    return "ran"


def seed_models() -> dict[str, bytes]:
    """Small `.nb` files covering every part of the schema: weights, attributes (ints, floats,
    lists, a tagged tensor), a generic-fallback step with its NodeProto, GPU steps with host
    fallback kernels, dynamic dims; and one whose plan calls most native host kernels."""
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["r"], alpha=0.2),
             helper.make_node("Einsum", ["r", "r"], ["z"], equation="nchw,nchw->nchw")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 4, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    cpu = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["z"])]
    graph = helper.make_graph(nodes, "gpu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    gpu = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return {"arm": optcli.optimize(model=cpu).data,
            "opencl": optcli.optimize(model=gpu, valid_targets="opencl,arm",
                                      disabled_passes={"keep_small_islands_on_host"}).data,
            "native": optcli.optimize(model=_native_kernels_model()).data}


def _native_kernels_model():
    """A small CNN whose plan calls the native host kernels (stem conv, depthwise, 1x1 and grouped GEMM
    convs, an activation, pooling, a row mean): the other seeds reach only the stem conv, and the
    sanitizer run (tools/sanitize_native.py) fuzzes the C through what the seeds' plans call."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (8, 3, 3, 3), "b1": (8,), "wd": (8, 1, 3, 3), "w2": (16, 8, 1, 1), "b2": (16,),
              "wg": (16, 8, 3, 3), "fc": (16, 4)}
    weights = [numpy_helper.from_array((0.3 * rng.standard_normal(s)).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd"], ["d"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Conv", ["d", "w2", "b2"], ["c2"]),
             helper.make_node("HardSigmoid", ["c2"], ["h"]),
             helper.make_node("Mul", ["c2", "h"], ["hs"]),
             helper.make_node("Conv", ["hs", "wg"], ["g"], pads=[1, 1, 1, 1], group=2),
             helper.make_node("Add", ["g", "hs"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["z"])]
    graph = helper.make_graph(nodes, "native", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def body_paths(node, path=()):
    """Every path (tuple of keys / indices) into a decoded body, containers first."""
    yield path
    if isinstance(node, dict):
        for k in sorted(node, key=str):
            yield from body_paths(node[k], (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from body_paths(v, (*path, i))


def replaced(body, path, value):
    """A deep copy of ``body`` with the item at ``path`` replaced by ``value``."""
    copy = msgpack.unpackb(msgpack.packb(body, use_bin_type=True))
    if not path:
        return value
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


CHECKSUM = CHECKSUM_SIZE
