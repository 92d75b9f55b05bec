"""Re-check a built corpus with onnxruntime: every model in manifest.json loads and runs.

    python corpus/check_ort.py [--dir DIR] [--subset ci|all] [--only GLOB]

build.py already does this once per model at build time; this script re-runs it on demand,
from any venv that has numpy and onnxruntime (optcli's included), e.g. after upgrading
onnxruntime, and shows what the test-data generator feeds (corpus/common.random_feeds, which
the optcli tests can reuse). It also runs each model with its symbolic dims doubled, to see
whether the file's dynamic dims really are dynamic. Exit status 1 if any model fails.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import random_feeds  # noqa: E402


def grown(inputs: list[dict]) -> list[dict]:
    return [dict(i, shape=[(d * 2 if d > 1 else 2) if k in i["symbolic"] else d
                           for k, d in enumerate(i["shape"])]) for i in inputs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.environ.get("OPTCLI_CORPUS_DIR")
                    or os.path.expanduser("~/.cache/optcli/corpus"))
    ap.add_argument("--subset", choices=["ci", "all"], default="all")
    ap.add_argument("--only", help="glob on model names")
    args = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort

    with open(os.path.join(args.dir, "manifest.json")) as f:
        manifest = json.load(f)
    bad = 0
    for e in manifest["models"]:
        if args.subset not in e["subset"] or (args.only and not fnmatch.fnmatch(e["name"], args.only)):
            continue
        t0 = time.time()
        note = ""
        try:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            sess = ort.InferenceSession(os.path.join(args.dir, e["file"]), so,
                                        providers=["CPUExecutionProvider"])
            outs = sess.run(None, random_feeds(e["inputs"]))
            if not all(np.isfinite(o).all() for o in outs if o.dtype.kind == "f"):
                note = " (non-finite outputs)"
            if any(i["symbolic"] for i in e["inputs"]):
                try:
                    sess.run(None, random_feeds(grown(e["inputs"])))
                    note += " dynamic ok"
                except Exception as ex:  # noqa: BLE001
                    note += f" dynamic dims FAIL: {str(ex)[:120]}"
            status = "ok  "
        except Exception as ex:  # noqa: BLE001
            status, note, bad = "FAIL", f" {type(ex).__name__}: {str(ex)[:200]}", bad + 1
        shapes = " ".join(f"{i['name']}{i['shape']}" for i in e["inputs"])
        print(f"{status} {e['name']:48s} {time.time() - t0:5.2f}s  {shapes}{note}", flush=True)
    for e in manifest.get("failed", []):
        print(f"(not built) {e['name']}: {e['error'][:160]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
