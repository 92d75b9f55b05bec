"""optcli: ahead-of-time ONNX optimizer and GPU runtime."""
__version__ = "0.1.0"
