"""optcli: an ahead-of-time ONNX model optimizer and GPU runtime.

    import optcli
    result = optcli.optimize(model_file="model.onnx", valid_targets="opencl,arm")
    predictor = optcli.load(result.data)           # or optcli.load("model.nb")
    outputs = predictor.run({"input": x})
"""

from optcli._version import __version__
from optcli.errors import OptError


def optimize(options=None, progress=None, **fields):
    """Optimize an ONNX model: ``optcli.compiler.CompileOptions`` (or its fields as keyword
    arguments: ``model_file=``, ``valid_targets=``, ``quant_type=``...) -> ``CompileResult``."""
    from optcli.compiler import compile_model

    return compile_model(options, progress, **fields)


def load(*args, **kwargs):
    """Load a `.nb` file (path or bytes) into a Predictor; see ``optcli.runtime.load.load``."""
    from optcli.runtime.load import load as _load

    return _load(*args, **kwargs)


def list_devices(check: bool = True):
    """OpenCL devices with their capabilities and whether each is usable (see ``optcli devices``)."""
    from optcli.runtime.opencl.devices import list_devices as _list

    return _list(check)


def __getattr__(name):
    # The Paddle Lite facade, imported lazily so `import optcli` stays light.
    if name in ("MobileConfig", "create_paddle_predictor", "PaddlePredictor"):
        from optcli.runtime import paddle_api

        return getattr(paddle_api, name)
    raise AttributeError(f"module 'optcli' has no attribute '{name}'")


__all__ = ["OptError", "optimize", "load", "list_devices", "MobileConfig", "create_paddle_predictor", "__version__"]
