"""The cost model's hardware speeds: rough, deliberately (a mobile GPU against one big CPU core).

Placement (``passes/keep_small_islands_on_host.py``: does a GPU island save more than its copies
cost?) and the advice (``advice.py``: which steps will be slow, and why) judge a plan with the
same numbers, so they live here, with the targets they describe, not in either user.
"""

COPY_LATENCY_S = 50e-6  # per host<->device crossing: an enqueued copy plus a layout conversion kernel
BUS_BYTES_PER_S = 4e9
HOST_MACS_PER_S = 20e9
GPU_MACS_PER_S = 200e9
HOST_ELEMENTS_PER_S = 2e9  # memory-bound ops
GPU_ELEMENTS_PER_S = 20e9
