"""GPU kernel sources, packaged as optcli.kernels (see README.md here)."""
