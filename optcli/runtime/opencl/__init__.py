"""The OpenCL backend: ``backend.start`` (its entry in ``runtime/backends.py``), the device and its
program cache (``device``, ``program_cache``), the devices of this machine and their smoke test
(``devices``), the plan's GPU steps (``steps``) and work-group tuning (``tuning``)."""
