"""How an image file becomes an input tensor: one spec, one code path, for `opt --calib_preprocess`
(calibration and `--verify` samples) and `optcli run --preprocess`.

By default an image is resized so that it covers the model input's height and width (its shorter
side meets the input's), center-cropped to exactly that size, scaled to [0, 1] and laid out as
the input's shape says (NCHW, or NHWC when the last dim holds 1, 3 or 4 channels and the second
does not).  A spec changes that: a preset, then ``KEY=VALUE`` pairs, commas between::

    imagenet                          x/255, then ImageNet's mean and std (per RGB channel)
    signed,size=256,crop=224          [-1, 1]; shorter side to 256, center 224x224
    mean=0.5,0.5,0.5,std=0.25,bgr     lists continue over the bare numbers that follow
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from optcli.errors import UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
PRESETS = {  # scale, mean, std: x / scale, then (x - mean) / std
    "unit": (255.0, None, None),
    "raw": (1.0, None, None),
    "signed": (127.5, (1.0,), None),
    "imagenet": (255.0, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
HELP = ("How an image becomes a tensor. By default it is resized until it covers the input's H x W (shorter side "
        "first), center-cropped to H x W, scaled to [0, 1] and laid out as the input (NCHW, or NHWC when its last "
        "dim is 1, 3 or 4 channels). A preset: unit ([0, 1], the default), signed ([-1, 1]), imagenet (x/255 then "
        "ImageNet mean and std), raw (0..255); then KEY=VALUE pairs, commas between: mean=R,G,B and std=R,G,B "
        "(after scaling), scale=S (x/S), size=N (shorter side to N before the crop), crop=N or HxW (center crop; "
        "default the input's H x W), resize=HxW (stretch to exactly HxW, no crop), layout=NCHW|NHWC, bgr (channels "
        "in BGR order). Example: imagenet,size=256,crop=224.")


@dataclass(frozen=True)
class Preprocess:
    scale: float = 255.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    size: int | None = None  # shorter side, before the crop
    crop: tuple[int, int] | None = None  # center crop (H, W); default: the input's
    resize: tuple[int, int] | None = None  # stretch to exactly (H, W), no crop
    layout: str | None = None  # "nchw" | "nhwc"; default: from the input's shape
    bgr: bool = False


def _hw(value: str) -> tuple[int, int]:
    h, _, w = value.lower().partition("x")
    hw = (int(h), int(w or h))
    if min(hw) < 1:
        raise ValueError
    return hw


def parse(spec: str | None, flag: str = "--preprocess") -> Preprocess:
    """A spec (see the module docstring) as a ``Preprocess``; ``flag`` names the option in errors."""
    p = Preprocess()
    key = None
    for part in (s.strip() for s in (spec or "").split(",") if s.strip()):
        word = part.lower()
        try:
            if word in PRESETS:
                scale, mean, std = PRESETS[word]
                p, key = replace(p, scale=scale, mean=mean, std=std), None
            elif word in ("bgr", "rgb"):
                p, key = replace(p, bgr=word == "bgr"), None
            elif "=" in part:
                key, value = (x.strip() for x in part.split("=", 1))
                key = key.lower()
                if key in ("mean", "std"):
                    p = replace(p, **{key: (float(value),)})
                elif key == "scale":
                    p = replace(p, scale=float(value))
                elif key == "size":
                    p = replace(p, size=int(value))
                elif key in ("crop", "resize"):
                    p = replace(p, **{key: _hw(value)})
                elif key == "layout" and value.lower() in ("nchw", "nhwc"):
                    p = replace(p, layout=value.lower())
                elif key == "order" and value.lower() in ("rgb", "bgr"):
                    p = replace(p, bgr=value.lower() == "bgr")
                else:
                    raise ValueError
            elif key in ("mean", "std"):
                p = replace(p, **{key: (*getattr(p, key), float(part))})  # mean=0.485,0.456,0.406
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"{flag}: '{part}' is not understood. {HELP}") from None
    if p.scale == 0 or (p.std is not None and 0 in p.std) or (p.size is not None and p.size < 1):
        raise UsageError(f"{flag}: scale, std and size must be non-zero")
    return p


def is_image(path: str | Path) -> bool:
    return str(path).lower().endswith(IMAGE_SUFFIXES)


def input_layout(shape, spec: Preprocess) -> str:
    """'nchw' or 'nhwc' for an image input of rank 3 or 4 (a rank-3 shape has no batch dim)."""
    dims = list(shape) if len(shape) == 4 else [1, *shape]
    return spec.layout or ("nhwc" if dims[3] in (1, 3, 4) and dims[1] not in (1, 3, 4) else "nchw")


def load_image(path: str | Path, shape, dtype: str, spec: Preprocess, what: str = "--input") -> np.ndarray:
    """The image at ``path`` as a tensor for an input of ``shape`` (rank 3 or 4; H and W may be
    symbolic, then the image keeps its size unless ``size``/``crop``/``resize`` say otherwise)."""
    try:
        from PIL import Image
    except ImportError:
        raise UsageError(f"{what} {path}: image inputs need Pillow; install the extra with "
                         "pip install 'optcli[images]' (or pass a .npy file)") from None
    if shape is None or len(shape) not in (3, 4):
        raise UsageError(f"{what} {path}: an image needs a rank 3 or 4 input, the model's is "
                         f"{list(shape) if shape is not None else 'of unknown rank'}")
    dims = list(shape) if len(shape) == 4 else [1, *shape]
    layout = input_layout(shape, spec)
    channels, h, w = (dims[1], dims[2], dims[3]) if layout == "nchw" else (dims[3], dims[1], dims[2])
    if not isinstance(channels, int) or channels not in (1, 3, 4):
        raise UsageError(f"{what} {path}: the input {list(shape)} has no 1, 3 or 4 channel axis; pass a .npy file")
    try:
        img = Image.open(path)
        img = img.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels])
    except (OSError, Image.DecompressionBombError) as exc:
        raise UsageError(f"{what} {path}: cannot read the image ({exc})") from None
    img = _resize_and_crop(img, spec, (h, w) if isinstance(h, int) and isinstance(w, int) else None, path, what)
    x = np.asarray(img, dtype=np.float32)
    if x.ndim == 2:
        x = x[:, :, None]
    if spec.bgr and channels >= 3:
        x = x[:, :, [2, 1, 0, *range(3, channels)]]
    x = x / np.float32(spec.scale)
    for name, values, op in (("mean", spec.mean, np.subtract), ("std", spec.std, np.divide)):
        if values is None:
            continue
        vec = np.asarray(values, np.float32)
        if vec.size == 3 and channels == 4:  # RGB statistics on an RGBA input: alpha untouched
            vec = np.append(vec, np.float32(0.0 if name == "mean" else 1.0))
        if vec.size not in (1, channels):
            raise UsageError(f"{what} {path}: {name} has {vec.size} values, the input has {channels} channels")
        x = op(x, vec)
    if layout == "nchw":
        x = x.transpose(2, 0, 1)
    x = x[None] if len(shape) == 4 else x
    return np.ascontiguousarray(x.astype(dtype if dtype not in (None, "unknown") else np.float32))


def _resize_and_crop(img, spec: Preprocess, target: tuple[int, int] | None, path, what: str):
    from PIL import Image

    if spec.resize is not None:
        rh, rw = spec.resize
        return img if img.size == (rw, rh) else img.resize((rw, rh), Image.BILINEAR)
    crop = spec.crop or target
    w, h = img.size
    if spec.size is not None:
        factor = spec.size / min(h, w)
    elif crop is not None:
        factor = max(crop[0] / h, crop[1] / w)  # just covers the crop
    else:
        factor = 1.0
    rh, rw = max(round(h * factor), 1), max(round(w * factor), 1)
    if (rw, rh) != (w, h):
        img = img.resize((rw, rh), Image.BILINEAR)
    if crop is None or (rh, rw) == crop:
        return img
    ch, cw = crop
    if ch > rh or cw > rw:
        raise UsageError(f"{what} {path}: the crop {ch}x{cw} is larger than the resized image {rh}x{rw}; "
                         "give a larger size= (or none)")
    top, left = int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0))  # torchvision's CenterCrop
    return img.crop((left, top, left + cw, top + ch))
