"""If, Loop and Scan run by optcli: their bodies compiled once into steps of optcli's kernels.

A body (an ONNX subgraph) becomes a ``Body``: its constants, and one step per node, each either
optcli's kernel for the op (the variant that fits any node: a body's nodes are not kernel-selected
as the main graph's are), a nested ``If``/``Loop``/``Scan`` of this module, or, for an op optcli
has no kernel for, onnx's reference implementation of that one node (``reference.run_reference``).
Running a body is a Python loop over those steps on a list of value slots: <1 us per step, where
onnx's ReferenceEvaluator, which ran whole bodies before, cost ~15-30 us per node and ran every
node with its own implementation (a decoder's ``OneHot`` with a one-element ``depth``, legal ONNX,
failed there under numpy 2; an LSTM inside a voice detector's ``If`` ran onnx's slow, and for
``clip`` or ``sequence_lens`` wrong, LSTM).

The semantics follow the spec and onnxruntime where onnx.reference departs from them: ``Loop``
stacks scan outputs on a new first axis (onnx's ``vstack`` merged [1, C] values into [N, C]) and
allows zero iterations; ``Scan`` takes every axis and direction (onnx's only axis 0, forward) and
opset 8's batch axis with ``sequence_lens``.

A file cannot make a run endless: every ``Loop``/``Scan`` iteration counts against
``MAX_LOOP_ITERATIONS`` and checks the run's stop flag (cancel, deadline).  Values a body reads
from the enclosing graphs come in as the step's implicit inputs (``ir.subgraph_outer_refs``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from optcli import generated_code
from optcli.errors import RunLimitError
from optcli.ops import reference
from optcli.ops.reference import CONTROL_FLOW, attribute_values, run_reference, runs_optcli_kernel
from optcli.ops.registry import StepAttrs, kernels_for

BODY_OPTCLI_OPS = frozenset({"FullyConnected", "Swish", "ChannelAffine"})
"""The ``optcli`` ops a compiled body may hold (``passes/compile_bodies.py``): the ones the body
passes make whose kernel fits any node.  The loader refuses any other (``runtime/body_checks.py``):
the others' kernels rely on checks of the main plan (a QConv's int8 weights) a body does not get."""


def run_fallback(proto: bytes, opsets: dict[str, int], inputs: list, names: list[str]) -> list:
    """Run a node that kept its NodeProto (a step with no kernel id of its own): If/Loop/Scan in
    this module's executor, anything else through onnx.reference (``reference.run_reference``).
    ``names`` are the step's input names (explicit inputs, then the outer values its bodies read),
    ``inputs`` their values."""
    op = _control_flow(proto, tuple(sorted(opsets.items())))
    if op is None:
        return run_reference(proto, opsets, inputs, names)
    return op.bound(names)(inputs)


def bound_fallback(proto: bytes, opsets: dict[str, int], names: list[str]):
    """``run_fallback`` for one plan step, as a function of its inputs: the compiled If/Loop/Scan
    looked up on the first call and kept (the lookup, by the node's bytes, and the step's name
    bookkeeping cost ~2 us a run of a voice detector whose whole net is one If), not at load, so
    a body that cannot compile fails where it did, in the run."""
    key = tuple(sorted(opsets.items()))
    run = None

    def call(inputs: list) -> list:
        nonlocal run
        if run is None:
            op = _control_flow(proto, key)
            if op is None:
                return run_reference(proto, opsets, inputs, names)
            run = op.bound(names)
        return run(inputs)

    return call


@lru_cache(maxsize=256)
def _control_flow(proto: bytes, opsets: tuple[tuple[str, int], ...]) -> ControlFlow | None:
    """The compiled If/Loop/Scan of a node's bytes (None for any other op), made once per node."""
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(proto)
    if node.op_type not in CONTROL_FLOW or node.domain not in ("", "ai.onnx"):
        return None
    return ControlFlow(node, dict(opsets))


class _Counter:
    """The iterations of one Loop/Scan invocation, held against the limit and the stop flag.  The
    limit and the run's stop flag are read once per invocation (neither changes during a run);
    the flag's ``stopped`` is polled every iteration, its message made only when it is set."""

    __slots__ = ("op", "count", "limit", "stop")

    def __init__(self, op: str):
        self.op, self.count = op, 0
        self.limit, self.stop = reference.MAX_LOOP_ITERATIONS, reference.RUN_STOP.get()

    def tick(self) -> None:
        self.count += 1
        if self.count > self.limit:
            raise RunLimitError(f"a {self.op} runs more than {self.limit} iterations, the limit "
                                "(OPTCLI_MAX_LOOP_ITERATIONS) that keeps a file from running forever")
        stop = self.stop
        if stop is not None and stop.stopped:
            stop.check(f"in a {self.op}'s iteration {self.count}")


_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                         "Multinomial"})  # a new draw every run
_GRAPH_TYPES = (5, 10)  # onnx.AttributeProto.GRAPH, GRAPHS (onnx is imported only when a body is compiled)
_MAX_FOLDED = 16 * 1024 * 1024  # elements: a body's folded value is kept for the plan's life


_ENV = object()  # a step's attrs slot for one that reads the environment itself: run(args, env)


class Body:
    """One subgraph, compiled once: ``run(feeds, outer)`` gives its outputs in order.

    Values live in a list of slots, one per name, laid out once: a Loop runs its body hundreds
    of times, and a dict environment copied from the outer one and filled name by name cost
    ~1 us a step there.  A step is ``(fn, attrs, input slots, output slots)``: optcli's kernel is
    called as ``fn(args, attrs)`` directly; a nested If/Loop/Scan or an onnx.reference node has
    ``attrs`` ``_ENV`` and is called as ``fn(args, env)`` with the names it may read."""

    def __init__(self, graph, opsets: dict[str, int], outer_consts: dict[str, Any] | None = None):
        from onnx import numpy_helper

        self.outer_consts = outer_consts or {}  # constants of the enclosing bodies, for folding

        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        self.output_empty = [_empty_like_declared(o) for o in graph.output]
        self.consts: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.steps: list[tuple] = []  # (fn, attrs or _ENV, input names, output names)
        self.op_types: list[str] = []  # each step's op ("" for one outside the default domain)
        for node in graph.node:
            fn, attrs = _compile_node(node, opsets, {**self.outer_consts, **self.consts})
            if not self._fold(node, fn, attrs):
                self.steps.append((fn, attrs, list(node.input), list(node.output)))
                self.op_types.append(node.op_type if node.domain in ("", "ai.onnx") else "")
        self._lay_out()

    def scatter_in_place(self, carried: list[tuple[str, str]]) -> list[int]:
        """Let the ScatterND steps that own a Loop-carried value write into it: for each carried
        (input name, output name), where the one step that reads the input is a ScatterND taking
        it as its data and giving the output, and nothing else reads either (no other step, no
        other body output, no nested body or onnx.reference node, which read names the slots do
        not show), that step becomes ``tensor.scatter_nd_in_place``.  Returns the positions of
        the carried values so taken: the Loop copies their first value (the caller's) once and
        the body then fills the same array every iteration, where each iteration copied it whole."""
        from optcli.ops.tensor import scatter_nd_in_place

        if any(attrs is _ENV for _, attrs, _, _ in self.steps):
            return []
        taken = []
        for k, (name_in, name_out) in enumerate(carried):
            if not name_in or not name_out or name_in == name_out or name_in in self.consts \
                    or name_in in self.output_names or self.output_names.count(name_out) != 1:
                continue
            readers = [j for j, (_, _, ins, _) in enumerate(self.steps) if name_in in ins or name_out in ins]
            if len(readers) != 1:
                continue
            j = readers[0]
            fn, attrs, ins, outs = self.steps[j]
            if self.op_types[j] != "ScatterND" or ins[0] != name_in or ins.count(name_in) != 1 \
                    or not outs or outs[0] != name_out:
                continue
            self.steps[j] = (scatter_nd_in_place, attrs, ins, outs)
            taken.append(k)
        if taken:
            self._lay_out()
        return taken

    def _fold(self, node, fn, attrs) -> bool:
        """Evaluate a node of constants once, here: exporters put weight arithmetic inside bodies
        (torch's LSTM gate reordering is Slice/Concat over the weights, 0.8 ms a run in a voice
        detector's If), which the main graph's constant folding never sees.  True when folded."""
        if node.op_type in _NOT_FOLDED or any(a.type in _GRAPH_TYPES for a in node.attribute):
            return False
        known = {**self.outer_consts, **self.consts}
        if not all(i in known for i in node.input if i):
            return False
        try:
            outs = fn([known[i] if i else None for i in node.input], known if attrs is _ENV else attrs)
        except Exception:  # noqa: BLE001 - left to run (and report) at run time, as it would without folding
            return False
        if len(outs) < len([o for o in node.output if o]):
            return False
        if any(not isinstance(v, np.ndarray) or v.size > _MAX_FOLDED for v in outs):
            return False
        self.consts.update((name, v) for name, v in zip(node.output, outs) if name)
        return True

    def _lay_out(self) -> None:
        """Give every name a slot: constants filled in the template, the body's inputs, each
        step's outputs, and the names read from the enclosing graphs (``_outer``: read before
        any step writes them, as a dict copied from the outer values would have given them)."""
        slot: dict[str, int] = {}
        for name in self.consts:
            slot[name] = len(slot)
        known = set(self.consts)
        for name in self.input_names:
            if name:
                slot.setdefault(name, len(slot))
                known.add(name)
        outer: dict[str, int] = {}

        def read(name: str) -> int | None:
            if not name:
                return None
            if name not in known and name not in outer:
                outer[name] = slot.setdefault(name, len(slot))
            return slot[name]

        steps = []
        for fn, attrs, inputs, outputs in self.steps:
            ins = tuple(read(n) for n in inputs)
            outs = tuple(slot.setdefault(n, len(slot)) if n else None for n in outputs)
            known.update(n for n in outputs if n)
            steps.append((fn, attrs, ins, outs))
        self._results = tuple(read(n) for n in self.output_names)
        self._slots, self._outer, self._program = slot, tuple(outer.items()), tuple(steps)
        self._run_program = _straight_line(self._program)
        template = [None] * len(slot)
        for name, value in self.consts.items():
            if isinstance(value, np.ndarray):
                # read-only as a plan's weights are: kernels keep what they read from a read-only
                # argument by its identity (ops/tensor.py _arg_key), and none writes its inputs
                value.setflags(write=False)
            template[slot[name]] = value
        self._template = template
        self._input_slots = tuple(slot.get(n) if n else None for n in self.input_names)

    def run(self, feeds: dict[str, Any], outer: dict[str, Any]) -> list:
        """The outputs for ``feeds`` by input name (absent ones read from ``outer``)."""
        return self.run_inputs([feeds.get(n, _ABSENT) for n in self.input_names], outer)

    def run_inputs(self, values: list, outer: dict[str, Any]) -> list:
        """The outputs for ``values`` in the order of the body's inputs (``_ABSENT``: not given,
        read from ``outer`` like any other outer name)."""
        vals = self._template.copy()
        for name, i in self._outer:
            vals[i] = outer[name]
        for i, name, v in zip(self._input_slots, self.input_names, values):
            if i is not None:
                vals[i] = outer.get(name) if v is _ABSENT else v
        self._run_program(vals, outer, self._env)
        return [vals[i] for i in self._results]

    def bound(self, outer: dict[str, Any]) -> list:
        """The slots' starting values for every iteration of one Loop/Scan invocation: the
        constants and the values read from the enclosing graphs (which no iteration changes),
        filled once instead of every iteration."""
        base = self._template.copy()
        for name, i in self._outer:
            base[i] = outer[name]
        return base

    def run_bound(self, base: list, values: list, outer: dict[str, Any]) -> list:
        """The outputs of one iteration: ``values`` every input in order (none absent), on the
        slots ``bound`` gave."""
        vals = base.copy()
        for i, v in zip(self._input_slots, values):
            if i is not None:
                vals[i] = v
        self._run_program(vals, outer, self._env)
        return [vals[i] for i in self._results]

    def _env(self, vals: list, outer: dict[str, Any]) -> dict[str, Any]:
        """The names a nested If/Loop/Scan may read: the outer ones, then this body's so far."""
        env = dict(outer)
        env.update((name, vals[i]) for name, i in self._slots.items() if vals[i] is not None)
        return env


_ABSENT = object()
_TRUE = np.array(True)  # a Loop body's cond_in: true in every iteration that runs (read-only, as constants are)
_TRUE.setflags(write=False)


def _straight_line(program: tuple) -> Any:
    """``program`` (a body's steps) as one Python function ``run(vals, outer, env_of)`` with every
    slot number written in: step k becomes ``o = f_k([vals[3], vals[7]], a_k)`` and one store per
    named output.  A decoder's Loop runs its ~30 steps hundreds of times, and the generic loop
    over the steps (an argument list built by a comprehension, the outputs stored through zip)
    cost ~1 us a step, as much as a small kernel.  Only slot numbers and names of this module's
    making go into the source (``generated_code.function`` refuses anything else); the functions
    and attrs are the generated function's globals.  A
    step that gives fewer results than its outputs leaves the rest unset, as the loop did."""
    lines, names = ["def run(vals, outer, env_of):"], {"nd": np.ndarray}
    for k, (fn, attrs, ins, outs) in enumerate(program):
        names[f"f{k}"] = fn
        if attrs is _ENV:
            second = "env_of(vals, outer)"
        else:
            names[f"a{k}"] = attrs
            second = f"a{k}"
        args = ", ".join("None" if i is None else f"vals[{i}]" for i in ins)
        named = [(j, i) for j, i in enumerate(outs) if i is not None]
        if type(fn) is ShapeCached and ins and ins[0] is not None and len(outs) == 1 and named:
            # the input's shape seen before: its reshape written out; else the kernel (which records it)
            names[f"s{k}"] = fn.shapes
            lines += [f"    x = vals[{ins[0]}]",
                      f"    s = s{k}.get(x.shape) if type(x) is nd else None",
                      f"    if s is not None: vals[{outs[0]}] = x.reshape(s)",
                      "    else:",
                      f"        o = f{k}([{args}], {second})",
                      f"        if o: vals[{outs[0]}] = o[0]"]
            continue
        lines.append(f"    o = f{k}([{args}], {second})")
        if len(outs) == 1 and named:
            lines.append(f"    if o: vals[{outs[0]}] = o[0]")
        elif named:
            lines.append("    n = len(o)")
            lines.extend(f"    if n > {j}: vals[{i}] = o[{j}]" for j, i in named)
    lines.append("    return None")
    return generated_code.function(lines, names, "run")


def _empty_like_declared(value_info) -> np.ndarray:
    """A scan output of zero iterations: [0, *the body output's declared shape] of its declared type,
    as onnxruntime gives it, where the declaration is static; else a float [0]."""
    from onnx import helper

    t = value_info.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)) if t.elem_type else np.dtype(np.float32)
    except Exception:  # noqa: BLE001 - a type numpy has no name for
        dtype = np.dtype(np.float32)
    dims = list(t.shape.dim) if t.HasField("shape") else None
    if dims is None or not all(d.HasField("dim_value") and 0 <= d.dim_value <= 1 << 16 for d in dims):
        return np.empty((0,), dtype)
    return np.empty((0, *(d.dim_value for d in dims)), dtype)


def _compile_node(node, opsets: dict[str, int], consts: dict[str, Any]):
    """A body node as ``(fn, attrs)``: optcli's kernel, called ``fn(args, attrs)``; or, with attrs
    ``_ENV``, a nested control-flow op (its bodies folding over ``consts``, the enclosing bodies'
    constants) or onnx.reference for this one node, called ``fn(args, env)``."""
    if node.op_type in CONTROL_FLOW and node.domain in ("", "ai.onnx"):
        op = ControlFlow(node, opsets, consts)
        return op.run, _ENV
    if runs_optcli_kernel(node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        fn = _body_kernel(node.op_type, domain)
        attrs = StepAttrs({**attribute_values(node)[0], "_opset": int(opsets.get("", 0) or 0),
                           "_n_outputs": len(node.output)})
        if domain == "" and node.op_type in _SHAPE_ONLY and all(not n or n in consts for n in node.input[1:]):
            fn = ShapeCached(fn)
        return fn, attrs
    proto = node.SerializeToString(deterministic=True)
    names = list(node.input)
    return (lambda args, env: run_reference(proto, opsets, args, names)), _ENV


_SHAPE_ONLY = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_MAX_SHAPES = 64  # input shapes a shape-only step remembers (a dynamic dim could bring a new one every run)


class ShapeCached:
    """A shape-only body step (Reshape, Squeeze, Unsqueeze, Flatten) whose shape or axes are
    constants: its output is its input reshaped to a shape that depends on the input's shape
    alone, remembered per input shape the first time the kernel gives it.  The body's generated
    function (``_straight_line``) writes ``x.reshape(shapes[x.shape])`` for it and calls the
    kernel (through this object, which records the shape) only for a shape it has not seen: a
    decoder's Loop body holds seven of these, ~0.8 us each through the kernel's own memo, ~0.2
    inline.  The kernel still makes every first answer, so its checks and errors are as before."""

    __slots__ = ("fn", "shapes")

    def __init__(self, fn):
        self.fn, self.shapes = fn, {}

    def __call__(self, args: list, attrs) -> list:
        out = self.fn(args, attrs)
        x = args[0]
        if type(x) is np.ndarray and out and type(out[0]) is np.ndarray:
            if len(self.shapes) >= _MAX_SHAPES:
                self.shapes.clear()
            self.shapes[x.shape] = out[0].shape
        return out


def _body_kernel(op_type: str, domain: str):
    """The kernel a body node runs: the variant that fits any node (a body's nodes are not
    kernel-selected as the main graph's are), except where a kernel chooses among the variants by
    the shapes it is given (Conv: ``conv.conv_by_shape``)."""
    if (op_type, domain) == ("Conv", ""):
        from optcli.ops.conv import conv_by_shape

        return conv_by_shape
    return next(k for k in kernels_for(op_type, domain) if k.applies is None).fn


def _as_bool(v) -> bool:
    if type(v) is np.ndarray and v.ndim == 0:  # a Loop's condition every iteration
        return bool(v)
    a = np.asarray(v)
    if a.size != 1:
        raise IndexError(f"a condition holds {a.size} values; one is expected")
    return bool(a.reshape(-1)[0])


class ControlFlow:
    """One If, Loop or Scan node: its bodies compiled, ``run(args, env)`` with the node's explicit
    inputs as ``args`` and every value its bodies may read from outside in ``env``."""

    def __init__(self, node, opsets: dict[str, int], outer_consts: dict[str, Any] | None = None):
        import onnx

        self.op = node.op_type
        self.n_inputs, self.n_outputs = len(node.input), len(node.output)
        self.output_names = list(node.output)
        self.opset = int(opsets.get("", 0) or 0)
        self.attrs, _ = attribute_values(node)
        self.bodies = {a.name: Body(a.g, opsets, outer_consts) for a in node.attribute
                       if a.type == onnx.AttributeProto.GRAPH}
        needed = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}[self.op]
        missing = [n for n in needed if n not in self.bodies]
        if missing:
            raise ValueError(f"{self.op} has no {', '.join(missing)} graph")
        self.owned_carried: tuple[int, ...] = ()  # Loop: carried values the body updates in place
        if self.op == "Loop":
            body = self.bodies["body"]
            pairs = list(zip(body.input_names[2:], body.output_names[1:]))
            if len(body.input_names) >= 2 and len(pairs) == len(body.input_names) - 2:
                self.owned_carried = tuple(body.scatter_in_place(pairs))

    def bound(self, names: list[str]):
        """The node as a plan step's function of its inputs (``names``: the explicit inputs, then
        the outer values its bodies read): an environment of the named values, the explicit inputs
        padded to the node's count, the outputs the node names (None for an unnamed one)."""
        n_inputs = self.n_inputs
        named = tuple((k, name) for k, name in enumerate(names) if name)
        wanted = tuple(enumerate(bool(name) for name in self.output_names))
        padding = [None] * n_inputs

        def run(inputs: list) -> list:
            n = len(inputs)
            env = {name: inputs[k] for k, name in named if k < n and inputs[k] is not None}
            args = inputs[:n_inputs] if n >= n_inputs else [*inputs, *padding[n:]]
            outs = self.run(args, env)
            return [outs[k] if k < len(outs) and want else None for k, want in wanted]

        return run

    def run(self, args: list, env: dict) -> list:
        if self.op == "If":
            body = self.bodies["then_branch" if _as_bool(args[0]) else "else_branch"]
            return body.run({}, env)[:self.n_outputs]
        if self.op == "Loop":
            return self._loop(args, env)
        return self._scan(args, env)

    def _loop(self, args: list, env: dict) -> list:
        body = self.bodies["body"]
        m, cond, carried = args[0], (args[1] if len(args) > 1 else None), list(args[2:])
        names_in = body.input_names
        n_carried = len(names_in) - 2
        n_scans = len(body.output_names) - 1 - n_carried
        if n_carried < 0 or n_scans < 0 or len(carried) != n_carried:
            raise ValueError(f"Loop body takes {len(names_in)} inputs and gives {len(body.output_names)} outputs "
                             f"for {len(carried)} carried values")
        trips = None if m is None or np.asarray(m).size == 0 else int(np.asarray(m).reshape(-1)[0])
        go = True if cond is None or np.asarray(cond).size == 0 else _as_bool(cond)
        for k in self.owned_carried:  # the body writes into these: the Loop's own copies, not the caller's
            if carried[k] is not None:
                carried[k] = np.array(carried[k])
        scans: list[list] = [[] for _ in range(n_scans)]
        counter = _Counter("Loop")
        base = body.bound(env)
        it = 0
        while go and (trips is None or it < trips):
            counter.tick()
            outs = body.run_bound(base, [np.array(it, np.int64), _TRUE, *carried], env)
            go = _as_bool(outs[0])
            carried = outs[1:1 + n_carried]
            for k in range(n_scans):
                scans[k].append(np.asarray(outs[1 + n_carried + k]))
            it += 1
        empty = body.output_empty[1 + n_carried:]
        results = carried + [np.stack(s) if s else e for s, e in zip(scans, empty)]
        return results[:self.n_outputs]

    def _scan(self, args: list, env: dict) -> list:
        if self.opset < 9:
            return self._scan8(args, env)
        return self._scan_axes(args, env)

    def _scan_axes(self, args: list, env: dict, attrs: dict | None = None) -> list:
        """Scan 9+: N state values then M scan inputs, each sliced along its axis and direction."""
        attrs = self.attrs if attrs is None else attrs
        body = self.bodies["body"]
        m = int(attrs.get("num_scan_inputs", 0))
        n = len(args) - m
        if m <= 0 or n < 0:
            raise ValueError(f"Scan has num_scan_inputs {m} for {len(args)} inputs")
        k_out = len(body.output_names) - n
        in_axes = list(attrs.get("scan_input_axes") or [0] * m)
        in_dirs = list(attrs.get("scan_input_directions") or [0] * m)
        out_axes = list(attrs.get("scan_output_axes") or [0] * k_out)
        out_dirs = list(attrs.get("scan_output_directions") or [0] * k_out)
        if len(in_axes) != m or len(in_dirs) != m or len(out_axes) != k_out or len(out_dirs) != k_out or k_out < 0:
            raise ValueError("Scan's axes and directions do not match its scan inputs and outputs")
        scans_in = []
        for x, axis, direction in zip(args[n:], in_axes, in_dirs):
            x = np.asarray(x)
            axis = axis + x.ndim if axis < 0 else axis
            if not 0 <= axis < x.ndim:
                raise IndexError(f"Scan input axis {axis} is outside its input's {x.ndim} dims")
            x = np.moveaxis(x, axis, 0)
            scans_in.append(x[::-1] if direction else x)
        lengths = {x.shape[0] for x in scans_in}
        if len(lengths) != 1:
            raise IndexError(f"Scan inputs have different lengths along their scan axes: {sorted(lengths)}")
        steps = lengths.pop()
        states = list(args[:n])
        outs_k: list[list] = [[] for _ in range(k_out)]
        counter = _Counter("Scan")
        base = body.bound(env)
        for t in range(steps):
            counter.tick()
            outs = body.run_bound(base, [*states, *(x[t] for x in scans_in)], env)
            states = outs[:n]
            for k in range(k_out):
                outs_k[k].append(np.asarray(outs[n + k]))
        results = list(states)
        for k in range(k_out):
            if not outs_k[k]:
                results.append(np.empty((0,), np.float32))
                continue
            y = np.stack(outs_k[k][::-1] if out_dirs[k] else outs_k[k])
            axis = out_axes[k] + y.ndim if out_axes[k] < 0 else out_axes[k]
            if not 0 <= axis < y.ndim:
                raise IndexError(f"Scan output axis {out_axes[k]} is outside its output's {y.ndim} dims")
            results.append(np.moveaxis(y, 0, axis))
        return results[:self.n_outputs]

    def _scan8(self, args: list, env: dict) -> list:
        """Scan 8: a batch axis 0 on every input and output, ``sequence_lens`` first (optional): each
        batch row scanned alone along axis 1 (directions as in 9+), outputs past a row's length zero."""
        lens, rest = args[0], list(args[1:])
        m = int(self.attrs.get("num_scan_inputs", 0))
        n = len(rest) - m
        if m <= 0 or n < 0:
            raise ValueError(f"Scan has num_scan_inputs {m} for {len(rest)} inputs")
        batch = np.asarray(rest[0]).shape[0] if rest else 0
        seq = np.asarray(rest[n]).shape[1]
        lens = np.full(batch, seq, np.int64) if lens is None else np.asarray(lens).astype(np.int64).reshape(-1)
        if lens.shape != (batch,) or (lens.size and (lens.min() < 1 or lens.max() > seq)):  # 1..seq, as onnxruntime
            raise IndexError(f"Scan sequence_lens {lens.tolist()[:8]} do not fit batch {batch}, lengths 1..{seq}")
        directions = list(self.attrs.get("directions") or [0] * m)
        attrs = {"num_scan_inputs": m, "scan_input_directions": directions}
        rows = []
        for b in range(batch):
            row = [np.asarray(v)[b] for v in rest[:n]] + [np.asarray(v)[b, :lens[b]] for v in rest[n:]]
            rows.append(self._scan_axes(row, env, attrs))
        results = []
        for k in range(len(rows[0]) if rows else 0):
            if k < n:
                results.append(np.stack([r[k] for r in rows]))
                continue
            padded = [np.concatenate([r[k], np.zeros((seq - r[k].shape[0], *r[k].shape[1:]), r[k].dtype)])
                      for r in rows]  # every row made at least one step (lengths 1..seq)
            results.append(np.stack(padded))
        return results[:self.n_outputs]
