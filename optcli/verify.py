"""``opt --verify``: measure what optimization did to the answers, before shipping.

The original model runs on the reference (onnxruntime when installed, else the fp32 `arm` plan of
the same model) and the optimized `.nb` runs as an app would load it, on the same inputs: the
``--verify_data`` samples, else the ``--calib_data`` ones, else seeded random inputs (a weak
verdict: random inputs drive many models into corners real data never reaches).

Per output, over all samples:

* ``snr_db``: signal-to-noise ratio, 10 log10(sum ref^2 / sum (got - ref)^2); None when exact;
* ``cosine``: cosine similarity of the flattened outputs;
* ``max_abs_error`` and ``relative_error``: the largest error relative to the output's own scale
  (largest |ref|); for maps (rank >= 3) per channel, each channel against its own scale (the
  channel axis is axis 1 or the last, whichever is shorter), reporting the worst channel;
* classifier-like outputs (rank 2, [batch, K >= 2] float scores): ``top1_agreement`` (the argmax
  agrees) and, for K > 5, ``top5_agreement`` (the reference's top class is in the top 5).

The pass rule (``rule()``) depends on the plan's precision: SNR >= 80 dB (fp32), 60 dB (int16
weights), 40 dB (fp16), 20 dB (int8 weights, full int8 or pre-quantized), and for int8 plans
top-1 agreement >= 95% on classifier-like outputs when the samples are real.  ``--verify_tolerance
R`` replaces the SNR floor with -20 log10(R) dB (R: largest RMS error per RMS of the output) and
``--verify_top1`` the top-1 floor.  A failure makes the CLI exit with code 3.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from optcli.errors import OptError, UsageError
from optcli.progress import progress, stage
from optcli.runtime.load import load
from optcli.tolerance import VERIFY_NOISE, VERIFY_ROUNDING, VERIFY_TOP1, nonfinite_match

QUANTIZED_OPS = {"FakeQuant", "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm",
                 "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}


class VerifyError(OptError):
    """The optimized model's outputs are further from the original than the tolerance allows."""

    exit_code = 3


@dataclass
class Rule:
    precision: str  # fp32 | int16 | fp16 | int8: what the plan does to the numbers
    min_snr_db: float
    min_top1: float | None  # for classifier-like outputs; None: not judged
    rounding: float = 0.0  # differences up to this (times the output's scale when above 1) are rounding

    def describe(self) -> str:
        top1 = f", top-1 agreement >= {self.min_top1:.0%} on classifier outputs" if self.min_top1 else ""
        return f"SNR >= {self.min_snr_db:g} dB{top1}"


@dataclass
class OutputCheck:
    name: str
    shape: list[int]
    kind: str  # classifier | map | tensor | exact (integer and bool outputs: compared for equality)
    max_abs_error: float | None  # None where the outputs cannot be compared (see failures)
    relative_error: float | None
    worst_channel: int | None
    cosine: float | None
    snr_db: float | None  # None: no error at all, or not comparable
    top1_agreement: float | None
    top5_agreement: float | None
    passed: bool
    failures: list[str] = field(default_factory=list)


def plan_precision(plan) -> str:
    """The loosest numeric change in the plan: int8 > fp16 > int16 > fp32."""
    schemes = {scheme for scheme, *_ in plan.weight_formats.values()}
    if "int8" in schemes or plan.metadata.get("quant") == "int8" or any(
            s.op_type in QUANTIZED_OPS for s in plan.steps):
        return "int8"
    if plan.metadata.get("precision") == "fp16" or "fp16" in schemes:
        return "fp16"
    return "int16" if "int16" in schemes else "fp32"


def rule(precision: str, real_samples: bool, tolerance: float | None = None,
         top1: float | None = None) -> Rule:
    noise = VERIFY_NOISE[precision] if tolerance is None else tolerance
    if not noise > 0:
        raise UsageError("--verify_tolerance must be positive (the largest RMS error per RMS of an output)")
    min_top1 = top1 if top1 is not None else (VERIFY_TOP1.get(precision) if real_samples else None)
    return Rule(precision, round(-20 * math.log10(noise), 2), min_top1 or None, VERIFY_ROUNDING[precision])


def onnxruntime_session(model: onnx.ModelProto | str, options=None):
    """An onnxruntime CPU session for ``model`` (a ModelProto or a path), also where the model's IR
    version is newer than the installed onnxruntime reads.  onnx writes its newest IR version by
    default and onnxruntime releases lag behind it (seen: onnx 1.23 writes IR 14, onnxruntime 1.30
    reads up to 13), although most models use nothing the newer IR adds; so a refused IR version is
    retried once on a copy that states the lowest IR version its opsets need.  A model that does need
    the newer IR is then refused by onnxruntime for that reason, in its own words."""
    import onnxruntime as ort

    data = model if isinstance(model, str) else model.SerializeToString()
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        if "ir version" not in str(exc).lower():
            raise
        copy = onnx.load(model) if isinstance(model, str) else onnx.ModelProto.FromString(data)
        lowest = onnx.helper.find_min_ir_version_for(list(copy.opset_import), ignore_unknown=True)
        if lowest >= copy.ir_version:
            raise
        copy.ir_version = lowest
        return ort.InferenceSession(copy.SerializeToString(), options, providers=["CPUExecutionProvider"])


def reference_runner(model: onnx.ModelProto, compile_reference: Callable[[], bytes]):
    """(name, run(feeds) -> {name: array}) for the original model: onnxruntime, or where it is not
    installed optcli's own fp32 `arm` plan (``compile_reference()``: its .nb bytes, made by the caller,
    which owns the compiler)."""
    try:
        sess = onnxruntime_session(model)
        names = [o.name for o in sess.get_outputs()]
        return "onnxruntime", lambda feeds: dict(zip(names, sess.run(None, feeds)))
    except ImportError:
        return "optcli arm fp32", load(compile_reference()).run


def _channel_axis(shape: tuple) -> int | None:
    if len(shape) < 3:
        return None
    return 1 if shape[1] <= shape[-1] else len(shape) - 1


class _Stats:
    """One output's running sums over samples (samples may differ in shape)."""

    def __init__(self):
        self.signal = self.noise = self.dot = self.got_power = 0.0
        self.max_abs = self.scale = 0.0  # largest |error|, largest |reference value|
        self.channel_err: np.ndarray | None = None
        self.channel_scale: np.ndarray | None = None
        self.top1: list[bool] = []
        self.top5: list[bool] = []
        self.nonfinite_differs = False
        self.exact_differs = False
        self.shape: tuple = ()
        self.kind = "tensor"

    def add(self, got: np.ndarray, ref: np.ndarray) -> None:
        self.shape = ref.shape
        if ref.dtype.kind not in "fc":
            self.kind = "exact"
            self.exact_differs |= got.shape != ref.shape or not np.array_equal(got, ref)
            return
        if got.shape != ref.shape or not nonfinite_match(got, ref):
            self.nonfinite_differs = True
            return
        g, r = got.astype(np.float64), ref.astype(np.float64)
        finite = np.isfinite(r)
        g0, r0 = np.where(finite, g, 0.0), np.where(finite, r, 0.0)
        err = np.abs(g0 - r0)
        self.signal += float(np.sum(r0 * r0))
        self.noise += float(np.sum(err * err))
        self.dot += float(np.sum(g0 * r0))
        self.got_power += float(np.sum(g0 * g0))
        self.max_abs = max(self.max_abs, float(err.max()) if err.size else 0.0)
        self.scale = max(self.scale, float(np.abs(r0).max()) if r0.size else 0.0)
        axis = _channel_axis(r.shape)
        self.kind = "map" if axis is not None else self.kind
        reduce = tuple(i for i in range(r.ndim) if i != axis) if axis is not None else None
        ch_err = np.max(err, axis=reduce, keepdims=False) if err.size else np.zeros(1)
        ch_scale = np.max(np.abs(r0), axis=reduce, keepdims=False) if err.size else np.zeros(1)
        ch_err, ch_scale = np.atleast_1d(ch_err), np.atleast_1d(ch_scale)
        if self.channel_err is None:
            self.channel_err, self.channel_scale = ch_err, ch_scale
        elif self.channel_err.shape == ch_err.shape:
            self.channel_err = np.maximum(self.channel_err, ch_err)
            self.channel_scale = np.maximum(self.channel_scale, ch_scale)
        else:  # the channel count differs between samples (dynamic shapes): one channel
            self.channel_err = np.maximum(self.channel_err.max(keepdims=True), ch_err.max(keepdims=True))
            self.channel_scale = np.maximum(self.channel_scale.max(keepdims=True), ch_scale.max(keepdims=True))

    def add_scores(self, got: np.ndarray, ref: np.ndarray) -> None:
        if ref.ndim != 2 or ref.shape[1] < 2 or ref.dtype.kind != "f" or got.shape != ref.shape:
            return
        self.kind = "classifier"
        best = ref.argmax(axis=1)
        self.top1 += list(got.argmax(axis=1) == best)
        if ref.shape[1] > 5:
            top5 = np.argsort(-got, axis=1, kind="stable")[:, :5]
            self.top5 += list((top5 == best[:, None]).any(axis=1))

    def check(self, name: str, r: Rule) -> OutputCheck:
        failures = []
        if self.kind == "exact":
            ok = not self.exact_differs
            return OutputCheck(name, list(self.shape), "exact", 0.0 if ok else None, 0.0 if ok else None, None,
                               1.0 if ok else None, None, None, None, ok,
                               [] if ok else ["values differ (integer output: compared exactly)"])
        if self.nonfinite_differs:
            return OutputCheck(name, list(self.shape), self.kind, None, None, None, None, None, None, None, False,
                               ["shape, NaN or infinity positions differ from the reference"])
        snr = None if self.noise == 0 else 10 * math.log10(max(self.signal, 1e-300) / self.noise)
        norms = math.sqrt(self.signal * self.got_power)
        cosine = self.dot / norms if norms else (1.0 if self.signal == self.got_power else 0.0)
        rel = self.channel_err / np.maximum(self.channel_scale, 1e-6)
        worst = int(np.argmax(rel))
        top1 = float(np.mean(self.top1)) if self.top1 else None
        top5 = float(np.mean(self.top5)) if self.top5 else None
        floor = r.rounding * max(1.0, self.scale)
        if snr is not None and snr < r.min_snr_db and self.max_abs > floor:
            failures.append(f"SNR {snr:.1f} dB < {r.min_snr_db:g} dB (max abs error {self.max_abs:.3g}, above "
                            f"the rounding floor {floor:.3g})")
        if r.min_top1 and top1 is not None and top1 < r.min_top1:
            failures.append(f"top-1 agreement {top1:.1%} < {r.min_top1:.0%}")
        return OutputCheck(name, list(self.shape), self.kind, self.max_abs, float(rel[worst]),
                           worst if self.kind == "map" else None, float(cosine), snr, top1, top5, not failures,
                           failures)


def compare(samples: list[dict], run_ref, run_opt, r: Rule, ref_name: str = "the reference") -> list[OutputCheck]:
    stats: dict[str, _Stats] = {}
    for feeds in progress(samples, desc="verifying", total=len(samples), unit="samples"):
        stage(f"running {ref_name}")
        ref = run_ref(feeds)
        stage("running the optimized .nb")
        got = run_opt(feeds)
        stage(None)
        for name, expected in ref.items():
            s = stats.setdefault(name, _Stats())
            g, e = np.asarray(got[name]), np.asarray(expected)
            s.add(g, e)
            s.add_scores(g, e)
    return [s.check(name, r) for name, s in stats.items()]


def verify(model: onnx.ModelProto, nb_data: bytes, samples: list[dict], compile_reference: Callable[[], bytes],
           tolerance: float | None = None, data: str = "random", top1: float | None = None) -> dict:
    """Run both sides on ``samples`` (``data``: where they came from: random, calib_data,
    verify_data); the report's ``verify`` section.  ``compile_reference``: see ``reference_runner``."""
    predictor = load(nb_data)
    r = rule(plan_precision(predictor.plan), data != "random", tolerance, top1)
    ref_name, run_ref = reference_runner(model, compile_reference)
    checks = compare(samples, run_ref, predictor.run, r, ref_name)
    return {"reference": ref_name, "samples": len(samples), "data": data, "precision": r.precision,
            "rule": {"min_snr_db": r.min_snr_db, "min_top1": r.min_top1, "text": r.describe()},
            "tolerance": 10 ** (-r.min_snr_db / 20), "passed": all(c.passed for c in checks),
            "outputs": [asdict(c) for c in checks]}


DATA_NAMES = {"random": "seeded random input(s)", "calib_data": "--calib_data sample(s)",
              "verify_data": "--verify_data sample(s)"}


def format_verify(section: dict) -> str:
    data = DATA_NAMES.get(section.get("data", "random"), "input(s)")
    lines = [f"verify against {section['reference']} on {section['samples']} {data}; rule for "
             f"{section['precision']} plans: {section['rule']['text']}:"]
    for o in section["outputs"]:
        lines.append(f"  {o['name']} {o['shape']} {o['kind']}: {_metrics(o)} - "
                     f"{'ok' if o['passed'] else 'FAIL: ' + '; '.join(o['failures'])}")
    return "\n".join(lines)


def _metrics(o: dict) -> str:
    if o["kind"] == "exact":
        return "identical" if o["passed"] else "values differ"
    if o["max_abs_error"] is None:
        return "not comparable"
    snr = "exact" if o["snr_db"] is None else f"{o['snr_db']:.1f} dB"
    parts = [f"SNR {snr}", f"cosine {o['cosine']:.6f}", f"max abs error {o['max_abs_error']:.3g}"]
    where = f" in channel {o['worst_channel']}" if o["worst_channel"] is not None else ""
    parts.append(f"relative to scale {o['relative_error']:.2e}{where}")
    if o["top1_agreement"] is not None:
        parts.append(f"top-1 {o['top1_agreement']:.1%}")
    if o["top5_agreement"] is not None:
        parts.append(f"top-5 {o['top5_agreement']:.1%}")
    return ", ".join(parts)
