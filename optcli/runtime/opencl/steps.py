"""Prepare and run the GPU part of a plan on an OpenCL device.

Every buffer size and launch grid comes from shapes the runtime derives itself from the input
shapes (``runtime.plan_shapes`` at load, ``runtime.gpu_common.bind_shapes`` per input shape), never from the
shapes the file records.  A *binding* (per input shape; a plan with static inputs has one):
every device value gets a buffer (values whose lifetimes do not overlap share one, by best fit),
weights are re-laid and uploaded once by the kernels' launch functions, programs are built (or
fetched from the binary cache) and kernel arguments bound.  A plan with static inputs is bound at
load when its device buffers take at most ``LOAD_BIND_BYTES``, else at its first run, so what a
load allocates follows the file's size, not the sizes the file declares.  At most
``MAX_PROGRAMS`` distinct programs are built per plan.  At run time a GPU step is only an
enqueue; ``Upload`` copies a host array into its device buffer without waiting (after checking
its shape against the derived one), and ``Download`` is the one read the host waits for (a polled
wait, ``opencl/waits.py``: Ctrl-C and ``Predictor.cancel`` end it): host syncs happen only at
target borders.

*Data points*: a device value whose size follows from data (a Range or Slice bound by a run-time
value, NonZero) cannot be sized from the input shapes.  The binding leaves the GPU steps that
touch such values unbound; at the first of them (the data point) the host steps that make the
data have run, so the later shapes are derived from it (``bind_shapes.derive_at_data_point``), a
binding for them is made or taken from the cache, and the device values alive across the point
are copied into its buffers.  The next call starts on that binding, so repeated data costs no
copy.  Sizes the device cannot take (an empty value) run that call on the host instead.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from optcli import native
from optcli.errors import InputError, NbFormatError
from optcli.gpu.ops_layout import TRANSFER_OPS
from optcli.gpu.registry import get_gpu_kernel
from optcli.plan import Plan, Step
from optcli.runtime.gpu_common.bind_shapes import (
    DataPointRefusal,
    GpuRefusal,
    derive_at_data_point,
    derive_device_shapes,
)
from optcli.runtime.gpu_common.device_buffers import LINEAR_OPS, device_values, share_buffers, to_storage
from optcli.runtime.host.steps import StepError
from optcli.runtime.opencl.device import BoundLaunch, ClDevice, ClLaunchContext, cl
from optcli.runtime.opencl.waits import drain, wait_for
from optcli.runtime.plan_shapes import Derivation
from optcli.runtime.run_control import RunStop

if cl is not None:
    import pyopencl.array as cl_array

__all__ = ["GpuRefusal", "OpenClSteps", "LINEAR_OPS", "LOAD_BIND_BYTES", "MAX_PROGRAMS"]

MAX_PROGRAMS = 64  # distinct programs (kernel source + defines) one plan may build
LOAD_BIND_BYTES = 256 << 20  # device buffers a static plan may allocate at load; beyond, at its first run


class TooManyPrograms(GpuRefusal):
    """The plan asks for more than ``MAX_PROGRAMS`` distinct programs."""


class OpenClSteps:
    """The prepared GPU steps of one plan on one device.

    A plan whose device values all have static shapes is bound once, at load.  A plan with
    symbolic dims on the device (``dynamic``) is bound per input shape: ``bind_inputs`` derives
    every device value's shape (``runtime.gpu_common.bind_shapes``), then builds buffers and launches for
    them, or takes them from a cache of the last ``MAX_BINDINGS`` input shapes.  Programs are
    keyed by source and defines, and sizes are kernel arguments, so a new shape builds no program;
    weights are uploaded once and shared by every binding whose launch re-lays them the same.
    ``shapes``, ``buffers``, ``ctx``, ``bound`` and ``device_bytes`` are the current binding's."""

    tunable = True  # opencl.tuning times its kernel variants
    MAX_BINDINGS = 8  # input shapes whose buffers and bound launches are kept (least recently used go)

    def __init__(self, plan: Plan, dev: ClDevice, precision: str, gpu_targets: set[str], source: str = "model",
                 derivation: Derivation | None = None):
        self.plan, self.dev, self.precision, self.source = plan, dev, precision, source
        self.queue = dev.new_queue()  # one queue per predictor
        self.storage = np.dtype(np.float16 if precision == "fp16" else np.float32)
        self.gpu_indices = [i for i, s in enumerate(plan.steps) if s.target in gpu_targets]
        self._keep: list[Any] = []  # host arrays (and their copies' events) the queued commands use
        self._abandoned: list[tuple[Any, list[Any]]] = []  # (marker, what _keep held) of runs left early
        self.stop: RunStop | None = None  # the running call's stop flag (cancel, deadline), seen in waits
        self.events: list | None = None  # (step index, cl.Event) of every enqueue, while profiling
        self.outputs_on_device = False
        self.graph_outputs = {v.name for v in plan.outputs}
        self.shared_weights: dict[str, tuple[str, Any]] = {}  # weight key -> (digest, device buffer)
        self.programs: set[tuple] = set()  # (source, defines) of every program this plan asked for
        self._bindings: OrderedDict[tuple, _Binding | str] = OrderedDict()
        # Values whose shapes the device steps need: their buffers, and the host arrays Download makes.
        self.device_names = set(device_values(plan, self.gpu_indices, _AnyShape(), 1)) | {
            plan.steps[i].outputs[0] for i in self.gpu_indices if plan.steps[i].op_type == "Download"}
        self.static_inputs = ({v.name: tuple(v.shape) for v in plan.inputs}
                              if all(v.is_static for v in plan.inputs) else None)
        self.dynamic = self.static_inputs is None  # bound per input shape at run
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.buffers: dict[str, Any] = {}
        self.sizes: dict[str, int] = {}
        self.device_bytes = 0
        self.ctx: ClLaunchContext | None = None
        self.bound: dict[int, list[BoundLaunch]] = {}
        self._static_shapes: dict[str, tuple[int, ...]] | None = None
        self._static_unknown: tuple[str, ...] = ()
        self._data_point: int | None = None  # the next step to bind from data in this run (see run_step)
        self._input_key: tuple = ()
        self._last_completed: dict[tuple, tuple] = {}  # input key -> key of the binding its data chose last
        self._written: dict[int, set[str]] = {}
        if self.static_inputs is not None:
            self._static_shapes, self._static_unknown = self._derive_static(derivation)
            values = device_values(plan, self._sized_steps(self._static_unknown), self._static_shapes,
                                   self.storage.itemsize)
            if sum(nbytes for _, _, nbytes in values.values()) <= LOAD_BIND_BYTES:
                refusal = self.bind_inputs(self.static_inputs)
                if refusal:
                    raise GpuRefusal(refusal)

    def _derive_static(self, derivation: Derivation | None) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
        """Device shapes of a plan with static inputs, from the load's derivation, and the device
        values whose shapes follow from data instead."""
        try:
            derived = derive_device_shapes(self.plan, self.static_inputs, self.device_names, self.gpu_indices,
                                           self.source, derivation)
        except InputError as exc:  # the file's own input shapes do not fit its steps
            raise NbFormatError(f"{exc}; the file is corrupted or crafted") from None
        if derived.shapes is None:
            raise GpuRefusal(derived.reason)
        return derived.shapes, derived.unknown

    def bind_inputs(self, input_shapes: dict[str, tuple[int, ...]]) -> str:
        """Make the binding for these input shapes current; '' when done, else why the device cannot
        run them (the caller runs the call on the host).  Raises ``InputError`` for shapes the model
        cannot take.  A plan with static inputs has one binding, made at load or at its first run."""
        if self._static_shapes is not None:
            input_shapes = self.static_inputs  # the caller checked the inputs (a raw buffer has no shape)
        key = tuple((k, tuple(v)) for k, v in sorted(input_shapes.items()))
        binding = self._bindings.get(key)
        if binding is None:
            unknown: tuple[str, ...] = ()
            if self._static_shapes is not None:
                shapes: dict | str = self._static_shapes
                unknown = self._static_unknown
            else:
                derived = derive_device_shapes(self.plan, input_shapes, self.device_names, self.gpu_indices,
                                               self.source)
                shapes = derived.shapes if derived.shapes is not None else derived.reason
                unknown = derived.unknown
            try:
                binding = self._bind(shapes, unknown) if isinstance(shapes, dict) else shapes
            except TooManyPrograms as exc:
                binding = str(exc)
            self._remember(key, binding)
        self._bindings.move_to_end(key)
        if isinstance(binding, str):
            return binding
        self._input_key = key
        completed = self._bindings.get(self._last_completed.get(key, ()))
        # A plan with data points: the binding the last call's data chose has the same shapes up to
        # the first data point, so it serves from the start and, when the data repeats, throughout.
        self._activate(completed if isinstance(completed, _Binding) else binding)
        self._data_point = binding.data_point
        return ""

    def _remember(self, key: tuple, binding) -> None:
        self._bindings[key] = binding
        while len(self._bindings) > self.MAX_BINDINGS:
            self._bindings.popitem(last=False)  # its buffers are released with it

    # ------------------------------------------------------------- data points
    def _next_point(self, unknown: tuple[str, ...], after: int = -1) -> int | None:
        """The first GPU step after ``after`` that reads or writes a value sized by data."""
        names = set(unknown)
        return next((i for i in self.gpu_indices if i > after
                     and names & {*self.plan.steps[i].inputs, *self.plan.steps[i].outputs}), None)

    def _written_before(self, k: int) -> set[str]:
        """Values the steps before ``k`` write (their shapes did not come from data at ``k``)."""
        if k not in self._written:
            self._written[k] = {n for step in self.plan.steps[:k] for n in step.outputs if n}
        return self._written[k]

    def _sized_steps(self, unknown: tuple[str, ...]) -> list[int]:
        """The GPU steps that touch no value sized by data."""
        names = set(unknown)
        return [i for i in self.gpu_indices if not names & {*self.plan.steps[i].inputs, *self.plan.steps[i].outputs}]

    def _bind_from_data(self, k: int, env: dict[str, Any]) -> None:
        """At data point ``k`` (the steps before it have run): derive the later device values'
        shapes from the data (``bind_shapes.derive_at_data_point``), and make a binding with them
        current, unless the current one already has exactly these shapes.  Device values alive
        across ``k`` are copied into the new binding's buffers."""
        derived = derive_at_data_point(self.plan, k, env, self.shapes, self.device_names, self.gpu_indices,
                                       self.source)
        if derived.shapes is None:
            raise DataPointRefusal(derived.reason)
        next_point = self._next_point(derived.unknown, after=k)
        if all(self.shapes.get(n) == shape for n, shape in derived.shapes.items()) and \
                all(n in self.shapes for n in derived.shapes):
            self._data_point = next_point
            return
        before = self._written_before(k)
        shapes = {**{n: s for n, s in self.shapes.items() if n in before}, **derived.shapes}
        key = (self._input_key, tuple(sorted(shapes.items())))
        binding = self._bindings.get(key)
        if not isinstance(binding, _Binding):
            try:
                binding = self._bind(shapes, derived.unknown, from_data=True)
            except TooManyPrograms as exc:
                raise DataPointRefusal(str(exc)) from None
            self._remember(key, binding)
        self._bindings.move_to_end(key)
        lifetimes = self.plan.memory.lifetimes
        for name, buffer in self.buffers.items():
            first, last = lifetimes.get(name, (k, k))
            target = binding.buffers.get(name)
            if first < k <= last and target is not None and target is not buffer:
                cl.enqueue_copy(self.queue, target, buffer, byte_count=self.sizes[name])
        self._activate(binding)
        self._last_completed[self._input_key] = key
        self._data_point = next_point

    def _bind(self, shapes: dict[str, tuple[int, ...]], unknown: tuple[str, ...] = (),
              from_data: bool = False) -> _Binding:
        """Buffers and bound launches for ``shapes``; the GPU steps that touch an ``unknown`` value
        (sized by data) are left for the data point (``data_point``: the first of them).  Plans
        bound more than once (dynamic dims, data points) share their uploaded weights."""
        data_point = self._next_point(unknown)
        indices = self._sized_steps(unknown)
        values = device_values(self.plan, indices, shapes, self.storage.itemsize)
        buffers, nbytes = share_buffers(values, self._new_buffer)
        shared = self.shared_weights if self.dynamic or data_point is not None or from_data else None
        ctx = ClLaunchContext(self.dev, shapes, self.plan.weights, buffers, self.precision, shared)
        binding = _Binding(shapes, buffers, nbytes, ctx, {}, {n: b for n, (_, _, b) in values.items()}, data_point)
        previous = self._current()
        self._activate(binding)
        try:
            for i in indices:
                step = self.plan.steps[i]
                if step.op_type not in TRANSFER_OPS:
                    binding.bound[i] = self.bind_step(i, get_gpu_kernel(step.kernel))
        finally:
            if previous is not None:
                self._activate(previous)
        return binding

    def _current(self) -> _Binding | None:
        if self.ctx is None:
            return None
        return _Binding(self.shapes, self.buffers, self.device_bytes, self.ctx, self.bound, self.sizes)

    def _activate(self, b: _Binding) -> None:
        self.shapes, self.buffers, self.device_bytes, self.ctx, self.bound, self.sizes = (
            b.shapes, b.buffers, b.device_bytes, b.ctx, b.bound, b.sizes)

    def bind_step(self, i: int, kern, local_size: tuple[int, ...] | None = None) -> list[BoundLaunch]:
        """Launches of step ``i`` with kernel ``kern``, bound to this plan's buffers.  A work-group
        size (from tuning) applies to the launches whose grid it divides."""
        step = self.plan.steps[i]
        self.ctx.namespace = kern.id
        bound = []
        for launch in kern.launch(self.ctx, step):
            self._count_program(launch, step)
            if local_size is not None:
                local = _fit_local(local_size, launch.global_size)
                if local is not None:
                    launch.local_size = local
            bound.append(self.ctx.bind(launch, f"step {i} {step.name}"))
        return bound

    def _count_program(self, launch, step: Step) -> None:
        """Refuse a program beyond ``MAX_PROGRAMS`` before it is built: a file cannot make a load
        compile without bound (defines are a finite set per kernel, but a file has many steps)."""
        key = (launch.source, tuple(sorted((k, repr(v)) for k, v in launch.defines.items())))
        if key in self.programs:
            return
        if len(self.programs) >= MAX_PROGRAMS:
            raise TooManyPrograms(f"its GPU steps need more than {MAX_PROGRAMS} distinct programs (step "
                                  f"'{step.name[:60]}' would build one more)")
        self.programs.add(key)

    def enable_profiling(self) -> None:
        """Enqueue on a profiling queue from now on and keep each step's events in ``events``
        (``optcli bench`` reads their device times)."""
        self.finish()
        self.queue = self.dev.new_queue(profiling=True)
        self.events = []

    # ------------------------------------------------------------------ buffers
    def _new_buffer(self, nbytes: int):
        return cl.Buffer(self.dev.context, cl.mem_flags.READ_WRITE, nbytes)

    # -------------------------------------------------------------------- running
    def run_step(self, i: int, step: Step, env: dict[str, Any]) -> None:
        if i == self._data_point:  # the sizes from here on follow from data the steps before made
            self._bind_from_data(i, env)
        queue, record = self.queue, self._record(i)
        if step.op_type == "Upload":
            value = env[step.inputs[0]]
            if isinstance(value, cl.Buffer):  # raw device buffer, plain NCHW in storage precision
                nbytes = int(np.prod(self.shapes[step.outputs[0]], dtype=np.int64)) * self.storage.itemsize
                record(cl.enqueue_copy(queue, self.buffers[step.outputs[0]], value, byte_count=nbytes))
                return
            if isinstance(value, cl_array.Array):  # already on this device: copy on the device
                record(cl.enqueue_copy(queue, self.buffers[step.outputs[0]], self._device_input(value, step).data))
                return
            host = to_storage(value, self.storage)  # (ascontiguousarray would make 0-d 1-d)
            if host.shape != self.shapes[step.outputs[0]]:
                # The device buffer was sized from the plan: never copy more (or less) into it.
                raise StepError(f"step {i} {step.name}: '{step.inputs[0]}' has shape {list(host.shape)} at run time, "
                                f"the GPU plan was made for {list(self.shapes[step.outputs[0]])}")
            self._keep.append(host)  # alive until the copy is done (the run's end at the latest)
            record(cl.enqueue_copy(queue, self.buffers[step.outputs[0]], host, is_blocking=False))
        elif step.op_type == "Download":
            shape = self.shapes[step.outputs[0]]
            if self.outputs_on_device and step.outputs[0] in self.graph_outputs:
                out = cl_array.empty(queue, shape, self.storage)
                record(cl.enqueue_copy(queue, out.data, self.buffers[step.inputs[0]]))
                env[step.outputs[0]] = out
                return
            host = np.empty(shape, dtype=self.storage)
            event = cl.enqueue_copy(queue, host, self.buffers[step.inputs[0]], is_blocking=False)
            # Both kept until the copy is done, even if the wait is left: the device writes ``host``, and
            # dropping pyopencl's event of a copy to host memory waits for the copy (a wait we left).
            self._keep += [host, event]
            record(event)
            wait_for(queue, event, self.stop)  # comes back to Python: Ctrl-C and cancel work here
            self._keep.clear()  # the queue is in order: every copy before this one is done too
            described = self.plan.values.get(step.outputs[0])
            dtype = described.dtype if described is not None else "float32"  # float32, or bool stored as 0/1
            dtype = np.dtype(dtype if dtype != "unknown" else np.float32)
            widened = native.from_half(host) if host.dtype == np.float16 and dtype == np.float32 else None
            env[step.outputs[0]] = widened if widened is not None else host.astype(dtype, copy=False)
        else:
            for launch in self.bound[i]:
                record(launch.enqueue(queue))

    def _record(self, i: int):
        events = self.events
        if events is None:
            return _ignore
        return lambda event: events.append((i, event))

    def _device_input(self, value, step: Step):
        if value.dtype != self.storage:
            value = value.astype(self.storage)  # on the device, in this predictor's queue
        if tuple(value.shape) != self.shapes[step.outputs[0]]:
            raise ValueError(f"device input for '{step.inputs[0]}' has shape {value.shape}")
        return value if value.flags.c_contiguous else value.copy()

    def finish(self) -> None:
        """Wait for the run's commands (coming back to Python while waiting: ``waits``)."""
        try:
            drain(self.queue, self.stop)
        except BaseException:  # cancelled, interrupted, or the device failed: never free what it may use
            self.abandon()
            raise
        self._keep.clear()
        self._abandoned.clear()  # in order: what earlier runs left queued is done too

    def abandon(self) -> None:
        """Leave a run without waiting (it raised, or was cancelled): the host arrays its queued
        commands read or write stay alive, behind a marker, until a later wait sees them done (for
        good where the device cannot take a marker any more: a lost device)."""
        if self._keep:
            try:
                marker = cl.enqueue_marker(self.queue)
                self.queue.flush()
            except Exception:  # the device is gone: the arrays live as long as this object
                marker = None
            self._abandoned.append((marker, self._keep))
            self._keep = []
        self._abandoned = [(m, a) for m, a in self._abandoned if not _done(m)]

    def release(self) -> None:
        """Drop every device buffer, bound launch and uploaded weight (the predictor stopped using
        this device): their memory goes back as soon as nothing else holds them."""
        self.abandon()  # host arrays still queued stay alive (a lost device may still touch them)
        self._bindings.clear()
        self.shared_weights.clear()
        self.buffers, self.bound, self.ctx, self.device_bytes = {}, {}, None, 0


@dataclass
class _Binding:
    """Buffers and bound launches of one set of shapes."""

    shapes: dict[str, tuple[int, ...]]
    buffers: dict[str, Any]
    device_bytes: int
    ctx: Any
    bound: dict[int, list[BoundLaunch]]
    sizes: dict[str, int]  # bytes of each device value's contents (copied at a data point)
    data_point: int | None = None  # the first GPU step whose sizes follow from data (bound then)


class _AnyShape(dict):
    """Shapes of unknown values: lists device values without sizing them (1 element each)."""

    def __missing__(self, key):
        return (1,)


def _done(marker) -> bool:
    """Whether a marker's commands are complete (no: a lost device's, which may never say)."""
    try:
        return marker is not None and marker.command_execution_status == cl.command_execution_status.COMPLETE
    except Exception:
        return False


def _ignore(event) -> None:
    pass


def _fit_local(local: tuple[int, ...], grid: tuple[int, ...]) -> tuple[int, ...] | None:
    """``local`` reshaped to the grid's rank, or None when it does not divide the grid (OpenCL 1.2
    needs uniform work-groups)."""
    if len(grid) == 1:
        local = (int(np.prod(local)),)
    elif len(local) != len(grid):
        local = (tuple(local) + (1, 1, 1))[: len(grid)]
    if all(g % sz == 0 for g, sz in zip(grid, local)):
        return tuple(local)
    return None
