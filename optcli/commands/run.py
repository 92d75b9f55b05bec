"""`optcli run MODEL.nb --input NAME=FILE`: run a model once on given inputs (.npy arrays or
images), save the outputs as .npy, print their shapes and statistics (and the top classes)."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from optcli.commands.common import CONTEXT, clip, file_name, load_npy, load_options, load_predictor, parse_inputs, table
from optcli.errors import UsageError
from optcli.preprocess import HELP as PREPROCESS_HELP
from optcli.preprocess import is_image, load_image, parse


def read_inputs(predictor, specs: tuple[str, ...], preprocess: str | None) -> dict[str, np.ndarray]:
    specs_by_name = {s.name: s for s in predictor.inputs}
    files = parse_inputs(specs, list(specs_by_name))
    missing = [n for n in specs_by_name if n not in files]
    if missing:
        raise UsageError(f"no --input for {', '.join(repr(n) for n in missing)}; give each input as "
                         "--input NAME=FILE.npy (or an image: .png, .jpg)")
    opts = parse(preprocess, "--preprocess")
    feeds = {}
    for name, path in files.items():
        spec = specs_by_name[name]
        feeds[name] = load_image(path, spec.shape, spec.dtype, opts) if is_image(path) else load_npy(path)
    return feeds


def stats_rows(outputs: dict[str, np.ndarray]) -> list[list[str]]:
    rows = []
    for name, y in outputs.items():
        y = np.asarray(y)
        if y.size and y.dtype.kind in "fiub":
            f = y.astype(np.float64)
            finite = f[np.isfinite(f)]
            nonfinite = f.size - finite.size
            vals = [f"{finite.min():.4g}", f"{finite.max():.4g}", f"{finite.mean():.4g}", f"{finite.std():.4g}"] \
                if finite.size else ["-"] * 4
            rows.append([clip(name, 24), str(list(y.shape)), str(y.dtype), *vals,
                         f"{nonfinite} nan/inf" if nonfinite else ""])
        else:
            rows.append([clip(name, 24), str(list(y.shape)), str(y.dtype), "-", "-", "-", "-", ""])
    return rows


def top_k_rows(scores: np.ndarray, k: int, labels: list[str] | None) -> list[list[str]]:
    """Top ``k`` of each row of a [batch, classes] (or [classes]) score array."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1, scores.shape[-1]) if scores.ndim else scores.reshape(1, 1)
    rows = []
    for b, row in enumerate(s):
        probs = row if (row.min() >= 0 and abs(row.sum() - 1) < 1e-3) else np.exp(row - row.max())
        probs = probs / probs.sum()
        for rank, idx in enumerate(np.argsort(-row, kind="stable")[:k], 1):
            label = labels[idx] if labels and idx < len(labels) else ""
            rows.append([str(b), str(rank), str(idx), clip(label, 24), f"{row[idx]:.4g}", f"{probs[idx]:.1%}"])
    return rows


@click.command(name="run", context_settings=CONTEXT)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE", help="An input: a .npy array, or an "
              "image (.png, .jpg; needs pip install 'optcli[images]') resized, center-cropped and scaled to the input "
              "(see --preprocess). Repeat for each input; a one-input model takes just FILE.")
@click.option("--preprocess", metavar="SPEC", help=PREPROCESS_HELP + " The same spec as opt --calib_preprocess.")
@click.option("--output_dir", metavar="DIR", help="Save every output as DIR/NAME.npy (the folder is created).")
@click.option("--top_k", type=click.IntRange(min=1), default=None, metavar="N",
              help="For classifiers: print the N highest scores of the first output (with softmax probabilities "
                   "when the scores are logits).")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), metavar="FILE.txt",
              help="Class names for --top_k, one per line.")
@load_options
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop the run after this many seconds (exit 2): a file whose control flow would run for ever "
                   "ends. A Loop or Scan also stops past OPTCLI_MAX_LOOP_ITERATIONS iterations (default "
                   "1000000).")
def run_command(model, inputs, preprocess, output_dir, top_k, labels, timeout, targets, precision, device, threads):
    """Run a .nb model once on the given inputs, save the outputs as .npy and print their shapes
    and statistics.

    \b
    Examples:
      optcli run model.nb --input input=x.npy --output_dir out
      optcli run classifier.nb --input pixels=photo.png --preprocess imagenet --top_k 5 --labels labels.txt
      optcli run model.nb --input x.png --preprocess signed,size=256,crop=224
    (NAME=FILE: NAME is the model's input name, e.g. 'pixels'; `optcli inspect` lists them. With one
    input, FILE alone.)
    """
    out = Path(output_dir) if output_dir else None
    if out is not None:  # before the run: a long run must not end in "cannot write"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--output_dir: cannot write to {out}: {exc.strerror or exc}") from None
    start = time.perf_counter()
    predictor = load_predictor(model, targets, precision, device, threads)
    loaded = time.perf_counter() - start
    feeds = read_inputs(predictor, inputs, preprocess)
    start = time.perf_counter()
    outputs = predictor.run(feeds, timeout_s=timeout)
    ran = time.perf_counter() - start
    where = f"{predictor.gpu.dev.name} ({getattr(predictor.gpu.dev, 'kind', 'GPU')})" if predictor.gpu else "the CPU"
    click.echo(f"{model}: loaded in {loaded * 1e3:.0f} ms, ran in {ran * 1e3:.1f} ms on {where} "
               "(first run: includes kernel set-up; `optcli bench` times warm runs)")
    click.echo(table(["output", "shape", "dtype", "min", "max", "mean", "std", ""], stats_rows(outputs),
                     right={3, 4, 5, 6}))
    if top_k:
        first = predictor.outputs[0].name
        names = None
        if labels:
            names = [line.strip() for line in Path(labels).read_text().splitlines()]
        scores = np.asarray(outputs[first])
        click.echo(f"\ntop {top_k} of '{first}':")
        rows = top_k_rows(scores, top_k, names)
        if names is None:  # no --labels: no empty label column
            rows = [r[:3] + r[4:] for r in rows]
        header = ["batch", "rank", "class", "label", "score", "prob"] if names is not None else \
            ["batch", "rank", "class", "score", "prob"]
        click.echo(table(header, rows, right={0, 1, 2, len(header) - 2, len(header) - 1}))
    if out is not None:
        try:
            for name, y in outputs.items():
                np.save(out / f"{file_name(name)}.npy", np.asarray(y))
        except OSError as exc:
            raise UsageError(f"--output_dir: cannot write to {out}: {exc.strerror}") from None
        click.echo(f"\nsaved {len(outputs)} output(s) to {out}/ as .npy")

