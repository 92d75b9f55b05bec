"""Registry of numpy kernels: the reference implementation of every op and the `arm` target's kernels.

A kernel is a plain function ``fn(inputs, attrs) -> list[np.ndarray]``: ``inputs`` holds one
numpy array per node input (None for an absent optional input), ``attrs`` the node's attributes
as Python values (ints, floats, strings, lists, numpy arrays for tensor attributes).

An op may have several variants (``Conv``: 1x1, depthwise, im2col).  Each variant says when it
applies (a predicate on the node and the graph, so on static attributes and constant inputs)
and a priority; kernel selection records the chosen variant's id in the plan, and the runtime
looks the function up by that id.  The `.nb` never carries code, only these ids.

The registry fills itself: the first lookup imports every op family module (``FAMILIES``), so
a caller never has to import a module for its registrations, and never sees half a registry.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

KernelFn = Callable[[list[np.ndarray | None], dict[str, Any]], list[np.ndarray]]
AppliesFn = Callable[[Any, Any], bool]  # (Node, Graph) -> bool


@dataclass(frozen=True)
class Kernel:
    op_type: str
    domain: str
    variant: str
    fn: KernelFn
    applies: AppliesFn | None = None
    priority: int = 0
    doc: str = ""
    max_outputs: int | None = None  # e.g. MaxPool without its optional Indices output
    # The channel-blocked host layout (ops/blocked.py): input positions read blocked, and whether
    # the outputs are written blocked.  Plain kernels: () and False.
    blocked_inputs: tuple[int, ...] = ()
    blocked_outputs: bool = False

    @property
    def is_blocked(self) -> bool:
        """A kernel of the channel-blocked layout (it reads or writes blocked values)."""
        return bool(self.blocked_inputs) or self.blocked_outputs

    @property
    def id(self) -> str:
        return kernel_id(self.op_type, self.domain, self.variant)


class StepAttrs(dict):
    """A bound step's kernel attributes (``ops.evaluate.kernel_attrs``): one dict per step for
    the life of a plan, passed on every run.  It cannot change (every mutation raises), so kernels
    keep what they derive from it in its ``memo`` (ops/conv.py: the window, the prepared native
    call), which lives and dies with the bound step: no process-wide cache holds a dropped
    predictor's weights."""

    __slots__ = ("memo",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memo: dict[Any, Any] = {}

    def _fixed(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a bound step's attributes are fixed: copy them (dict(attrs)) to change them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _fixed  # type: ignore

    def __reduce__(self):  # copies and pickles are plain dicts: only the bound one is fixed
        return dict, (dict(self),)


def kernel_id(op_type: str, domain: str, variant: str) -> str:
    return f"{domain or 'onnx'}.{op_type}.{variant}"


class Families:
    """The modules that register into a registry, imported once, on the registry's first lookup.

    Why lazily: a registry filled by whoever happened to import its modules first answers
    "no such kernel" to a caller that forgot one (and a `.nb` file would be refused as "made by
    another optcli version").  Lookups call ``ensure()``; it costs one attribute test once filled."""

    def __init__(self, package: str, modules: tuple[str, ...]):
        self.names = tuple(f"{package}.{m}" for m in modules)
        self.filled = False
        self._lock = threading.RLock()  # re-entrant: a module being imported may look something up

    def ensure(self) -> None:
        if self.filled:
            return
        with self._lock:
            if self.filled:
                return
            self.filled = True  # set first: a lookup made while the modules import must not recurse
            try:
                for name in self.names:
                    importlib.import_module(name)
            except BaseException:
                self.filled = False
                raise


# Every module of this package that registers kernels or shape functions (one per op family).
FAMILIES = Families("optcli.ops", ("activation", "blocked", "conv", "elementwise", "fused", "gemm", "normalization",
                                   "pool", "qadd", "qconv", "qlookup", "qmatmul", "qmul", "quant", "quant_contrib",
                                   "recurrent", "recurrent_quant", "reduce", "resize", "tensor",
                                   "tensor_shape_functions", "transfer"))

_KERNELS: dict[tuple[str, str], list[Kernel]] = {}
_BY_ID: dict[str, Kernel] = {}


def kernel(
    op_type: str | list[str],
    domain: str = "",
    variant: str = "default",
    applies: AppliesFn | None = None,
    priority: int = 0,
    max_outputs: int | None = None,
    blocked_inputs: tuple[int, ...] = (),
    blocked_outputs: bool = False,
) -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` as a numpy kernel (decorator).  ``op_type`` may list several ops.

    ``max_outputs`` says how many of the op's outputs the kernel produces when it does not
    produce all the op may have; nodes that use more run through the reference fallback.
    ``blocked_inputs`` / ``blocked_outputs`` mark a kernel of the channel-blocked host layout
    (``optcli/ops/blocked.py``): kernel selection never picks one, the layout pass does.
    """

    def register(fn: KernelFn) -> KernelFn:
        for op in [op_type] if isinstance(op_type, str) else op_type:
            k = Kernel(op, domain, variant, fn, applies, priority, (fn.__doc__ or "").strip(), max_outputs,
                       tuple(blocked_inputs), blocked_outputs)
            if k.id in _BY_ID:
                raise RuntimeError(f"kernel {k.id} registered twice")
            _KERNELS.setdefault((domain, op), []).append(k)
            _BY_ID[k.id] = k
        return fn

    return register


def kernels_for(op_type: str, domain: str = "", blocked: bool = False) -> list[Kernel]:
    """Variants registered for an op, highest priority first: the plain-layout ones, or with
    ``blocked`` those of the channel-blocked host layout."""
    FAMILIES.ensure()
    return sorted((k for k in _KERNELS.get((domain, op_type), []) if k.is_blocked == blocked),
                  key=lambda k: -k.priority)


def has_native_kernel(op_type: str, domain: str, outputs: list[str]) -> bool:
    """Whether a native kernel can compute every output this node uses."""
    used = 1 + max((i for i, name in enumerate(outputs) if name), default=0)
    return any(k.max_outputs is None or used <= k.max_outputs for k in kernels_for(op_type, domain))


def get_kernel(kid: str) -> Kernel | None:
    FAMILIES.ensure()
    return _BY_ID.get(kid)


def registered_ops() -> list[tuple[str, str]]:
    """(domain, op_type) pairs that have at least one native kernel, sorted."""
    FAMILIES.ensure()
    return sorted(_KERNELS)


def all_kernels() -> list[Kernel]:
    FAMILIES.ensure()
    return sorted(_BY_ID.values(), key=lambda k: k.id)
