"""Build the optcli test corpus: ONNX models as the real exporters write them, cached outside the repo.

    python corpus/build.py [--subset ci|all] [--out DIR] [--only GLOB] [--force] [--list]

Run it from the exporter venv (corpus/requirements.txt or requirements-ci.txt), not optcli's.
Models go to DIR (default $OPTCLI_CORPUS_DIR, else ~/.cache/optcli/corpus), one folder per model
with a `recipe.json` stamp; a model whose stamp key (hash of its recipe params and the versions
of the tools it needs) is unchanged is skipped. Each built model is loaded and run once in
onnxruntime on its manifest feeds. DIR/manifest.json lists every model built in DIR (any subset;
entries say which subsets they belong to; a recipe not selected in this run keeps its last build)
and the recipes that failed, with the error.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Recipe, describe_inputs, files_of, import_torchvision, random_feeds  # noqa: E402

DISTS = {"torch": ["torch"], "timm": ["timm"], "transformers": ["transformers"],
         "onnxscript": ["onnxscript"], "onnx": ["onnx"], "onnxruntime": ["onnxruntime"],
         "nudenet": ["nudenet"], "tflite2onnx": ["tflite2onnx"], "tf2onnx": ["tf2onnx"],
         "tensorflow": ["tensorflow-cpu", "tensorflow"]}


def all_recipes() -> list[Recipe]:
    import recipes_derived
    import recipes_hf
    import recipes_recurrent
    import recipes_small
    import recipes_torch
    import recipes_wheels
    base = recipes_torch.recipes() + recipes_hf.recipes() + recipes_wheels.recipes()
    # recipes_recurrent brings its own derived model (quantized LSTM) after its base.
    return (base + recipes_derived.recipes({r.name: r for r in base}) + recipes_recurrent.recipes()
            + recipes_small.recipes())


def version_of(module: str) -> str | None:
    for dist in DISTS.get(module, [module]):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def select(recipes: list[Recipe], subset: str, only: str | None) -> list[Recipe]:
    by_name = {r.name: r for r in recipes}
    wanted = {r.name for r in recipes if subset in r.subset and (not only or fnmatch.fnmatch(r.name, only))}
    todo = list(wanted)
    while todo:                                   # pull in the models derived ones read
        for dep in by_name[todo.pop()].deps:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [r for r in recipes if r.name in wanted]   # recipe order keeps bases first


def ort_check(path: str, inputs: list[dict]) -> dict:
    import numpy as np
    import onnxruntime as ort
    t0 = time.time()
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, random_feeds(inputs))
        res = {"ok": True, "seconds": round(time.time() - t0, 3),
               "finite": bool(all(np.isfinite(o).all() for o in outs if o.dtype.kind == "f")),
               "outputs": [{"name": o.name, "shape": list(v.shape), "dtype": str(v.dtype)}
                           for o, v in zip(sess.get_outputs(), outs)]}
        if any(i["symbolic"] for i in inputs):    # are the dynamic dims really dynamic?
            alt = [dict(i, shape=[(d * 2 if d > 1 else 2) if k in i["symbolic"] else d
                                  for k, d in enumerate(i["shape"])]) for i in inputs]
            try:
                sess.run(None, random_feeds(alt))
                res["dynamic_check"] = {"ok": True, "shapes": {i["name"]: i["shape"] for i in alt}}
            except Exception as e:  # noqa: BLE001
                res["dynamic_check"] = {"ok": False, "shapes": {i["name"]: i["shape"] for i in alt},
                                        "error": f"{type(e).__name__}: {str(e)[:300]}"}
        return res
    except Exception as e:  # noqa: BLE001 - any runtime failure is a finding, not a crash
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}


def build_one(r: Recipe, out_dir: str, key: str, ctx: dict) -> dict:
    missing = [m for m in r.needs if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"missing modules {missing} (install corpus/requirements.txt)")
    if "torch" in r.needs and importlib.util.find_spec("torchvision"):
        import_torchvision()                      # before timm/transformers import it
    final, tmp = os.path.join(out_dir, r.name), os.path.join(out_dir, r.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.time()
    try:
        r.build(os.path.join(tmp, r.name + ".onnx"), ctx)
        seconds = round(time.time() - t0, 1)
        path = os.path.join(tmp, r.name + ".onnx")
        inputs, static = describe_inputs(path, r.feeds)
        files = files_of(path)
        for f in os.listdir(tmp):                 # keep only what the model references
            if f not in files:
                os.remove(os.path.join(tmp, f))
        import onnx
        m = onnx.load(path, load_external_data=False)
        entry = {"name": r.name, "file": f"{r.name}/{r.name}.onnx", "family": r.family,
                 "exporter": r.exporter, "inputs": inputs, "static_input": static,
                 "pretrained": r.pretrained, "subset": [s for s in ("ci", "all") if s in r.subset],
                 "files": [f"{r.name}/{f}" for f in files],
                 "size_bytes": sum(os.path.getsize(os.path.join(tmp, f)) for f in files),
                 "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
                 "producer": f"{m.producer_name} {m.producer_version}".strip(),
                 "params": r.params, "key": key, "build_seconds": seconds,
                 "tools": {m: version_of(m) for m in sorted(set(r.needs) | {"onnx"})}}
        entry["ort"] = ort_check(path, inputs)
        if not entry["ort"]["ok"]:                # the corpus only lists models ORT can run
            raise RuntimeError("built, but onnxruntime cannot run it: " + entry["ort"]["error"])
        with open(os.path.join(tmp, "recipe.json"), "w") as f:
            json.dump(entry, f, indent=1)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return entry
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # an older build of a now-failing recipe
        raise


def load_stamp(out_dir: str, name: str) -> dict | None:
    try:
        with open(os.path.join(out_dir, name, "recipe.json")) as f:
            entry = json.load(f)
        if entry["ort"]["ok"] and all(os.path.exists(os.path.join(out_dir, p)) for p in entry["files"]):
            return entry
    except (OSError, ValueError, KeyError):
        pass
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subset", choices=["ci", "all"], default="all")
    ap.add_argument("--out", default=os.environ.get("OPTCLI_CORPUS_DIR")
                    or os.path.expanduser("~/.cache/optcli/corpus"))
    ap.add_argument("--only", help="glob on recipe names (dependencies are built too)")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--list", action="store_true", help="list the selected recipes and exit")
    args = ap.parse_args(argv)
    out_dir = os.path.abspath(args.out)
    recipes = all_recipes()
    chosen = select(recipes, args.subset, args.only)
    if args.list:
        for r in chosen:
            print(f"{r.name:52s} {r.family:12s} {','.join(r.subset):7s} {r.exporter}")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    by_name = {r.name: r for r in recipes}
    ctx = {"cache": out_dir, "recipes": by_name,
           "path": lambda name: os.path.join(out_dir, name, name + ".onnx")}
    keys = recipe_keys(recipes)
    failed: dict[str, dict] = {}
    t_all = time.time()
    print(f"corpus: {len(chosen)} recipes ({args.subset}) -> {out_dir}", flush=True)
    for i, r in enumerate(chosen, 1):
        head = f"[{i}/{len(chosen)}] {r.name}"
        stamp = load_stamp(out_dir, r.name)
        if stamp and stamp.get("key") == keys[r.name] and not args.force:
            print(f"{head}: up to date", flush=True)
            continue
        bad = [d for d in r.deps if d in failed]
        if bad:
            failed[r.name] = {"name": r.name, "exporter": r.exporter, "error": f"base model failed: {bad}"}
            print(f"{head}: SKIPPED, base failed", flush=True)
            continue
        print(f"{head}: building ({r.exporter}) ...", flush=True)
        t0 = time.time()
        try:
            e = build_one(r, out_dir, keys[r.name], ctx)
            dyn = e["ort"].get("dynamic_check")
            ort = "ort ok" + ("" if not dyn else ", dynamic dims ok" if dyn["ok"] else ", DYNAMIC DIMS FAIL")
            print(f"{head}: ok {time.time() - t0:.1f}s {e['size_bytes'] / 1e6:.1f} MB, {ort}", flush=True)
        except Exception as ex:  # noqa: BLE001 - record and go on
            msg = f"{type(ex).__name__}: {str(ex)[:800]}"
            failed[r.name] = {"name": r.name, "exporter": r.exporter, "error": msg,
                              "trace": traceback.format_exc(limit=-3)[-1500:]}
            print(f"{head}: FAILED after {time.time() - t0:.1f}s: {msg[:300]}", flush=True)
    write_manifest(out_dir, recipes, keys, failed, chosen)
    print(f"corpus: done in {time.time() - t_all:.1f}s, {len(failed)} failed; manifest {out_dir}/manifest.json")
    return 0


def recipe_keys(recipes: list[Recipe]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for r in recipes:                             # bases come first, so dep keys are known
        versions = {m: version_of(m) for m in sorted(set(r.needs) | {"onnx"})}
        keys[r.name] = r.key(versions, {d: keys[d] for d in r.deps})
    return keys


def write_manifest(out_dir: str, recipes: list[Recipe], keys: dict, failed: dict,
                   chosen: list[Recipe]) -> None:
    path = os.path.join(out_dir, "manifest.json")
    old_failed = {}
    try:
        with open(path) as f:
            old_failed = {e["name"]: e for e in json.load(f).get("failed", [])}
    except (OSError, ValueError):
        pass
    attempted = {r.name for r in chosen}
    models = []
    for r in recipes:
        stamp = load_stamp(out_dir, r.name)
        # A recipe not attempted now keeps its last build: this venv may lack its tools.
        fresh = stamp and (r.name not in attempted or stamp.get("key") == keys[r.name])
        if fresh and r.name not in failed:
            models.append(stamp)
        elif r.name in failed:
            continue
        elif r.name in old_failed and r.name not in attempted:
            failed[r.name] = old_failed[r.name]
    manifest = {"version": 1, "generated_by": "corpus/build.py",
                "tools_of_last_run": {m: version_of(m) for m in sorted(DISTS)},
                "models": models, "failed": [failed[k] for k in sorted(failed)]}
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
