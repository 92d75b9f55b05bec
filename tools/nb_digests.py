"""The sha256 of every `.nb` that `opt` writes for the zoo and the built corpus, under several option sets.

Why: a change meant to move code without changing behaviour (issue 20's re-housing) must leave every
written file byte-identical.  Run it before the change (``--out before.json``) and after
(``--compare before.json``): it prints each file that differs and exits 1 if any does.

    python tools/nb_digests.py --out /tmp/before.json
    python tools/nb_digests.py --compare /tmp/before.json

The corpus part reads ``$OPTCLI_CORPUS_DIR`` (default ``~/.cache/optcli/corpus``) and is skipped
with a note when it is not built.  With ``--keep DIR`` the `.nb` files themselves are kept there
(old files for the load tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optcli  # noqa: E402
from optcli.zoo import ZOO, build, sample_inputs  # noqa: E402

# name -> keyword arguments of optcli.optimize
OPTION_SETS = {
    "arm": {"valid_targets": "arm"},
    "opencl_fp32": {"valid_targets": "opencl,arm"},
    "opencl_fp16": {"valid_targets": "opencl,arm", "precision": "fp16"},
    "metal": {"valid_targets": "metal,arm"},
    "weights_int8": {"valid_targets": "arm", "quant_type": "QUANT_INT8"},
    "weights_fp16": {"valid_targets": "arm", "enable_fp16": True},
}
FULL_INT8_MODELS = ("mobilenet_v2", "resnet18")  # calibrated int8 is slow: two models show it


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _compile(name: str, keep: Path | None, **kwargs) -> str:
    try:
        data = optcli.optimize(**kwargs).data
    except optcli.OptError as exc:  # a refusal is a result too: it must not change either
        return "refused: " + str(exc).splitlines()[0]
    if keep is not None:
        (keep / f"{name}.nb").write_bytes(data)
    return _digest(data)


def zoo_digests(keep: Path | None) -> dict[str, str]:
    out = {}
    for model_name in sorted(ZOO):
        model = build(model_name)
        for set_name, kwargs in OPTION_SETS.items():
            key = f"zoo/{model_name}/{set_name}"
            out[key] = _compile(key.replace("/", "_"), keep, model=model, **kwargs)
            print(key, out[key][:16], flush=True)
        if model_name in FULL_INT8_MODELS:
            with tempfile.TemporaryDirectory() as calib:
                for i in range(4):
                    feeds = sample_inputs(model, seed=i)
                    np.savez(Path(calib) / f"{i}.npz", **feeds)
                key = f"zoo/{model_name}/full_int8"
                out[key] = _compile(key.replace("/", "_"), keep, model=model, valid_targets="arm", quant_type="INT8",
                                    calib_data=calib)
                print(key, out[key][:16], flush=True)
    return out


def corpus_digests(keep: Path | None) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from corpus.evaluate import corpus_dir, load_manifest, pinned_shapes

    folder = corpus_dir()
    entries = load_manifest(folder)
    if not entries:
        print(f"no corpus in {folder}: corpus digests skipped", file=sys.stderr)
        return {}
    out = {}
    for entry in entries:
        path = folder / entry["file"]
        for set_name in ("arm", "opencl_fp32"):
            kwargs = dict(OPTION_SETS[set_name])
            if set_name != "arm":
                kwargs["input_shapes"] = pinned_shapes(entry)
            key = f"corpus/{entry['name']}/{set_name}"
            out[key] = _compile(key.replace("/", "_"), keep, model_file=path, **kwargs)
            print(key, out[key][:16], flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the digests to this JSON file")
    parser.add_argument("--compare", type=Path, help="compare with digests written earlier; exit 1 on a difference")
    parser.add_argument("--keep", type=Path, help="keep the .nb files in this folder")
    parser.add_argument("--no-corpus", action="store_true", help="the zoo only")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    digests = zoo_digests(args.keep)
    if not args.no_corpus:
        digests.update(corpus_digests(args.keep))
    if args.out:
        args.out.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = sorted(k for k in before.keys() & digests.keys() if before[k] != digests[k])
        missing = sorted(before.keys() ^ digests.keys())
        for key in differ:
            print(f"DIFFERS {key}: {before[key][:40]} -> {digests[key][:40]}")
        for key in missing:
            print(f"ONLY ONE SIDE {key}")
        same = len(before.keys() & digests.keys()) - len(differ)
        print(f"{same} identical, {len(differ)} differ, {len(missing)} on one side only")
        return 1 if differ or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
