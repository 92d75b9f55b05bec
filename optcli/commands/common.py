"""Helpers the `optcli` subcommands share: loading options, `--input` parsing, generated inputs,
tables and sizes for an 80-column terminal."""

from __future__ import annotations

import re
from pathlib import Path

import click
import numpy as np

from optcli.errors import UsageError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def load_options(fn):
    """--targets/--precision/--device/--threads: how `run` and `bench` load the `.nb`."""
    options = [
        click.option("--targets", metavar="LIST", help="Use only these of the plan's targets (e.g. 'arm' runs "
                     "the GPU steps on the CPU); default: all the plan's targets."),
        click.option("--precision", type=click.Choice(["fp32", "fp16"]), default=None,
                     help="Override the GPU storage precision the plan was optimized with."),
        click.option("--device", metavar="NAME", help="OpenCL device: a part of its name (see `optcli devices`); "
                     "default: the first usable GPU, else the first usable device."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Host CPU threads (BLAS included); default: all cores."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def load_predictor(model: str, targets, precision, device, threads):
    import optcli

    return optcli.load(model, targets=targets, precision=precision, device=device, threads=threads)


def parse_inputs(specs: tuple[str, ...], input_names: list[str]) -> dict[str, str]:
    """`--input NAME=FILE` (or just FILE for a one-input model) -> {name: file}."""
    result: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            if len(input_names) != 1:
                raise UsageError(f"--input {spec}: the model has inputs {', '.join(input_names)}; "
                                 "write --input NAME=FILE")
            name, path = input_names[0], spec
        if name not in input_names:
            raise UsageError(f"--input {spec}: the model has no input '{name}'; its inputs: {', '.join(input_names)}")
        if name in result:
            raise UsageError(f"--input: '{name}' is given twice")
        if not Path(path).is_file():
            raise UsageError(f"--input {spec}: no such file {path}")
        result[name] = path
    return result


def load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        # numpy's own hint on a file that is not an array ("allow_pickle=False") is no use here.
        why = "not a .npy array" if "pickle" in str(exc) or "magic" in str(exc).lower() else str(exc)
        raise UsageError(f"--input: {path} is not a readable .npy file ({why}); save the input with "
                         "numpy.save, or give an image (.png, .jpg)") from None


MAX_RANDOM_BYTES = 2 << 30  # per input: a model file may declare any size; made-up data stays bounded


def random_inputs(predictor, shapes: dict[str, list[int]] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every model input: standard normal floats, small non-negative integers,
    random booleans.  Symbolic dims take their size from ``shapes`` (as --input_shapes)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in predictor.inputs:
        shape = list((shapes or {}).get(spec.name) or spec.shape)
        if len(shape) != len(spec.shape) or not all(isinstance(d, int) and d > 0 for d in shape):
            example = ",".join(str(d) if isinstance(d, int) else "1" for d in spec.shape)
            raise UsageError(f"input '{spec.name}' has dynamic dims {list(spec.shape)}: give its size with "
                             f"--input_shapes={spec.name}:{example} or a file with --input")
        dtype = np.dtype(spec.dtype if spec.dtype != "unknown" else "float32")
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if nbytes > MAX_RANDOM_BYTES:
            raise UsageError(f"input '{spec.name}' has shape {shape}: {human_bytes(nbytes)} of random data is more "
                             f"than the {human_bytes(MAX_RANDOM_BYTES)} optcli makes up; give the input as a file "
                             "with --input")
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[spec.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def file_name(value_name: str) -> str:
    """A value name made safe as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", value_name).strip("._") or "output"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "dynamic"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def table(header: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    """A plain-text table; columns in ``right`` are right-aligned (numbers)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"
