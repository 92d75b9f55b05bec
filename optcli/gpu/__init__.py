"""The GPU kernel library shared by the `opencl` and `metal` targets.

- ``dialect``: renders the portable kernel sources in ``kernels/gpu/`` for a target language.
- ``layout``: the channel-packed NC4HW4 layout GPU tensors live in.
- ``registry``: which GPU kernel runs which op, when it applies, and how to launch it.
- ``ops_*``: the kernel definitions, one module per kernel family.
"""
