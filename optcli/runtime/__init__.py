"""The runtime: ``load`` reads a `.nb`, ``load_checks`` checks it (with ``step_checks`` and the shape
derivation of ``plan_shapes``), ``predictor`` runs it through the ``executor``; the host path in
``host/``, the GPU backends in ``opencl/`` and ``metal/`` (found by target name in ``backends``),
their shared pieces in ``gpu_common/``.  Never imports ``passes/``: compile and run are peers."""
