"""Predictor: a loaded `.nb` ready to run.

``optcli.load`` builds one: the plan's steps are checked against their ops and every value's shape
is derived from the inputs, executing nothing (``runtime.plan_shapes``); the GPU part is sized
from that derivation only.  ``run`` checks the inputs (names, dtypes, ranks, fixed dims, and that
a symbolic dim has one size across all inputs), executes the plan and returns the outputs.
Plans with dynamic dims are re-planned per new input shape (memory offsets from the observed
sizes) and the result cached, so a repeated shape costs nothing extra; their GPU steps are bound
per input shape too (shapes derived by the runtime, buffers and launches cached for the last
``OpenClSteps.MAX_BINDINGS`` shapes, no program built again).

Threads: a Predictor may be shared by threads.  ``run`` holds the predictor's lock for the whole
run (the GPU queue, the device buffers and the BLAS thread limit are per predictor), so calls on
one predictor serialise; for parallel throughput give each thread its own predictor.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from optcli.errors import DeviceError, InputError, KernelError, TargetError, UsageError
from optcli.ir import Value
from optcli.nb.layout import SUPPORTED_DTYPES
from optcli.plan import PRECISIONS, Plan
from optcli.plan_memory_core import MemoryPlan, plan_offsets
from optcli.runtime import backends
from optcli.runtime.executor import Executor
from optcli.runtime.gpu_common.bind_shapes import GpuRefusal
from optcli.runtime.load_checks import check_at_load
from optcli.runtime.run_control import RunStop
from optcli.targets import TARGETS, get_target

_WARNED: set[str] = set()
# Notices about where the GPU steps run go to the "optcli" logger: with no logging set up, Python
# prints them as the bare message, one line on stderr (a warnings.warn line would show our source
# file and line instead of the reason).  Silence with logging.getLogger("optcli").setLevel(logging.ERROR).
LOG = logging.getLogger("optcli")


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        LOG.warning(message)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple
    dtype: str

    @classmethod
    def of(cls, v: Value) -> TensorInfo:
        return cls(v.name, tuple(v.shape) if v.shape is not None else (), v.dtype)


class Predictor:
    def __init__(self, plan: Plan, header: dict, source: str, targets=None, precision: str | None = None,
                 threads: int | None = None, require_gpu: bool = False, device: str | None = None,
                 tune: str | None = None):
        self.plan, self.header, self.source = plan, header, source
        if precision is not None and precision not in PRECISIONS:
            raise UsageError(f"precision '{precision}' is not available; use one of: {', '.join(PRECISIONS)}")
        self.precision = precision or plan.metadata.get("precision", "fp32")
        wanted = [get_target(t).name for t in (targets or plan.targets)]
        self.targets = [t for t in plan.targets if t in wanted] or ["arm"]
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise UsageError(f"threads must be a positive whole number, got {threads!r}")
        self.threads = threads
        self.require_gpu = require_gpu
        # The runtime's own shapes: the steps checked against their ops and every value's shape
        # derived from the inputs (nothing executed); the recorded shapes only compared.
        self.derivation = check_at_load(plan, source)
        self.gpu = self._start_gpu(require_gpu, device)
        self.tuning = {}
        if tune is not None and self.gpu is not None and self.gpu.tunable:
            from optcli.runtime.opencl.tuning import tune as run_tuning

            self.tuning = run_tuning(self.gpu, tune)
        self._executor = Executor(plan, self.gpu)
        self._cpu_executor: Executor | None = None  # calls whose input shapes the GPU plan cannot run
        self._lock = threading.Lock()  # one run at a time: kernels share nothing, but BLAS limits do
        self._running: RunStop | None = None  # the stop flag of the run in progress
        self._shape_plans: dict[tuple, MemoryPlan] = {}
        self._limiter = _thread_limiter(threads)
        # run()'s fast path: (name, dtype, shape) of each input when every one has a known dtype and a
        # static shape; a feed of exactly those numpy arrays needs no other check (issue 25: the
        # checks cost more than a small model's kernels).
        self._exact = ([(v.name, np.dtype(v.dtype), tuple(v.shape)) for v in plan.inputs]
                       if all(v.is_static and v.dtype != "unknown" for v in plan.inputs) else None)
        # the same for a plan with dynamic dims: the (name, dtype, shape) of the last numpy feeds
        # ``_check_inputs`` accepted, whose verdict depends on nothing else (a voice detector with
        # a symbolic batch dim spent ~7 us of its ~95 us run in those checks, every run)
        self._accepted: list | None = None

    def _start_gpu(self, require_gpu: bool, device: str | None):
        """Prepare the plan's GPU steps with the first backend (``runtime.backends.BACKENDS``) that
        runs here, or say why the CPU runs them."""
        gpu_targets = {s.target for s in self.plan.steps if TARGETS[s.target].device == "gpu"}
        usable = {t for t in gpu_targets if t in self.targets and t in backends.BACKENDS}
        if not gpu_targets:
            if require_gpu:
                raise TargetError(f"{self.source}: require_gpu=True, but the plan has no GPU steps; optimize "
                                  "with --valid_targets=opencl,arm")
            return None
        reason = None
        if not usable:
            why = ("load(targets=...) leaves out" if not gpu_targets & set(self.targets)
                   else "this runtime cannot drive on this machine")
            reason = f"the plan's GPU steps are for {', '.join(sorted(gpu_targets))}, which {why}"
        else:
            target = next(t for t in backends.BACKENDS if t in usable)
            try:
                return backends.start(target, self.plan, self.precision, usable, self.source, self.derivation,
                                      device)
            except backends.BackendUnavailable as exc:
                reason = str(exc)
        if require_gpu:
            raise TargetError(f"{self.source}: require_gpu=True, but {reason}")
        _warn_once(f"optcli: running the GPU steps on the CPU: {reason}")
        return None

    # ----------------------------------------------------------------- describing
    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo.of(v) for v in self.plan.inputs]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo.of(v) for v in self.plan.outputs]

    def memory_plan(self, shapes: dict[str, tuple] | None = None) -> MemoryPlan | None:
        """The memory plan for static plans, or the one cached for these input shapes."""
        if self.plan.memory.arena_bytes is not None:
            return self.plan.memory
        if shapes is None:
            return None
        return self._shape_plans.get(tuple(tuple(shapes[v.name]) for v in self.plan.inputs))

    # -------------------------------------------------------------------- running
    def run(self, feeds, outputs_on_device: bool = False, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Run the model.  ``feeds``: {name: array} or a list in input order; arrays may be numpy
        arrays or, for inputs the GPU reads, pyopencl arrays already on this predictor's device
        (``self.context``): a camera frame on the GPU then never crosses to the host.  With
        ``outputs_on_device=True`` outputs the GPU produces come back as pyopencl arrays.
        ``timeout_s``: a deadline; past it the run ends with ``RunLimitError`` (seen between steps,
        in device waits and in a Loop's or Scan's iterations; a host kernel in progress finishes)."""
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise UsageError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if outputs_on_device and self.gpu is None:
            raise UsageError("outputs_on_device=True needs the plan's GPU steps running on a GPU; this predictor "
                             "runs on the CPU")
        arrays = self._exact_inputs(feeds)
        if arrays is None:
            arrays = self._check_inputs(feeds)
            if self._exact is None:
                self._accepted = _signature(arrays, self.plan.inputs)
        record = key = None
        if self.plan.memory.arena_bytes is None:  # dynamic sizes: a memory plan per input shape
            key = tuple(tuple(getattr(arrays[v.name], "shape", v.shape)) for v in self.plan.inputs)
            record = {} if key not in self._shape_plans else None
        with self._lock, self._limiter:
            self._running = stop = RunStop(timeout_s)
            try:
                outputs = self._run_locked(arrays, record, outputs_on_device, stop)
            except KernelError as exc:
                raise self._blame(arrays, exc) from exc
            finally:
                self._running = None
                stop.close()
        if record is not None:
            self._replan(key, arrays, record)
        return {k: _owned(v) for k, v in outputs.items()}

    def _blame(self, arrays: dict, exc: KernelError) -> Exception:
        """Whose fault a host kernel's crash is.  Static input shapes were checked against every
        step at load, so there it is ours.  Dynamic or undeclared ones: when the steps' shape rules
        refuse the inputs' concrete shapes (a rank a Conv cannot take, dims that do not
        broadcast), it is the input's, an ``InputError``; else ours (``KernelError``)."""
        if all(v.is_static for v in self.plan.inputs):
            return exc
        from optcli.runtime.gpu_common.bind_shapes import describe_inputs
        from optcli.runtime.plan_shapes import derive

        shapes = {v.name: tuple(getattr(arrays[v.name], "shape", ())) for v in self.plan.inputs}
        derived = derive(self.plan, shapes)
        if not derived.strict_error:
            return exc
        return InputError(f"{self.source}: input shapes {describe_inputs(shapes)} do not fit the model: "
                          f"{derived.strict_error}")

    def cancel(self) -> None:
        """Stop the run in progress, from another thread (as onnxruntime's ``RunOptions.terminate``):
        it raises ``Cancelled`` between two steps, or within 10 ms while it waits for the OpenCL
        device (the device finishes what was queued in the background; the predictor stays usable).
        A host kernel already running finishes first.  With no run in progress it does nothing."""
        running = self._running
        if running is not None:
            running.cancel()

    def _run_locked(self, arrays, record, outputs_on_device: bool, stop: RunStop) -> dict:
        """One run; a device failure mid-run (lost device, out of resources) never yields a partial
        or wrong answer: the predictor drops its GPU for good, warns, and runs the call again on the
        CPU, or raises ``DeviceError`` where the CPU cannot stand in (``require_gpu=True``, inputs or
        outputs on the device)."""
        if self.gpu is None:
            return self._executor.run(arrays, record, stop)
        self.gpu.outputs_on_device = outputs_on_device
        self.gpu.stop = stop
        try:
            refusal = self._bind_gpu(arrays, outputs_on_device)
            if refusal:
                return self._host_executor().run(arrays, record, stop)
            try:
                return self._executor.run(arrays, record, stop)
            except GpuRefusal as exc:  # at a data point: the sizes the data gave do not fit the device
                self._refuse_call(f"{self.source}: the sizes computed at run time cannot run on the GPU: {exc}",
                                  arrays, outputs_on_device, "run it without require_gpu to let the CPU take it")
                if record is not None:
                    record.clear()  # sizes from the abandoned run are incomplete
                return self._host_executor().run(arrays, record, stop)
        except Exception as exc:
            failure = _device_failure(exc)
            if failure is None:
                raise
        reason = f"{_describe_gpu(self.gpu)} failed during run ({type(failure).__name__}: {_first_line(failure)})"
        self.gpu.release()
        self.gpu = None  # later calls, and this one, run on the CPU: the device state is unknown
        self._executor = Executor(self.plan, None)
        on_device = outputs_on_device or any(_is_device_buffer(a) or _is_device_array(a) for a in arrays.values())
        if self.require_gpu or on_device:
            why = "require_gpu=True" if self.require_gpu else "its inputs or outputs live on the device"
            raise DeviceError(f"{self.source}: {reason}; the call cannot run on the CPU instead ({why}). "
                              "Load the model again to retry the device") from None
        LOG.warning(f"optcli: {self.source}: {reason}; this predictor now runs on the CPU")
        if record is not None:
            record.clear()  # sizes from the failed run are incomplete
        return self._executor.run(arrays, record, stop)

    def _bind_gpu(self, arrays: dict, outputs_on_device: bool) -> str:
        """Bind the GPU steps to these input shapes (plans with dynamic dims; ``OpenClSteps.bind_inputs``).
        '' when the device runs the call, else why the host runs it (warned once per reason)."""
        shapes = {v.name: tuple(getattr(arrays[v.name], "shape", ())) for v in self.plan.inputs}
        refusal = self.gpu.bind_inputs(shapes)
        if not refusal:
            return ""
        from optcli.runtime.gpu_common.bind_shapes import describe_inputs

        self._refuse_call(f"{self.source}: the GPU plan cannot run input shapes {describe_inputs(shapes)}: {refusal}",
                          arrays, outputs_on_device, "optimize with --input_shapes set to these shapes to get a "
                                                     "plan for them")
        return refusal

    def _refuse_call(self, reason: str, arrays: dict, outputs_on_device: bool, advice: str) -> None:
        """The device cannot run this call: warn (once per reason) that the CPU runs it, or raise
        ``TargetError`` where the CPU cannot stand in."""
        on_device = outputs_on_device or any(_is_device_buffer(a) or _is_device_array(a) for a in arrays.values())
        if self.require_gpu or on_device:
            why = "require_gpu=True" if self.require_gpu else "its inputs or outputs live on the device"
            raise TargetError(f"{reason}; the call cannot run on the CPU instead ({why}). "
                              f"{advice[0].upper()}{advice[1:]}")
        _warn_once(f"optcli: {reason}; running those calls on the CPU")

    def _host_executor(self) -> Executor:
        if self._cpu_executor is None:
            self._cpu_executor = Executor(self.plan, None)
        return self._cpu_executor

    @property
    def context(self):
        """The pyopencl context of the GPU steps (None on the CPU): make device inputs with it."""
        return self.gpu.dev.context if self.gpu is not None else None

    @property
    def queue(self):
        """This predictor's command queue (None on the CPU)."""
        return self.gpu.queue if self.gpu is not None else None

    def _replan(self, key: tuple, feeds: dict[str, np.ndarray], sizes: dict[str, int]) -> None:
        mem = self.plan.memory
        sizes = {**{k: getattr(a, "nbytes", 0) for k, a in feeds.items()}, **sizes}
        sizes = {k: s for k, s in sizes.items() if k in mem.lifetimes}
        offsets, arena = plan_offsets({k: mem.lifetimes[k] for k in sizes}, sizes)
        self._shape_plans[key] = MemoryPlan(mem.lifetimes, mem.free_after, offsets, sizes, arena,
                                            sum(sizes.values()))

    def _exact_inputs(self, feeds) -> dict[str, np.ndarray] | None:
        """The feeds by name when they are exactly what a static plan declares (numpy arrays of its
        dtypes and shapes, in a list or a dict): the common case, checked in a few hundred ns.  None
        otherwise, and ``_check_inputs`` decides (and says what is wrong)."""
        exact = self._exact or self._accepted
        if exact is None:
            return None
        result = {}
        if type(feeds) is dict:  # (a dtype is compared by identity first: numpy's own are singletons)
            if len(feeds) != len(exact):
                return None
            for name, dtype, shape in exact:
                x = feeds.get(name)
                if type(x) is not np.ndarray or (x.dtype is not dtype and x.dtype != dtype) or x.shape != shape:
                    return None
                result[name] = x
            return result
        if type(feeds) not in (list, tuple) or len(feeds) != len(exact):
            return None
        for (name, dtype, shape), x in zip(exact, feeds):
            if type(x) is not np.ndarray or (x.dtype is not dtype and x.dtype != dtype) or x.shape != shape:
                return None
            result[name] = x
        return result

    def _check_inputs(self, feeds) -> dict[str, np.ndarray]:
        specs = self.plan.inputs
        if isinstance(feeds, np.ndarray):
            feeds = [feeds]
        if isinstance(feeds, (list, tuple)):
            if len(feeds) != len(specs):
                raise InputError(f"run() got {len(feeds)} inputs, the model takes {len(specs)}: "
                                 f"{', '.join(v.name for v in specs)}")
            feeds = {v.name: x for v, x in zip(specs, feeds)}
        if not isinstance(feeds, dict):
            raise InputError(f"run() takes a dict {{name: array}} or a list in input order, "
                             f"got {type(feeds).__name__}")
        names = [v.name for v in specs]
        unknown = [k for k in feeds if k not in names]
        missing = [k for k in names if k not in feeds]
        if unknown or missing:
            raise InputError(f"input names do not match the model: "
                             f"{'unknown ' + ', '.join(map(repr, unknown)) if unknown else ''}"
                             f"{'; ' if unknown and missing else ''}"
                             f"{'missing ' + ', '.join(map(repr, missing)) if missing else ''}; "
                             f"the model's inputs are: {', '.join(names)}")
        bound: dict[str, tuple[int, str]] = {}
        result = {}
        for spec in specs:
            x = feeds[spec.name]
            if _is_device_buffer(x):
                self._check_device_buffer(spec, x)
                result[spec.name] = x
                continue
            if _is_device_array(x):
                if self.gpu is None or x.context != self.gpu.dev.context:
                    raise InputError(f"input '{spec.name}' is a pyopencl array of another context; create it "
                                     "with predictor.context, or pass a numpy array")
            elif not isinstance(x, np.ndarray):
                x = np.asarray(x)
            if spec.dtype == "unknown" and x.dtype.name not in SUPPORTED_DTYPES:
                raise InputError(f"input '{spec.name}' has dtype {x.dtype}, which optcli does not run; give one of "
                                 f"{', '.join(SUPPORTED_DTYPES)}")
            if spec.dtype != "unknown" and x.dtype != np.dtype(spec.dtype):
                raise InputError(f"input '{spec.name}' has dtype {x.dtype}, the model expects {spec.dtype}; "
                                 f"convert it with .astype(np.{spec.dtype})")
            if spec.shape is not None:
                self._check_shape(spec, x.shape, bound)
            result[spec.name] = x
        return result

    def _check_device_buffer(self, spec: Value, buf) -> None:
        """A raw cl.Buffer holds the input in plain NCHW layout, in storage precision, with the
        model's (static) shape: nothing in the buffer says otherwise, so check what can be."""
        if self.gpu is None or buf.context != self.gpu.dev.context:
            raise InputError(f"input '{spec.name}' is an OpenCL buffer of another context (or this predictor runs "
                             "on the CPU); create it with predictor.context")
        if spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
            raise InputError(f"input '{spec.name}' has dynamic dims: pass a pyopencl array (it has a shape) or a "
                             "numpy array, not a raw buffer")
        need = int(np.prod(spec.shape, dtype=np.int64)) * self.gpu.storage.itemsize
        if buf.size < need:
            raise InputError(f"input '{spec.name}': the OpenCL buffer holds {buf.size} bytes, the model needs "
                             f"{need} ({_show(spec.shape)} in {self.gpu.storage.name})")
        if not any(s.op_type == "Upload" and s.inputs[0] == spec.name for s in self.plan.steps):
            raise InputError(f"input '{spec.name}' is read on the host only; pass a numpy array")

    @staticmethod
    def _check_shape(spec: Value, shape: tuple, bound: dict[str, tuple[int, str]]) -> None:
        if len(shape) != len(spec.shape):
            raise InputError(f"input '{spec.name}' has shape {list(shape)} (rank {len(shape)}), the model "
                             f"expects rank {len(spec.shape)}: {_show(spec.shape)}")
        for i, (want, got) in enumerate(zip(spec.shape, shape)):
            if isinstance(want, int) and want != got:
                raise InputError(f"input '{spec.name}' has shape {list(shape)}, the model expects "
                                 f"{_show(spec.shape)} (dim {i} must be {want})")
            if isinstance(want, str):
                if want in bound and bound[want][0] != got:
                    size, other = bound[want]
                    raise InputError(f"input '{spec.name}' dim {i} ('{want}') is {got}, but '{want}' is "
                                     f"{size} in input '{other}'; dims with one name must agree")
                bound.setdefault(want, (got, spec.name))


def _signature(arrays: dict, specs: list[Value]) -> list | None:
    """(name, dtype, shape) of each input in the plan's order, where every one is a numpy array."""
    values = [arrays.get(v.name) for v in specs]
    if not all(type(x) is np.ndarray for x in values):
        return None
    return [(v.name, x.dtype, x.shape) for v, x in zip(specs, values)]


def _device_failure(exc: BaseException) -> BaseException | None:
    """The OpenCL error behind ``exc`` (itself, or a cause: host steps wrap what they raise)."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__module__.startswith("pyopencl") or isinstance(exc, DeviceError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _describe_gpu(gpu) -> str:
    """The device that failed, for messages: the OpenCL device NAME (KIND, PLATFORM), or the Metal one."""
    dev = gpu.dev
    if hasattr(dev, "describe"):
        return f"the OpenCL device {dev.describe()}"
    return f"the Metal device {dev.name}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def _is_device_buffer(x) -> bool:
    return type(x).__name__ == "Buffer" and type(x).__module__.startswith("pyopencl")


def _is_device_array(x) -> bool:
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "queue") and hasattr(x, "data")


def _owned(value):
    """Outputs the caller may modify: never a view of the weights or of the caller's inputs."""
    if isinstance(value, np.ndarray) and not (value.flags.writeable and value.base is None):
        return np.array(value)
    return value


def _show(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _thread_limiter(threads: int | None):
    """A context manager bounding BLAS threads (and the native library's pool) during a run: entered
    on every run, so it is one object whose ``__enter__`` calls each library's own get/set functions.

    threadpoolctl's own ``limit`` re-reads every library's state on each entry (about 8 us, more
    than a small model's whole run); the libraries are found once here, and each run only reads
    their sizes and sets the ones that differ, restoring them on exit."""
    import contextlib

    if threads is None:
        return contextlib.nullcontext()
    from threadpoolctl import ThreadpoolController

    return _ThreadLimit(threads, ThreadpoolController().lib_controllers)


def _fast_getter(controller):
    """The library's own get-threads function, looked up once: threadpoolctl's ``get_num_threads``
    looks the symbol up by name on every call (1.7 us for OpenBLAS, most of a small model's run).
    Setting still goes through threadpoolctl, which keeps Python threads from fighting over
    OpenBLAS's shared pool."""
    try:
        if controller.internal_api == "openblas":
            symbol = "omp_get_max_threads" if controller.threading_layer == "openmp" else "openblas_get_num_threads"
            fn = controller._get_symbol(symbol)
            if fn is not None:
                return fn
        if controller.internal_api == "optcli_native":
            from optcli.native import library

            if library._lib is not None:
                return None  # its setter gives the previous size: one call a run, not a get and a set
    except Exception:  # noqa: BLE001 - another threadpoolctl: its own getter, slower but right
        pass
    return controller.get_num_threads


def _fast_setter(controller):
    """The library's own set-threads function where calling it is what threadpoolctl would do: the
    native pool's (through ``_fastcall``, 0.1 us where ctypes took 0.25; it returns the previous
    size, so no getter is called), OpenBLAS's where this thread controls OpenBLAS (threadpoolctl lets
    one Python thread at a time set a pool the process shares, and goes through its lock and checks,
    ~1.5 us, on every call, twice a run); threadpoolctl's setter otherwise."""
    set_ = controller.set_num_threads
    try:
        if controller.internal_api == "optcli_native":
            from optcli.native import library

            return library.function("optcli_set_num_threads") if library._lib is not None else set_
        if controller.internal_api != "openblas":
            return set_
        openmp = controller.threading_layer == "openmp"
        fn = controller._get_symbol("omp_set_num_threads" if openmp else "openblas_set_num_threads")
        shared = getattr(type(controller), "_SHARED_STATE", None)
        if fn is None or openmp or shared is None:  # (per-thread limits; no controlling thread to respect)
            return set_ if fn is None else fn
    except Exception:  # noqa: BLE001 - another threadpoolctl: its own setter, slower but right
        return set_

    def set_as_controller(n: int):
        if shared.controlling_thread is threading.current_thread():
            return fn(n)
        return set_(n)  # threadpoolctl decides: take control, or leave it to the thread that has it

    return set_as_controller


class _ThreadLimit:
    """``with limit:`` sets each library to ``threads`` where it differs and restores it after.
    Not reentrant (the predictor's lock holds one run at a time)."""

    def __init__(self, threads: int, controllers):
        self.threads = threads
        self.libraries = [(_fast_getter(c), _fast_setter(c)) for c in controllers]
        self.changed: list = []

    def __enter__(self):
        threads, changed = self.threads, []
        for get, set_ in self.libraries:
            if get is None:  # the native pool: setting gives the previous size
                before = set_(threads)
                if before != threads:
                    changed.append((set_, before))
                continue
            before = get()
            if before != threads:
                set_(threads)
                changed.append((set_, before))
        self.changed = changed

    def __exit__(self, *exc):
        for set_, before in self.changed:
            set_(before)
        self.changed = []
        return False
