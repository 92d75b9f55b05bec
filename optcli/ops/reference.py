"""The generic fallback: any standard ONNX op runs through onnx's reference implementation.

This is what keeps the `arm` target from ever rejecting a valid model.  Nodes that use it carry
their serialized NodeProto (which may hold subgraphs, for If/Loop/Scan); the evaluator for each
distinct node is built once and cached.  Protobuf parsing executes no code from the file.
"""

from __future__ import annotations

import contextvars
import os
import threading
from functools import lru_cache

import numpy as np

from optcli.errors import RunLimitError

_LOCK = threading.Lock()

MAX_LOOP_ITERATIONS = int(os.environ.get("OPTCLI_MAX_LOOP_ITERATIONS", "1000000"))
"""Iterations one fallback ``Loop`` or ``Scan`` may run (``OPTCLI_MAX_LOOP_ITERATIONS``): a file
cannot make a run go on forever (a trip count of 10**12, a condition that stays true).  Real
models iterate thousands of times (a decoder's 501 steps), each iteration a Python-level run of
the body: a million of them is hours."""

RUN_STOP: contextvars.ContextVar = contextvars.ContextVar("optcli_run_stop", default=None)
"""The running call's stop flag (``runtime.run_control.RunStop``: ``check(where)`` raises once it
is cancelled or past its deadline), seen at every iteration of a fallback ``Loop``/``Scan``."""

_ITERATIONS = threading.local()  # per thread: the running Loop/Scan invocations' iteration counts


def _guarded(base):
    """``base`` (onnx.reference's Loop or Scan) counting its iterations against
    ``MAX_LOOP_ITERATIONS`` and checking the run's stop flag at each one."""

    class Guarded(base):
        op_domain = ""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            run_body = self._run_body  # onnx.reference binds it per instance, from the ``body`` attribute

            def counted(*body_args, **body_kwargs):
                counts = _ITERATIONS.stack
                counts[-1] += 1
                if counts[-1] > MAX_LOOP_ITERATIONS:
                    raise RunLimitError(f"a {base.__name__} runs more than {MAX_LOOP_ITERATIONS} iterations, the "
                                        "limit (OPTCLI_MAX_LOOP_ITERATIONS) that keeps a file from running forever")
                stop = RUN_STOP.get()
                if stop is not None:
                    stop.check(f"in a {base.__name__}'s iteration {counts[-1]}")
                return run_body(*body_args, **body_kwargs)

            self._run_body = counted

        def _run(self, *args, **kwargs):
            counts = _ITERATIONS.__dict__.setdefault("stack", [])
            counts.append(0)
            try:
                return super()._run(*args, **kwargs)
            finally:
                counts.pop()

    Guarded.__name__ = base.__name__
    return Guarded


@lru_cache(maxsize=1)
def _guarded_ops() -> list:
    from onnx.reference.ops.op_loop import Loop
    from onnx.reference.ops.op_scan import Scan

    return [_guarded(Loop), _guarded(Scan)]


@lru_cache(maxsize=512)
def _evaluator(proto: bytes, opsets: tuple[tuple[str, int], ...],
               typed_names: tuple[tuple[str, int], ...]) -> tuple[object, list[str]]:
    import onnx  # imported on first use: plans without fallback steps never pay for onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    # Graph inputs: the node's explicit inputs plus the outer values its subgraphs read, typed
    # (function-defined ops such as GroupNormalization cast to their input's type).
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in dict(typed_names).items()]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output if n]
    graph = helper.make_graph([node], "fallback", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model, new_ops=_guarded_ops()), list(node.output)


def run_reference(proto: bytes, opsets: dict[str, int], inputs: list[np.ndarray | None],
                  names: list[str]) -> list[np.ndarray]:
    """Run one node through onnx.reference.  ``names`` are the step's input names (explicit
    inputs, then implicit subgraph reads), ``inputs`` their values (None for absent ones)."""
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    typed = tuple((n, _elem_type(x)) for n, x in feeds.items())
    with _LOCK:
        evaluator, output_names = _evaluator(proto, tuple(sorted(opsets.items())), typed)
    outs = iter(evaluator.run(None, feeds))
    # Positional, like the node's outputs: an absent optional output ("") gets None.
    return [_as_value(next(outs)) if n else None for n in output_names]


def _as_value(out):
    """Tensors as numpy arrays; sequences (lists) and optionals (None) stay as they are."""
    return out if out is None or isinstance(out, list) else np.asarray(out)


def _elem_type(x) -> int:
    import onnx
    from onnx import helper

    if not isinstance(x, np.ndarray):
        return onnx.TensorProto.UNDEFINED  # sequences, optionals: the reference infers them
    try:
        return helper.np_dtype_to_tensor_dtype(x.dtype)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.UNDEFINED  # sequences, optionals: the reference infers them
