"""Calibration and verification inputs: samples from a folder (``--calib_data=DIR``) or seeded
random ones.

A folder holds one sample per file: ``.npy`` (single-input models), ``.npz`` (keyed by input
name), or images (``.png``/``.jpg``/``.jpeg``/``.bmp``/``.webp``, Pillow needed: ``pip install
"optcli[images]"``) turned into a tensor by ``--calib_preprocess`` (``optcli/preprocess.py``, the
same spec and code as ``optcli run --preprocess``).  Files are read in name order, so runs repeat.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optcli import preprocess
from optcli.errors import UsageError
from optcli.ir import Value


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


def load_samples(folder: str | Path, inputs: list[Value], spec: str | None = None,
                 limit: int | None = None, flag: str = "--calib_data") -> list[dict[str, np.ndarray]]:
    """One feed dict per file of ``folder`` (name order); images through the ``spec``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{flag}: {folder} is not a directory")
    files = sorted(p for p in folder.iterdir()
                   if p.suffix.lower() in (".npy", ".npz") or preprocess.is_image(p))
    if not files:
        raise UsageError(f"{flag}: {folder} holds no .npy, .npz or image files")
    opts = preprocess.parse(spec, "--calib_preprocess")
    return [_sample(path, inputs, opts, flag) for path in files[:limit]]


def _sample(path: Path, inputs: list[Value], opts: preprocess.Preprocess, flag: str) -> dict[str, np.ndarray]:
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
        x = np.load(path, allow_pickle=False) if suffix == ".npy" else preprocess.load_image(
            path, v.shape, v.dtype, opts, what=flag)
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
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        bad = int(x.size - np.count_nonzero(np.isfinite(x)))
        raise UsageError(f"{path}: input '{v.name}' holds {bad} NaN or infinite value(s) of {x.size}: a calibration "
                         "or verification sample must be finite (a range or an error measured on it means nothing)")
    return x
