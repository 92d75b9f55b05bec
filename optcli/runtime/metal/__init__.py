"""The Metal backend (macOS): ``backend.start`` (its entry in ``runtime/backends.py``), the device, its
pipelines and their cache (``device``), the plan's GPU steps (``steps``)."""
