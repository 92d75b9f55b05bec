"""Paddle Lite's Python API (``paddlelite.lite``: ``MobileConfig``, ``PowerMode``,
``create_paddle_predictor``, the light predictor and its ``Tensor``) over ``optcli.load``, for
scripts moving from Paddle Lite: replace ``from paddlelite.lite import *`` by
``from optcli import *`` and the rest runs unchanged.

    config = MobileConfig()
    config.set_model_from_file("model.nb")
    config.set_threads(2)
    config.set_power_mode(PowerMode.LITE_POWER_NO_BIND)
    predictor = create_paddle_predictor(config)
    predictor.get_input(0).from_numpy(x)
    predictor.run()
    y = predictor.get_output(0).numpy()

What differs from Paddle Lite, because the host differs:

- Threads: as in Paddle Lite, one thread unless ``set_threads`` says more, never more than the
  CPUs this process may use.  They bound the host CPU's threads (BLAS and the native kernels)
  during ``run``; GPU steps run on the OpenCL device ``optcli.load`` picks.
- Power modes are accepted and remembered (``power_mode()``), but no thread is bound to a core:
  Python cannot tell big cores from little ones, nor pin the threads of BLAS.  What each mode
  does here is the thread count it leaves (see ``PowerMode``).
- Errors are optcli's: a wrong input or output index or name is an ``InputError``, a misused
  config or tensor a ``UsageError`` (both ``optcli.OptError``), each saying what to do, where
  Paddle Lite aborts the process (a wrong index) or hands back None (a wrong name).
- No LoD (ONNX has none), no CxxConfig (optcli optimizes with ``opt`` or ``optcli.optimize``),
  no Paddle-format models (``set_model_dir``, ``set_model_buffer``).  The OpenCL, Metal and
  NNAdapter settings of MobileConfig are not provided: ``optcli.load``'s ``device``,
  ``precision`` and ``tune`` arguments are their counterparts.
"""

from __future__ import annotations

import enum
import os

import numpy as np

from optcli._version import __version__
from optcli.errors import InputError, UsageError
from optcli.runtime.load import load


class PowerMode(enum.IntEnum):
    """Paddle Lite's CPU power modes, with its names and values.  On ARM, Paddle Lite binds its
    threads to big or little cores; optcli binds nothing and only sets the thread count:

    - ``LITE_POWER_HIGH`` (the default), ``LITE_POWER_FULL``, ``LITE_POWER_NO_BIND``: the threads
      ``set_threads`` gave (capped, as in Paddle Lite, at the CPUs this process may use).
    - ``LITE_POWER_LOW``: one thread (Paddle Lite keeps to the little cores).
    - ``LITE_POWER_RAND_HIGH``: as HIGH, ``LITE_POWER_RAND_LOW``: as LOW (Paddle Lite also moves the
      binding to another core every 10 runs; there is no binding here to move).
    """

    LITE_POWER_HIGH = 0
    LITE_POWER_LOW = 1
    LITE_POWER_FULL = 2
    LITE_POWER_NO_BIND = 3
    LITE_POWER_RAND_HIGH = 4
    LITE_POWER_RAND_LOW = 5

    def __str__(self) -> str:  # as Paddle Lite's (pybind11) enum prints
        return f"PowerMode.{self.name}"


_ONE_THREAD = (PowerMode.LITE_POWER_LOW, PowerMode.LITE_POWER_RAND_LOW)


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def threads_for(mode: PowerMode, threads: int) -> int:
    """The host threads a predictor runs with, for a power mode and ``set_threads``' count."""
    return 1 if mode in _ONE_THREAD else min(threads, _usable_cpus())


class MobileConfig:
    """What ``create_paddle_predictor`` builds a predictor from: the model (a ``.nb`` file or its
    bytes), the thread count and the power mode."""

    def __init__(self) -> None:
        self._model_file = ""
        self._model_buffer: bytes | None = None
        self._threads = 1  # Paddle Lite's default: one thread
        self._power_mode = PowerMode.LITE_POWER_HIGH

    def set_model_from_file(self, model_file: str | os.PathLike) -> None:
        """The ``.nb`` file to load (written by ``opt`` or ``optcli.optimize``)."""
        self._model_file = os.fspath(model_file)
        self._model_buffer = None

    def set_model_from_buffer(self, model_buffer: bytes) -> None:
        """The ``.nb`` file's bytes, e.g. ``open(path, "rb").read()`` or ``optcli.optimize(...).data``."""
        if isinstance(model_buffer, str):
            raise UsageError("set_model_from_buffer takes the .nb's bytes (open(path, 'rb').read()), not a str; "
                             "for a path use set_model_from_file(path)")
        if not isinstance(model_buffer, (bytes, bytearray, memoryview)):
            raise UsageError(f"set_model_from_buffer takes bytes, got {type(model_buffer).__name__}")
        self._model_buffer = bytes(model_buffer)
        self._model_file = ""

    def is_model_from_memory(self) -> bool:
        return self._model_buffer is not None

    def set_model_dir(self, model_dir: str) -> None:
        raise UsageError("set_model_dir loads Paddle Lite's pre-2.3 model folders; optcli reads the one .nb file "
                         "opt writes: use set_model_from_file(path)")

    def set_model_buffer(self, *buffers) -> None:
        raise UsageError("set_model_buffer takes Paddle Lite's pre-2.3 model and params buffers; optcli reads one "
                         ".nb: use set_model_from_buffer(data)")

    def model_dir(self) -> str:
        """The folder of Paddle Lite's pre-2.3 format: always "" here (``set_model_dir`` is refused)."""
        return ""

    def set_threads(self, threads: int) -> None:
        """Host CPU threads while running (default 1); capped at the CPUs this process may use."""
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
            raise UsageError(f"set_threads takes a positive whole number, got {threads!r}")
        self._threads = int(threads)

    def threads(self) -> int:
        return self._threads

    def set_power_mode(self, mode: PowerMode | int) -> None:
        """A ``PowerMode``; accepted and remembered, what it does here is in ``PowerMode``'s doc."""
        try:
            self._power_mode = PowerMode(mode)
        except ValueError:
            names = ", ".join(f"PowerMode.{m.name}" for m in PowerMode)
            raise UsageError(f"set_power_mode takes one of {names}; got {mode!r}") from None

    def power_mode(self) -> PowerMode:
        return self._power_mode


class Tensor:
    """One input or output of a predictor, as ``get_input`` and ``get_output`` hand it out (the
    same object each time: data set through one handle is seen through all)."""

    def __init__(self, name: str, declared: tuple, dtype: str, is_input: bool) -> None:
        self.name = name
        self._declared = declared
        self._dtype = dtype
        self._is_input = is_input
        self._array: np.ndarray | None = None
        self._shape: list[int] | None = None  # set by resize, before the data

    def __repr__(self) -> str:
        return f"<Tensor {'input' if self._is_input else 'output'} '{self.name}' shape={self.shape()}>"

    # --- shape
    def shape(self) -> list[int]:
        """The dims of the data held; before any, those ``resize`` set, else the model's declared
        shape (-1 for a dynamic dim)."""
        if self._array is not None:
            return list(self._array.shape)
        if self._shape is not None:
            return list(self._shape)
        return [d if isinstance(d, int) else -1 for d in self._declared]

    def resize(self, shape) -> None:
        """Set an input's dims before ``set_float_data`` (and the other ``set_*_data``) fills it;
        data of other dims held until now is dropped.  ``from_numpy`` takes the array's dims itself."""
        self._need_input("resize")
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise UsageError(f"resize takes a list of dims, got {shape!r}") from None
        if any(d < 0 for d in dims):
            raise UsageError(f"resize: dims must not be negative, got {dims}")
        if self._array is not None and list(self._array.shape) != dims:
            self._array = None
        self._shape = dims

    # --- numpy
    def from_numpy(self, array, place=None) -> None:
        """Copy ``array`` into this input, dims included (``place``: accepted for Paddle Lite's
        signature; the data is on the host and the predictor moves what its GPU steps read)."""
        self._need_input("from_numpy")
        self._array = np.array(array, order="C", copy=True)
        self._shape = None

    def numpy(self) -> np.ndarray:
        """The data: an output's after ``run()``, an input's as set."""
        if self._array is None:
            raise UsageError(f"{self._kind()} '{self.name}' holds no data yet; "
                             f"{'call from_numpy(x) first' if self._is_input else 'call run() first'}")
        return self._array

    # --- lists of values, typed (Paddle Lite's float_data / set_float_data and kin)
    def float_data(self) -> list:
        return self._typed_list(np.float32, "float")

    def set_float_data(self, data, type=None) -> None:
        self._set_typed(data, np.float32, "float")

    def int32_data(self) -> list:
        return self._typed_list(np.int32, "int32")

    def set_int32_data(self, data, type=None) -> None:
        self._set_typed(data, np.int32, "int32")

    def int8_data(self) -> list:
        return self._typed_list(np.int8, "int8")

    def set_int8_data(self, data, type=None) -> None:
        self._set_typed(data, np.int8, "int8")

    def uint8_data(self) -> list:
        return self._typed_list(np.uint8, "uint8")

    def set_uint8_data(self, data, type=None) -> None:
        self._set_typed(data, np.uint8, "uint8")

    # --- LoD: ONNX has none
    def lod(self) -> list:
        return []

    def set_lod(self, lod) -> None:
        if any(len(level) for level in lod):
            raise UsageError(f"set_lod: optcli's tensors carry no LoD (ONNX models have none); got {lod!r}")

    # --- helpers
    def _kind(self) -> str:
        return "input" if self._is_input else "output"

    def _need_input(self, what: str) -> None:
        if not self._is_input:
            raise UsageError(f"{what} sets an input's data; '{self.name}' is an output, which run() fills")

    def _typed_list(self, dtype, name: str) -> list:
        array = self.numpy()
        if array.dtype != dtype:
            raise UsageError(f"{self._kind()} '{self.name}' holds {array.dtype}, not {name}; use numpy()")
        return array.ravel().tolist()

    def _set_typed(self, data, dtype, name: str) -> None:
        self._need_input(f"set_{name}_data")
        if self._shape is None:
            raise UsageError(f"set_{name}_data: call resize(dims) first, or use from_numpy(array)")
        flat = np.asarray(data, dtype=dtype).ravel()
        need = int(np.prod(self._shape, dtype=np.int64))
        if flat.size != need:
            raise InputError(f"set_{name}_data: input '{self.name}' was resized to {self._shape} ({need} values), "
                             f"got {flat.size} values")
        self._array = flat.reshape(self._shape)


class PaddlePredictor:
    """Paddle Lite's light predictor (``LightPredictor``) over an ``optcli`` Predictor."""

    def __init__(self, config: MobileConfig) -> None:
        if not isinstance(config, MobileConfig):
            raise UsageError(f"create_paddle_predictor takes a MobileConfig, got {type(config).__name__} "
                             "(optcli has no CxxConfig: optimize with opt or optcli.optimize first)")
        if config.is_model_from_memory():
            source = config._model_buffer
        elif config._model_file:
            source = config._model_file
        else:
            raise UsageError("MobileConfig has no model; call set_model_from_file(path) or "
                             "set_model_from_buffer(data) first")
        self._predictor = load(source, threads=threads_for(config.power_mode(), config.threads()))
        self._inputs = [Tensor(i.name, i.shape, i.dtype, True) for i in self._predictor.inputs]
        self._outputs = [Tensor(o.name, o.shape, o.dtype, False) for o in self._predictor.outputs]

    def get_input(self, index: int) -> Tensor:
        return _by_index(self._inputs, index, "input")

    def get_output(self, index: int) -> Tensor:
        return _by_index(self._outputs, index, "output")

    def get_input_by_name(self, name: str) -> Tensor:
        return _by_name(self._inputs, name, "input")

    def get_output_by_name(self, name: str) -> Tensor:
        return _by_name(self._outputs, name, "output")

    def get_input_names(self) -> list[str]:
        return [t.name for t in self._inputs]

    def get_output_names(self) -> list[str]:
        return [t.name for t in self._outputs]

    def get_version(self) -> str:
        return f"optcli {__version__}"

    def run(self) -> None:
        """Run on the inputs' data; the outputs then hold the results."""
        empty = [t.name for t in self._inputs if t._array is None]
        if empty:
            raise InputError(f"inputs without data: {', '.join(empty)}; call get_input(i).from_numpy(x) first")
        results = self._predictor.run({t.name: t._array for t in self._inputs})
        for t in self._outputs:
            t._array = results[t.name]


LightPredictor = PaddlePredictor  # Paddle Lite's name for the predictor a MobileConfig makes


def _by_index(slots: list[Tensor], index: int, what: str) -> Tensor:
    if isinstance(index, str):
        raise InputError(f"get_{what}({index!r}) takes an index; by name: get_{what}_by_name({index!r})")
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(slots):
        raise InputError(f"{what} index {index!r} is out of range: the model has {len(slots)} {what}"
                         f"{'s' if len(slots) != 1 else ''} (0 to {len(slots) - 1}): "
                         f"{', '.join(t.name for t in slots)}")
    return slots[index]


def _by_name(slots: list[Tensor], name: str, what: str) -> Tensor:
    for t in slots:
        if t.name == name:
            return t
    raise InputError(f"the model has no {what} named {name!r}; its {what}s are: {', '.join(t.name for t in slots)}")


def create_paddle_predictor(config: MobileConfig) -> PaddlePredictor:
    """A predictor for ``config``'s model, threads and power mode (Paddle Lite's function)."""
    return PaddlePredictor(config)
