"""Image inputs for `optcli run --input NAME=photo.png`: decode (Pillow, the `optcli[images]` extra),
resize to the model input's size, scale and normalise (``--preprocess``), lay out as NCHW or
NHWC to match the input's shape."""

from __future__ import annotations

import numpy as np

from optcli.errors import UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
PRESETS = {
    "unit": {"scale": 255.0},
    "raw": {"scale": 1.0},
    "signed": {"scale": 127.5, "mean": [1.0]},
    "imagenet": {"scale": 255.0, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
}
PREPROCESS_HELP = ("How an image input becomes a tensor, as in opt --calib_preprocess: KEY=VALUE pairs, commas "
                   "between: resize=HxW (default: the input's H and W), scale=S (x/S; default 255), mean=R,G,B and "
                   "std=R,G,B (applied after scale), layout=NCHW|NHWC (default: from the input's shape), "
                   "order=RGB|BGR; or a preset: unit (x/255, the default), raw (0..255), signed (x/127.5-1), "
                   "imagenet (x/255 then ImageNet mean and std).")
KEYS = ("resize", "scale", "mean", "std", "layout", "order")


def parse_preprocess(spec: str | None) -> dict:
    """``"imagenet"`` or ``"resize=224,mean=0.485,0.456,0.406,std=0.229,0.224,0.225,layout=NCHW"``."""
    opts: dict = dict(PRESETS["unit"])
    key = None
    for part in (p.strip() for p in (spec or "").split(",") if p.strip()):
        try:
            if part.lower() in PRESETS:
                opts.update(PRESETS[part.lower()])
                key = None
                continue
            if "=" in part:
                key, value = (x.strip() for x in part.split("=", 1))
                key = key.lower()
                if key not in KEYS:
                    raise ValueError
                if key in ("mean", "std"):
                    opts[key] = [float(value)]
                elif key == "scale":
                    opts[key] = float(value)
                elif key == "resize":
                    h, _, w = value.lower().partition("x")
                    opts[key] = (int(h), int(w or h))
                elif value.lower() in {"layout": ("nchw", "nhwc"), "order": ("rgb", "bgr")}[key]:
                    opts[key] = value.lower()
                else:
                    raise ValueError
            elif key in ("mean", "std"):
                opts[key].append(float(part))  # mean=0.485,0.456,0.406 continues the list
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"--preprocess: '{part}' is not understood. {PREPROCESS_HELP}") from None
    return opts


def is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def load_image(path: str, shape: tuple, dtype: str, opts: dict) -> np.ndarray:
    """The image at ``path`` as a tensor for an input of ``shape`` (rank 4 or 3, dims may be symbolic)."""
    try:
        from PIL import Image
    except ImportError:
        raise UsageError(f"--input {path}: image inputs need Pillow; install the extra with "
                         "pip install 'optcli[images]' (or pass a .npy file)") from None
    if len(shape) not in (3, 4):
        raise UsageError(f"--input {path}: an image needs a rank 3 or 4 input, the model's is {list(shape)}")
    dims = list(shape) if len(shape) == 4 else [1, *shape]
    layout = opts.get("layout") or ("nhwc" if dims[3] in (1, 3, 4) and dims[1] not in (1, 3, 4) else "nchw")
    channels, h, w = (dims[1], dims[2], dims[3]) if layout == "nchw" else (dims[3], dims[1], dims[2])
    if not isinstance(channels, int) or channels not in (1, 3, 4):
        raise UsageError(f"--input {path}: the input {list(shape)} has no 1, 3 or 4 channel axis; pass a .npy file")
    size = opts.get("resize") or ((h, w) if isinstance(h, int) and isinstance(w, int) else None)
    try:
        img = Image.open(path)
        img = img.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels])
    except OSError as exc:
        raise UsageError(f"--input {path}: cannot read the image ({exc})") from None
    if size is not None and img.size != (size[1], size[0]):
        img = img.resize((size[1], size[0]), Image.BILINEAR)
    x = np.asarray(img, dtype=np.float32)
    if x.ndim == 2:
        x = x[:, :, None]
    if opts.get("order") == "bgr" and channels >= 3:
        x = x[:, :, [2, 1, 0, *range(3, channels)]]
    x = x / opts.get("scale", 255.0)
    for key, op in (("mean", np.subtract), ("std", np.divide)):
        if key in opts:
            vec = np.asarray(opts[key], np.float32)
            if vec.size not in (1, channels) and not (vec.size == 3 and channels == 4):
                raise UsageError(f"--preprocess: {key} has {vec.size} values, the input has {channels} channels")
            if vec.size == 3 and channels == 4:
                vec = np.append(vec, 0.0 if key == "mean" else 1.0)
            x = op(x, vec)
    if layout == "nchw":
        x = x.transpose(2, 0, 1)
    x = x[None] if len(shape) == 4 else x
    return np.ascontiguousarray(x.astype(dtype if dtype != "unknown" else np.float32))
