"""GPU kernels by op: when each applies, what it costs, and how to launch it.

A ``GpuKernel`` is declared once for every GPU target (OpenCL and Metal render the same
sources).  At optimize time ``check`` says whether a node fits the kernel (static shapes, ranks,
attributes: the reason when not goes into the report) and ``cost`` ranks the variants that fit.
At load time ``launch`` turns a plan step into one or more ``Launch``es: the kernel entry, its
defines, its arguments in the order of the kernel's ``KERNEL(...)`` head, and the grid.

Launch arguments refer to tensors by name (``ctx.tensor``), to weights derived once at load
(``ctx.weight``: e.g. a conv weight re-laid for the kernel), to scratch buffers (``ctx.temp``),
to plain ints and floats, and to a fused epilogue's parameters (``epilogue_arg``).  Defines
are enumerated choices only (``optcli.gpu.variants`` lists every program); buffer sizes are
added by the runtime at bind time (``dialect.kernel_arguments``).  Tensors are always in the
packed NC4HW4 layout (``layout.py``) except where a step says otherwise (the host copies and the
pack/unpack steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.gpu.dialect import Epilogue
from optcli.ir import Graph, Node
from optcli.ops.activation import epilogue, output_quant
from optcli.ops.registry import Families


@dataclass(frozen=True)
class TensorRef:
    name: str


@dataclass(frozen=True)
class WeightRef:
    key: str


@dataclass(frozen=True)
class TempRef:
    key: str


@dataclass
class Launch:
    source: str  # kernel file in kernels/gpu/
    entry: str  # kernel function name
    args: list[Any]  # TensorRef | WeightRef | TempRef | int | float | Epilogue, in KERNEL(...) order
    global_size: tuple[int, ...]
    defines: dict[str, Any] = field(default_factory=dict)
    local_size: tuple[int, ...] | None = None


class LaunchContext(Protocol):
    precision: str  # "fp32" or "fp16" storage

    def shape(self, name: str) -> tuple[int, ...]: ...

    def const(self, name: str) -> np.ndarray | None: ...

    def tensor(self, name: str) -> TensorRef: ...

    def weight(self, key: str, array: np.ndarray) -> WeightRef: ...

    def temp(self, key: str, elements: int) -> TempRef: ...


CheckFn = Callable[[Node, Graph], "str | None"]
LaunchFn = Callable[[LaunchContext, Any], list[Launch]]
CostFn = Callable[[Node, Graph], float]


@dataclass(frozen=True)
class GpuKernel:
    op_type: str
    domain: str
    variant: str
    check: CheckFn
    launch: LaunchFn
    cost: CostFn | None = None
    priority: int = 0
    # Inputs of an integer dtype the kernel reads as data (uploaded in the storage float, like a
    # tensor), by index: a recurrent layer's sequence_lens.  Any other non-float input must be a
    # constant: launches are planned from it at load (axes, shapes, pads).
    data_inputs: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return f"gpu.{self.domain or 'onnx'}.{self.op_type}.{self.variant}"


# Every module of this package that registers GPU kernels (one per kernel family), imported on the
# first lookup (``ops.registry.Families``: nobody imports a module for its registrations).
FAMILIES = Families("optcli.gpu", ("ops_activation", "ops_conv", "ops_elementwise", "ops_gemm", "ops_layout",
                                   "ops_matmul", "ops_norm", "ops_pool", "ops_quant", "ops_recurrent", "ops_reduce",
                                   "ops_resize", "ops_softmax", "ops_tensor"))

_BY_OP: dict[tuple[str, str], list[GpuKernel]] = {}
_BY_ID: dict[str, GpuKernel] = {}


def gpu_kernel(op_type: str | list[str], domain: str = "", variant: str = "default", check: CheckFn | None = None,
               cost: CostFn | None = None, priority: int = 0,
               data_inputs: tuple[int, ...] = ()) -> Callable[[LaunchFn], LaunchFn]:
    """Register a launch function as the GPU kernel of one or more ops (decorator)."""

    def register(fn: LaunchFn) -> LaunchFn:
        for op in [op_type] if isinstance(op_type, str) else op_type:
            k = GpuKernel(op, domain, variant, check or (lambda node, graph: None), fn, cost, priority, data_inputs)
            if k.id in _BY_ID:
                raise RuntimeError(f"GPU kernel {k.id} registered twice")
            _BY_OP.setdefault((domain, op), []).append(k)
            _BY_ID[k.id] = k
        return fn

    return register


def gpu_kernels_for(op_type: str, domain: str = "") -> list[GpuKernel]:
    FAMILIES.ensure()
    return sorted(_BY_OP.get((domain, op_type), []), key=lambda k: -k.priority)


def get_gpu_kernel(kid: str) -> GpuKernel | None:
    FAMILIES.ensure()
    return _BY_ID.get(kid)


def gpu_ops() -> list[tuple[str, str]]:
    FAMILIES.ensure()
    return sorted(_BY_OP)


def all_gpu_kernels() -> list[GpuKernel]:
    FAMILIES.ensure()
    return sorted(_BY_ID.values(), key=lambda k: k.id)


# --------------------------------------------------------------------------- shared helpers
def common_check(node: Node, graph: Graph, max_rank: int = 4, dtypes: tuple[str, ...] = ("float32",)) -> str | None:
    """The checks every GPU kernel needs: float32 tensors (bool for logical ops: stored as 0/1 in
    the float storage) of static shape and rank <= 4."""
    for name in [*node.inputs, *node.outputs]:
        if not name:
            continue
        shape, dtype = graph.shape_of(name), graph.dtype_of(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return f"'{name}' has a dynamic shape (pin it with --input_shapes)"
        if len(shape) > max_rank:
            return f"'{name}' has rank {len(shape)} (GPU kernels take rank <= {max_rank})"
        if dtype not in dtypes:
            return f"'{name}' is {dtype} (this GPU kernel takes {' or '.join(dtypes)} tensors)"
    return None


def epilogue_defines(attrs: dict) -> dict[str, Any]:
    """The enumerated defines of a node's fused epilogue: ACTIVATION (which function) and
    FAKE_QUANT when a FakeQuant was fused after it.  Their float parameters are the kernel's
    ``EPILOGUE`` argument (``epilogue_arg``), never defines: a file cannot make one program per
    alpha."""
    name, _alpha, _beta = epilogue(attrs)
    if name not in ACTIVATION_CODES:
        raise ValueError(f"unknown fused activation {name!r}")
    return {"ACTIVATION": ACTIVATION_CODES[name], **fake_quant_defines(attrs)}


def fake_quant_defines(attrs: dict) -> dict[str, Any]:
    """FAKE_QUANT when a FakeQuant was fused into the node, else nothing (the epilogue's default:
    no quantization, and the same program as before)."""
    return {} if output_quant(attrs) is None else {"FAKE_QUANT": 1}


def epilogue_arg(attrs: dict) -> Epilogue:
    """The ``EPILOGUE`` argument of a node's fused epilogue: activation alpha / beta and the fused
    FakeQuant's scale, zero point and range (identity values where there is none)."""
    _name, alpha, beta = epilogue(attrs)
    quant = output_quant(attrs)
    return Epilogue(alpha, beta) if quant is None else Epilogue(alpha, beta, *quant)


def input_of(step: Any, i: int) -> str:
    return step.inputs[i] if i < len(step.inputs) else ""


def round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple
