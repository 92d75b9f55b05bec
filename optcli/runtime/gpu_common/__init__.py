"""What the GPU backends share: shapes derived per input shape (``bind_shapes``), device buffers shared
by liveness (``device_buffers``), the launch context base (``launch_context``) and the private disk
cache (``disk_cache``).  Knows no backend: ``opencl/`` and ``metal/`` build on it."""
