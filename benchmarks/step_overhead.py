"""Per-step overhead of ``Predictor.run`` outside the kernels, beside onnxruntime's per node.

A chain of ``steps`` tiny elementwise ops on a [1, 4] tensor: the kernels do almost nothing, so
the time of a run is the runtime's own bookkeeping.  optcli's overhead per step is (minimum run
time - minimum time of the same bound kernels called back to back) / steps; the fixed part of
a run (input checks, the thread limit) is measured on a one-step chain and taken out first.
onnxruntime's figure is its whole run time per node on the same chain (its kernels cost
something too, so it is an upper bound of its overhead).  Issue 11 asks for at most 1 us.

Run alone: ``python benchmarks/step_overhead.py``; ``bench_cpu.py`` adds it to its page.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import optcli
from optcli.compiler import compile_model

STEPS = 400
REPEATS = 300


def chain(steps: int, shape: tuple[int, ...] = (1, 4)) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i in range(steps):
        nodes.append(helper.make_node(("Relu", "Neg")[i % 2], [prev], [f"t{i}"]))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _min_time(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def _predictor(model: onnx.ModelProto, threads: int):
    return optcli.load(compile_model(model=model, valid_targets="arm").data, threads=threads)


def measure(threads: int = 2, steps: int = STEPS, repeats: int = REPEATS) -> dict:
    """{'optcli_us': per-step overhead (min), 'optcli_median_us', 'run_fixed_us', 'ort_us': per node}."""
    import onnxruntime as ort

    x = np.random.default_rng(0).random((1, 4), dtype=np.float32)
    p1, pn = _predictor(chain(1), threads), _predictor(chain(steps), threads)
    fns = pn._executor.fns

    def kernels():
        v = x
        for fn in fns:
            v = fn([v])[0]

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    sess = ort.InferenceSession(chain(steps).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    for _ in range(30):  # warm-up, interleaved
        p1.run(feed), pn.run(feed), kernels(), sess.run(None, feed)
    fixed, _ = _min_time(lambda: p1.run(feed), repeats)
    run_min, run_med = _min_time(lambda: pn.run(feed), repeats)
    kern_min, kern_med = _min_time(kernels, repeats)
    ort_min, _ = _min_time(lambda: sess.run(None, feed), repeats)
    return {"steps": steps, "threads": threads, "run_fixed_us": fixed * 1e6,
            "optcli_us": (run_min - kern_min - fixed) / steps * 1e6,
            "optcli_median_us": (run_med - kern_med - fixed) / steps * 1e6,
            "ort_us": ort_min / steps * 1e6}


def describe(m: dict) -> str:
    return (f"Per-step overhead of `run()` outside the kernels ({m['steps']}-step chain of Relu/Neg on a [1, 4] "
            f"tensor, {m['threads']} threads): {m['optcli_us']:.2f} us by minimum ({m['optcli_median_us']:.2f} us "
            f"by median), plus {m['run_fixed_us']:.1f} us per call (input checks, thread limits); onnxruntime's "
            f"whole time per node on the same chain, kernels included: {m['ort_us']:.2f} us. "
            "Command: `python benchmarks/step_overhead.py`.")


if __name__ == "__main__":
    print(describe(measure()))
