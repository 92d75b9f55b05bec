"""Shared pieces of the corpus recipes: the Recipe record, input specs, small ONNX helpers.

A recipe is data (name, family, exporter label, params) plus a `build(out_path, ctx)` function
that writes one ONNX file (and maybe its external data beside it). Everything a recipe's output
depends on goes into `params`, because the cache key is a hash of the recipe's params and the
versions of the tools, so a changed recipe is rebuilt and an unchanged one is skipped.

This file imports nothing heavy (no torch, no tensorflow): build.py lists recipes cheaply and
each recipe imports its exporter only when it is built.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

SEED = 0


@dataclasses.dataclass
class Feed:
    """How to feed one input when testing: static shape and value range for random data."""
    shape: list[int]
    low: float = 0.0
    high: float = 1.0


@dataclasses.dataclass
class Recipe:
    name: str
    family: str                    # vision | text | audio | detection | segmentation | landmark
    exporter: str                  # human label: "torch.onnx TorchScript opset 13", ...
    build: Callable[..., None]     # build(out_path: str, ctx: dict) -> None
    feeds: dict[str, Feed]         # per input name ("*": any); others get [0, 1) and dims 1
    params: dict[str, Any]
    pretrained: bool = False
    subset: tuple[str, ...] = ("all",)
    deps: tuple[str, ...] = ()     # names of recipes whose files this one reads (derived models)
    needs: tuple[str, ...] = ()    # python modules the build needs (checked before building)

    def key(self, versions: dict[str, str], dep_keys: dict[str, str]) -> str:
        blob = json.dumps({"name": self.name, "params": self.params, "versions": versions,
                           "deps": dep_keys, "seed": SEED}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def seed_everything(seed: int = SEED) -> None:
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
        torch.manual_seed(seed)
    except ImportError:
        pass


def seeded_eval(cls, *args):
    """``cls(*args)`` built after seeding, in eval mode, with non-trivial BatchNorm2d statistics
    (drawn from the same seeded stream) so that conv+BN folding is not a no-op."""
    import torch
    seed_everything()
    model = cls(*args).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 16: "bfloat16"}


def describe_inputs(onnx_path: str, feeds: dict[str, Feed]) -> tuple[list[dict], bool]:
    """Read the model's graph inputs (not initializers) and merge the recipe's feed specs.

    Returns the manifest "inputs" list and whether every input dim in the file is static
    (a positive dim_value; paddle-style -1 and dim_param both count as dynamic).
    """
    import onnx
    model = onnx.load(onnx_path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out, static = [], True
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = list(tt.shape.dim)
        symbolic = [i for i, d in enumerate(dims) if not (d.HasField("dim_value") and d.dim_value > 0)]
        static = static and not symbolic
        feed = feeds.get(vi.name, feeds.get("*"))
        if feed is None:
            feed = Feed([d.dim_value if i not in symbolic else 1 for i, d in enumerate(dims)])
        if len(feed.shape) != len(dims):
            raise ValueError(f"feed shape {feed.shape} does not match rank of input {vi.name}")
        out.append({"name": vi.name, "dtype": _ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type)),
                    "shape": list(feed.shape), "symbolic": symbolic,
                    "low": feed.low, "high": feed.high})
    return out, static


def random_feeds(inputs: list[dict], seed: int = SEED) -> dict:
    """Random test data for the manifest's inputs (ints in [low, high), floats in [low, high))."""
    import numpy as np
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        dt = np.dtype(spec["dtype"])
        if dt.kind in "iu":
            feeds[spec["name"]] = rng.integers(int(spec["low"]), int(spec["high"]), spec["shape"]).astype(dt)
        elif dt.kind == "b":
            feeds[spec["name"]] = rng.integers(0, 2, spec["shape"]).astype(bool)
        else:
            x = rng.random(spec["shape"]) * (spec["high"] - spec["low"]) + spec["low"]
            feeds[spec["name"]] = x.astype(dt)
    return feeds


def files_of(onnx_path: str) -> list[str]:
    """The .onnx file and its external data files (basenames), as the exporter wrote them."""
    import os

    import onnx
    model = onnx.load(onnx_path, load_external_data=False)
    extra = set()
    for t in model.graph.initializer:
        for kv in t.external_data:
            if kv.key == "location":
                extra.add(kv.value)
    return [os.path.basename(onnx_path)] + sorted(extra)


_TV_LIB = None


def import_torchvision() -> None:
    """Import torchvision even when its C ops cannot load (timm needs it; no op is used).

    PyPI's torchvision wheels are linked against the CUDA build of torch (libtorch_cuda.so);
    with the CPU torch wheel its `_C` fails to load, and torchvision then dies on
    `register_fake("torchvision::nms")` ("operator torchvision::nms does not exist"). Defining
    the two op schemas it registers fakes for lets the import finish; the ops stay unusable.
    """
    global _TV_LIB
    import sys
    try:
        import torchvision  # noqa: F401
        return
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    import torch
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]
    _TV_LIB = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            _TV_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:                      # already defined (ops did load after all)
            pass
    import torchvision  # noqa: F401,F811
