"""What one GPU step costs the host and the device, beside bare pyopencl on the same device.

A chain of ``STEPS`` Relu/Neg steps on a [1, 32, 16, 16] tensor, planned for ``opencl`` and loaded with
``require_gpu=True``: the kernels do almost nothing, so a run's time is launch and wait costs.
Printed per step, by minimum and median of ``REPEATS`` runs: optcli's whole run; optcli's enqueue
alone (the run's steps without the final wait); and pyopencl enqueuing the same number of trivial
kernels then waiting (``queue.finish()``).  The GPU check runs it after its parts (issue 21: where
a GPU run's wall time goes beyond its kernels' time).

    python benchmarks/gpu_step_cost.py [DEVICE-NAME-PART]
"""

from __future__ import annotations

import sys

import numpy as np

from benchmarks.step_overhead import _min_time, chain

STEPS = 400
REPEATS = 50
SHAPE = (1, 32, 16, 16)  # large enough that the placement keeps it on the GPU


def _stats(fn) -> tuple[float, float]:
    """Minimum and median microseconds per step of ``fn`` (a run of the chain), after a warm-up."""
    for _ in range(5):
        fn()
    low, mid = _min_time(fn, REPEATS)
    return low / STEPS * 1e6, mid / STEPS * 1e6


def main(device: str | None) -> None:
    import pyopencl as cl

    import optcli
    from optcli.compiler import compile_model

    predictor = optcli.load(compile_model(model=chain(STEPS, SHAPE), valid_targets="opencl").data, require_gpu=True,
                            device=device)
    feed = {"x": np.random.default_rng(0).random(SHAPE, dtype=np.float32)}
    dev = predictor.gpu.dev
    whole = _stats(lambda: predictor.run(feed))
    queue = cl.CommandQueue(dev.context)
    prog = cl.Program(dev.context, "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }").build()
    kern = cl.Kernel(prog, "k")
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 64)
    kern.set_args(buf)

    def bare():
        for _ in range(STEPS):
            cl.enqueue_nd_range_kernel(queue, kern, (16,), None)
        queue.finish()

    def bare_enqueue_only():
        for _ in range(STEPS):
            cl.enqueue_nd_range_kernel(queue, kern, (16,), None)
        queue.flush()

    base = _stats(bare)
    enqueue = _stats(bare_enqueue_only)
    queue.finish()
    print(f"per step on {dev.describe()} ({STEPS}-step chain, min / median us): optcli run "
          f"{whole[0]:.2f} / {whole[1]:.2f}; pyopencl enqueue+finish {base[0]:.2f} / {base[1]:.2f}; "
          f"pyopencl enqueue only {enqueue[0]:.2f} / {enqueue[1]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
