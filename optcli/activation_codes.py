"""The fused activations: their names (written into `.nb` files as a step's ``activation``
attribute) and their codes (the ``ACTIVATION`` define of the GPU kernels, the ``act`` argument of
the native host kernels).

Why on the ground floor: the numpy kernels (``ops/activation.py``), the GPU dialect
(``gpu/dialect.py``), the native wrappers (``native/``) and the load checks all speak this
vocabulary, and the C enum in the host kernels' ``simd.h`` mirrors it; one table, derived once,
keeps them equal (``tests/test_activation_codes.py`` parses the C enum against it).  The order is
part of the `.nb` format and of the native ABI: append, never reorder.
"""

from __future__ import annotations

ACTIVATIONS = ("relu", "clip", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "swish", "gelu",
               "gelu_tanh")

ACTIVATION_CODES: dict[str | None, int] = {None: 0, **{name: code for code, name in enumerate(ACTIVATIONS, 1)}}
"""Name (None: no activation) -> code; the codes are 0..len(ACTIVATIONS)."""
