"""Shape functions: each op's output shapes from its input shapes, without running anything.

The runtime derives every value's shape itself (issue 12): at ``load`` symbolically, to compare
with what a file records, and at ``run`` from the concrete input shapes, to size buffers and
launch grids.  ``optcli.ops.shape_derivation.derive_shapes`` walks a plan once in step order and asks
each step's shape function, registered here with ``@shape_fn("Conv")`` beside the op's kernel
(``optcli/ops/conv.py`` and the other op files).

A shape function receives a ``ShapeArgs`` (the input shapes, the values of small integer inputs
when known, the attributes, the default domain's opset) and returns one shape per output it can
tell (fewer than the node has: the rest are unknown).  A dim is an int, a str symbol (a dynamic
dim, such as ``N``) or None (unknown, e.g. data-dependent); a shape is a tuple of dims, or None
when even the rank is unknown.  A step whose shapes a kernel could not take (dims that do not
broadcast, a MatMul whose inner dims differ, a Conv weight that does not fit its input) raises
``ShapeDerivationError`` with what is wrong; the caller adds the node.

The helpers below serve the big families (element-wise, broadcasting, axes normalisation); the
windowed ops' geometry lives in ``optcli.ops.spatial`` and is shared with the kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optcli.ir import Dim
from optcli.ops.registry import FAMILIES

Shape = tuple[Dim, ...] | None


class ShapeDerivationError(ValueError):
    """A step's input shapes do not fit its op: the message says why (the caller names the node)."""


@dataclass
class ShapeArgs:
    """What a shape function may read.  ``shapes[k]`` is None for an input of unknown rank and for
    an absent optional input (``present(k)`` tells them apart); ``values[k]`` holds input k's
    value when it is a small known constant; ``dims[k]`` the elements of a small 1-D (or 0-D)
    integer input as dims when only some are known (``Shape`` of a symbolic shape)."""

    shapes: list[Shape]
    values: list[np.ndarray | None]
    attrs: dict[str, Any]
    opset: int
    present: list[bool]
    dims: list[tuple[Dim, ...] | None]
    n_outputs: int = 1
    op: str = ""  # the op type, for a function shared by several ops

    def has(self, k: int) -> bool:
        return k < len(self.present) and self.present[k]

    def shape(self, k: int) -> Shape:
        return self.shapes[k] if k < len(self.shapes) else None

    def value(self, k: int) -> np.ndarray | None:
        return self.values[k] if k < len(self.values) else None

    def ints(self, k: int) -> list[int] | None:
        """Input k's elements as ints when its value is known."""
        v = self.value(k)
        return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]

    def dims_of(self, k: int) -> tuple[Dim, ...] | None:
        """Input k's elements as dims (ints where known, symbols, None): for shape-like inputs."""
        v = self.value(k)
        if v is not None:
            return tuple(int(a) for a in np.asarray(v).reshape(-1))
        return self.dims[k] if k < len(self.dims) else None

    def ints_attr_or_input(self, k: int, name: str) -> tuple[bool, list[int] | None]:
        """(given, ints) of what moved from an attribute to input k across opsets: given is
        False when neither form is there; ints None when the input's value is unknown."""
        if self.has(k):
            return True, self.ints(k)
        if self.attrs.get(name) is not None:
            return True, [int(a) for a in np.asarray(self.attrs[name]).reshape(-1)]
        return False, None

    def rank(self, k: int) -> int | None:
        s = self.shape(k)
        return None if s is None else len(s)


ShapeFn = Callable[[ShapeArgs], list[Shape]]

_SHAPE_FNS: dict[tuple[str, str], ShapeFn] = {}


def shape_fn(op_type: str | Sequence[str], domain: str = "") -> Callable[[ShapeFn], ShapeFn]:
    """Register ``fn`` as the shape function of ``op_type`` (a name or several) in ``domain``."""

    def register(fn: ShapeFn) -> ShapeFn:
        for op in [op_type] if isinstance(op_type, str) else op_type:
            if (domain, op) in _SHAPE_FNS:
                raise RuntimeError(f"shape function of {domain or 'onnx'}.{op} registered twice")
            _SHAPE_FNS[(domain, op)] = fn
        return fn

    return register


def shape_fn_for(op_type: str, domain: str = "") -> ShapeFn | None:
    FAMILIES.ensure()
    return _SHAPE_FNS.get(("" if domain == "ai.onnx" else domain, op_type))


def shape_fn_ops() -> list[tuple[str, str]]:
    FAMILIES.ensure()
    return sorted(_SHAPE_FNS)


# ----------------------------------------------------------------------------- helpers

def is_int(d: Any) -> bool:
    return type(d) is int or (isinstance(d, (int, np.integer)) and not isinstance(d, bool))


def fixed(d: Dim) -> int | None:
    return int(d) if is_int(d) else None


def unknown(rank: int | None) -> Shape:
    """A shape of this rank with no dim known (None when the rank is unknown too)."""
    return None if rank is None else (None,) * rank


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeDerivationError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def product(dims: Sequence[Dim]) -> Dim:
    """The product of dims: an int when all are fixed, a symbol times 1 is the symbol, else None."""
    total, symbol = 1, None
    for d in dims:
        if is_int(d):
            total *= int(d)
        elif symbol is None and d is not None:
            symbol = d
        else:
            return 0 if 0 in [fixed(x) for x in dims] else None
    if symbol is None:
        return total
    return symbol if total == 1 else (0 if total == 0 else None)


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """Two dims under numpy broadcasting: N with N is N, N with 1 is N, N with d > 1 is d."""
    if is_int(a) and is_int(b):
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        raise ShapeDerivationError(f"dims {a} and {b} do not broadcast")
    if a == 1:
        return b
    if b == 1:
        return a
    if is_int(a):
        return a
    if is_int(b):
        return b
    return a if a == b else None


def broadcast(*shapes: Shape) -> Shape:
    """numpy broadcasting of several shapes (None if any rank is unknown)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        try:
            out = [broadcast_dim(a, b) for a, b in zip(out, padded)]
        except ShapeDerivationError:
            raise ShapeDerivationError(
                f"input shapes {', '.join(show(x) for x in shapes)} do not broadcast") from None
    return tuple(out)


def same_dim(a: Dim, b: Dim, what: str) -> Dim:
    """Two dims that must be equal: a fixed one wins over a symbol; two fixed ones that differ raise."""
    if is_int(a) and is_int(b):
        if a != b:
            raise ShapeDerivationError(f"{what}: {a} differs from {b}")
        return a
    if is_int(a):
        return a
    if is_int(b):
        return b
    return a if a == b or b is None else (b if a is None else None)


def show(shape: Shape) -> str:
    if shape is None:
        return "[?]"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def first_input(args: ShapeArgs) -> list[Shape]:
    """Output 0 has input 0's shape: unary element-wise ops, casts, copies."""
    return [args.shape(0)]


def broadcast_inputs(args: ShapeArgs) -> list[Shape]:
    """Output 0 is every present input broadcast together (Add, Where, Max, Sum...)."""
    return [broadcast(*[args.shape(k) for k in range(len(args.shapes)) if args.has(k)])]


def check_length(args: ShapeArgs, k: int, expected: Dim, what: str, allow_one: bool = False) -> None:
    """Input k (a per-channel parameter, a bias) holds ``expected`` values, where both are known."""
    s = args.shape(k)
    if not args.has(k) or s is None or not is_int(expected):
        return
    n = product(s)
    if is_int(n) and n != expected and not (allow_one and n == 1):
        raise ShapeDerivationError(f"{what} has {n} values where {expected} are expected")
