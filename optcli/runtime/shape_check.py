"""Before GPU kernels touch device memory, make sure the file's shapes are the real ones.

GPU launches size and index buffers by the value shapes recorded in the `.nb`.  Each recorded
shape is validated on its own by the reader, but a crafted file could record shapes that do not
agree with each other (a Conv output larger than its input allows), and a kernel would then read
or write outside a buffer.  So the first load of a file with GPU steps runs the plan once on the
host with zero inputs and compares every value's shape with the recorded one; a mismatch is an
``NbFormatError``.  Files that passed are remembered by their SHA-256 in the per-user cache, so
warm loads skip the check.
"""

from __future__ import annotations

import numpy as np

from optcli.errors import NbFormatError
from optcli.plan import Plan
from optcli.runtime.cl_cache import cache_root, private_dir


def _marker(digest: str | None):
    if not digest:
        return None
    folder = private_dir(cache_root()) and private_dir(cache_root() / "validated")
    return folder / digest if folder else None


def check_recorded_shapes(plan: Plan, digest: str | None, source: str) -> None:
    marker = _marker(digest)
    if marker is not None and marker.exists():
        return
    from optcli.runtime.executor import Executor

    if not all(v.is_static for v in plan.inputs):
        return  # GPU steps need static shapes; a plan with dynamic inputs has none on the GPU
    feeds = {v.name: np.zeros(v.shape, v.dtype if v.dtype != "unknown" else "float32") for v in plan.inputs}
    seen: dict[str, tuple] = {}
    index_inputs = any(v.dtype not in ("float32", "float16", "bool") for v in plan.inputs)
    try:
        Executor(plan).run(feeds, record_shapes=seen)
    except Exception as exc:
        if index_inputs:
            # Zeros are no valid stand-in for integer inputs (token ids, shapes): the check cannot
            # run; uploads still refuse arrays whose shape differs from their device buffer.
            return
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise NbFormatError(f"{source}: the plan does not run on its own recorded input shapes "
                            f"({type(exc).__name__}: {first}); the file is corrupted") from None
    gpu_values = {n for s in plan.steps if s.cpu_kernel for n in (*s.inputs, *s.outputs)}
    for name, shape in seen.items():
        if name not in gpu_values:
            continue  # host values are computed from real arrays; GPU buffers are what must agree
        recorded = plan.values.get(name)
        if recorded is not None and recorded.shape is not None and tuple(recorded.shape) != shape and \
                all(isinstance(d, int) for d in recorded.shape):
            raise NbFormatError(f"{source}: value '{name[:60]}' is recorded as {list(recorded.shape)} but computes "
                                f"to {list(shape)}; the file is corrupted or crafted")
    if marker is not None:
        try:
            marker.touch()
        except OSError:
            pass
