"""The host CPU path: each step bound to its numpy/native kernel or the reference fallback (``steps``),
and the allocator tuning that keeps freed activations for the next run (``memory``).  Always there:
the executor runs host steps itself, and GPU steps here when no device takes them."""
