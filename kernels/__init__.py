"""Kernel sources (gpu/: the GPU dialect, host/: the native host C), packaged as optcli.kernels (see README.md here)."""
