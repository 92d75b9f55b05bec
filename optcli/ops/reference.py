"""The generic fallback: any standard ONNX op runs through onnx's reference implementation.

This is what keeps the `arm` target from ever rejecting a valid model.  Nodes that use it carry
their serialized NodeProto (which may hold subgraphs, for If/Loop/Scan); the evaluator for each
distinct node is built once and cached.  Protobuf parsing executes no code from the file.

Inside the subgraphs of ``If``, ``Loop`` and ``Scan``, every node whose op has an optcli kernel
runs with that kernel (``_optcli_ops``: onnx.reference takes them as overrides and hands them down
to the bodies): an LSTM inside a voice detector's ``If`` gets the native time loop, a decoder's
``OneHot`` with a one-element ``depth`` gets optcli's kernel, which reads it (onnx's fails under
numpy 2), and onnx.reference is left the ops optcli has no kernel for.
"""

from __future__ import annotations

import contextvars
import os
import threading
from functools import lru_cache

import numpy as np

from optcli.errors import RunLimitError
from optcli.ops.registry import StepAttrs, has_native_kernel, kernels_for, registered_ops

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


def _spec_loop(base):
    """onnx.reference's ``Loop`` with the spec's outputs: scan outputs stacked on a new first axis
    (onnx's ``np.vstack`` merged a body's [1, C] values into [N, C] and gave scalars [N, 1], where
    onnxruntime gives [N, 1, C] and [N]), zero iterations allowed (they gave no scan output at
    all), the iteration number int64 whatever M's type, and M or cond absent as the spec says."""

    class Loop(base):
        def _run(self, M, cond, *carried, context=None, body=None, attributes=None, bindings=None):
            body = self.body
            names_in, names_out = body.input_names, body.output_names
            n_carried = len(names_in) - 2
            n_scans = len(names_out) - 1 - n_carried
            feeds = dict(context or {})
            values = list(carried)
            trips = None if M is None or np.asarray(M).size == 0 else int(np.asarray(M).reshape(-1)[0])
            go = True if cond is None or np.asarray(cond).size == 0 else bool(np.asarray(cond).reshape(-1)[0])
            scans: list[list] = [[] for _ in range(n_scans)]
            it = 0
            while go and (trips is None or it < trips):
                if names_in[0]:
                    feeds[names_in[0]] = np.array(it, np.int64)
                if names_in[1]:
                    feeds[names_in[1]] = np.array(go)
                feeds.update((name, v) for name, v in zip(names_in[2:], values) if name)
                outs = self._run_body(feeds, attributes=attributes, bindings=bindings)
                go = bool(np.asarray(outs[0]).reshape(-1)[0])
                values = list(outs[1:1 + n_carried])
                for k in range(n_scans):
                    scans[k].append(np.asarray(outs[1 + n_carried + k]))
                it += 1
            results = values + [np.stack(s) if s else np.empty((0,), np.float32) for s in scans]
            return self._check_and_fix_outputs(tuple(results[:len(self.onnx_node.output)]))

    Loop.__name__ = "Loop"
    return Loop


@lru_cache(maxsize=1)
def _guarded_ops() -> list:
    from onnx.reference.ops.op_loop import Loop
    from onnx.reference.ops.op_scan import Scan

    return [_guarded(_spec_loop(Loop)), _guarded(Scan)]


def attribute_values(proto) -> tuple[dict, bool]:
    """A NodeProto's attributes as optcli's kernels take them (ints, floats, strings, lists, numpy
    arrays for tensors), and whether any was left out because only onnx.reference reads it
    (subgraphs, sparse tensors, type protos)."""
    import onnx
    from onnx import helper, numpy_helper

    attrs, opaque = {}, False
    for a in proto.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", errors="replace") for v in value]
        elif isinstance(value, list) and value and isinstance(value[0], onnx.TensorProto):
            value = [numpy_helper.to_array(v) for v in value]
        elif not isinstance(value, (int, float, str, list)):
            opaque = True
            continue
        attrs[a.name] = value
    return attrs, opaque


CONTROL_FLOW = ("If", "Loop", "Scan")


def runs_optcli_kernel(node) -> bool:
    """Whether a node inside an If/Loop/Scan body runs optcli's kernel (``_optcli_ops``), not
    onnx.reference's: its op has a kernel for any node that makes every output it uses, and no
    attribute linked to an enclosing function's."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if node.op_type in CONTROL_FLOW or any(a.ref_attr_name for a in node.attribute):
        return False
    if not any(k.applies is None for k in kernels_for(node.op_type, domain)):
        return False
    return has_native_kernel(node.op_type, domain, list(node.output))


def body_ops(proto: bytes) -> list[tuple[str, str, str]]:
    """The ops inside a node's subgraphs, nested ones included, as (op type, domain, who runs it:
    "optcli kernel", "onnx reference" or "control flow"): what ``opt --print_model_ops`` lists
    under an If/Loop/Scan step."""
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    found: list[tuple[str, str, str]] = []

    def walk(n) -> None:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                      list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                for inner in g.node:
                    runner = ("control flow" if inner.op_type in CONTROL_FLOW else
                              "optcli kernel" if runs_optcli_kernel(inner) else "onnx reference")
                    found.append((inner.op_type, "" if inner.domain == "ai.onnx" else inner.domain, runner))
                    walk(inner)

    walk(node)
    return found


@lru_cache(maxsize=1)
def _optcli_ops() -> tuple:
    """One onnx.reference op class per op that has an optcli kernel of its own (the variant that
    applies to any node: a body's nodes are not kernel-selected), for the bodies of If/Loop/Scan."""
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops import load_op

    class KernelOp(OpRun):
        """A body node run by optcli's kernel; one it cannot take (an output the kernel does not
        make, an attribute linked to an enclosing function's) goes to onnx.reference's own class."""

        kernel = None  # set per op below

        def __init__(self, onnx_node, run_params, schema=None):
            super().__init__(onnx_node, run_params, schema)
            self._delegate = None
            if not runs_optcli_kernel(onnx_node):
                version = run_params["opsets"].get(onnx_node.domain)
                self._delegate = load_op(onnx_node.domain, onnx_node.op_type, version)(onnx_node, run_params)
                return
            attrs, _ = attribute_values(onnx_node)
            self._attrs = StepAttrs({**attrs, "_opset": int(run_params["opsets"].get("", 0) or 0),
                                     "_n_outputs": len(onnx_node.output)})
            self._n_outputs = len(onnx_node.output)

        def _run(self, *args, **kwargs):
            if self._delegate is not None:
                return self._delegate._run(*args, **kwargs)
            return tuple(self.kernel.fn(list(args), self._attrs)[:self._n_outputs])

    classes = []
    for domain, op in registered_ops():
        generic = [k for k in kernels_for(op, domain) if k.applies is None]
        if generic and op not in CONTROL_FLOW:
            classes.append(type(op, (KernelOp,), {"op_domain": domain, "kernel": generic[0]}))
    return tuple(classes)


def _has_subgraph(node) -> bool:
    import onnx

    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


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
    # The bodies of If/Loop/Scan run optcli's kernels; a plain node that fell back keeps onnx's own.
    overrides = [*_guarded_ops(), *(_optcli_ops() if _has_subgraph(node) else ())]
    return ReferenceEvaluator(model, new_ops=overrides), list(node.output)


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
