"""Calibration and verification inputs: samples from a folder (``--calib_data=DIR``) or seeded
random ones.

A folder holds one sample per file: ``.npy`` (single-input models), ``.npz`` (keyed by input
name), or images (``.png``/``.jpg``/``.jpeg``/``.bmp``, Pillow needed: ``pip install
"optcli[images]"``) turned into a tensor by ``--calib_preprocess="resize=224,mean=0.485,0.456,0.406,
std=0.229,0.224,0.225,layout=NCHW,scale=255"``.  Files are read in name order, so runs repeat.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optcli.errors import UsageError
from optcli.ir import Value

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def concrete_shape(v: Value, fallback_batch: int = 1, fallback_dim: int = 32) -> tuple[int, ...]:
    """A concrete shape for an input: symbolic dims become 1 (leading) or ``fallback_dim``."""
    if v.shape is None:
        raise UsageError(f"input '{v.name}' has an unknown rank; give samples with --calib_data")
    return tuple(d if isinstance(d, int) else (fallback_batch if i == 0 else fallback_dim)
                 for i, d in enumerate(v.shape))


def random_samples(inputs: list[Value], count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Seeded inputs: standard normal floats, small non-negative integers, random bools."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        feeds = {}
        for v in inputs:
            shape = concrete_shape(v)
            dtype = np.dtype(v.dtype if v.dtype != "unknown" else "float32")
            if dtype.kind == "f":
                feeds[v.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[v.name] = rng.random(shape) > 0.5
            else:
                feeds[v.name] = rng.integers(0, 4, shape).astype(dtype)
        samples.append(feeds)
    return samples


def parse_preprocess(spec: str | None) -> dict:
    opts = {"resize": None, "mean": [0.0], "std": [1.0], "layout": "NCHW", "scale": 255.0}
    if not spec:
        return opts
    key = None
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if "=" in part:
            key, value = (s.strip() for s in part.split("=", 1))
            if key not in opts:
                raise UsageError(f"--calib_preprocess: unknown key '{key}'; keys: {', '.join(opts)}")
            opts[key] = [value] if key in ("mean", "std") else value
        elif key in ("mean", "std"):
            opts[key].append(part)  # mean=0.485,0.456,0.406 continues the list
        else:
            raise UsageError(f"--calib_preprocess: '{part}' is not KEY=VALUE")
    try:
        opts["mean"] = [float(m) for m in opts["mean"]]
        opts["std"] = [float(s) for s in opts["std"]]
        opts["scale"] = float(opts["scale"])
        if opts["resize"] is not None:
            opts["resize"] = [int(r) for r in str(opts["resize"]).lower().split("x")]
    except ValueError as exc:
        raise UsageError(f"--calib_preprocess: {exc}") from None
    if opts["layout"] not in ("NCHW", "NHWC"):
        raise UsageError("--calib_preprocess: layout must be NCHW or NHWC")
    return opts


def load_image(path: Path, opts: dict) -> np.ndarray:
    """An image file as a float32 [1, C, H, W] (or NHWC) tensor, per the preprocessing spec."""
    try:
        from PIL import Image
    except ImportError:
        raise UsageError(f"{path}: reading images needs Pillow: pip install \"optcli[images]\"") from None
    try:
        img = Image.open(path).convert("RGB")
    except Exception as exc:
        raise UsageError(f"{path}: not a readable image ({exc})") from None
    if opts["resize"]:
        size = opts["resize"]
        img = img.resize((size[-1], size[0]) if len(size) > 1 else (size[0], size[0]))
    x = np.asarray(img, dtype=np.float32) / opts["scale"]
    x = (x - np.asarray(opts["mean"], np.float32)) / np.asarray(opts["std"], np.float32)
    x = x[None]
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if opts["layout"] == "NCHW" else x)


def load_samples(folder: str | Path, inputs: list[Value], preprocess: str | None = None,
                 limit: int | None = None) -> list[dict[str, np.ndarray]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--calib_data: {folder} is not a directory")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".npy", ".npz", *IMAGE_SUFFIXES))
    if not files:
        raise UsageError(f"--calib_data: {folder} holds no .npy, .npz or image files")
    opts = parse_preprocess(preprocess)
    samples = []
    for path in files[:limit]:
        samples.append(_sample(path, inputs, opts))
    return samples


def _sample(path: Path, inputs: list[Value], opts: dict) -> dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            missing = [v.name for v in inputs if v.name not in data]
            if missing:
                raise UsageError(f"{path}: no array for input(s) {', '.join(missing)}; keys are {list(data)}")
            return {v.name: _fit(path, v, data[v.name]) for v in inputs}
    if len(inputs) != 1:
        raise UsageError(f"{path}: the model has {len(inputs)} inputs; use .npz files keyed by input name")
    v = inputs[0]
    try:
        x = np.load(path, allow_pickle=False) if suffix == ".npy" else load_image(path, opts)
    except ValueError as exc:
        raise UsageError(f"{path}: not a readable .npy file ({exc})") from None
    return {v.name: _fit(path, v, x)}


def _fit(path: Path, v: Value, x: np.ndarray) -> np.ndarray:
    """Cast to the input's dtype and add a leading batch dim when the file has none."""
    x = np.asarray(x, dtype=v.dtype if v.dtype != "unknown" else None)
    if v.shape is not None and x.ndim == len(v.shape) - 1:
        x = x[None]
    if v.shape is not None and (x.ndim != len(v.shape) or any(
            isinstance(d, int) and d != s for d, s in zip(v.shape, x.shape))):
        raise UsageError(f"{path}: sample shape {list(x.shape)} does not fit input '{v.name}' {list(v.shape)}")
    return x
