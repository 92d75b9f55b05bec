"""``opt --verify``: measure what optimization did to the answers, before shipping.

The original model runs on the reference (onnxruntime when installed, else the fp32 `arm` plan of
the same model) and the optimized `.nb` runs as an app would load it, on the same inputs
(calibration samples, or seeded random ones).  Per output: max abs error, error relative to the
output's scale, cosine similarity, and for classifier-shaped outputs ([N, K]) top-1 agreement.
An output fails when its relative error exceeds the tolerance (by default the budget of the
plan's precision in ``optcli/tolerance.py``); the CLI then exits with code 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from optcli.errors import OptError
from optcli.tolerance import RELATIVE, max_error


class VerifyError(OptError):
    """The optimized model's outputs are further from the original than the tolerance allows."""

    exit_code = 3


@dataclass
class OutputCheck:
    name: str
    max_abs_error: float
    relative_error: float
    cosine: float
    top1_agreement: float | None
    passed: bool


def default_tolerance(plan) -> float:
    if any(scheme == "int8" for scheme, *_ in plan.weight_formats.values()) or plan.metadata.get("quant") == "int8":
        return RELATIVE["int8"]
    if plan.metadata.get("precision") == "fp16" or any(s == "fp16" for s, *_ in plan.weight_formats.values()):
        return RELATIVE["fp16"]
    if any(scheme == "int16" for scheme, *_ in plan.weight_formats.values()):
        return 1e-3
    return RELATIVE["fp32"]


def reference_runner(model: onnx.ModelProto, input_shapes):
    """(name, run(feeds) -> {name: array}) for the original model."""
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return "onnxruntime", lambda feeds: dict(zip(names, sess.run(None, feeds)))
    except ImportError:
        import optcli

        fp32 = optcli.load(optcli.optimize(model=model, valid_targets="arm", input_shapes=input_shapes).data)
        return "optcli arm fp32", fp32.run


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a64 @ b64 / (na * nb))


def _top1(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.ndim != 2 or a.shape[1] < 2:
        return None
    return float(np.mean(a.argmax(axis=1) == b.argmax(axis=1)))


def compare(samples: list[dict], run_ref, run_opt, tolerance: float) -> list[OutputCheck]:
    per_output: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for feeds in samples:
        ref, got = run_ref(feeds), run_opt(feeds)
        for name, expected in ref.items():
            per_output.setdefault(name, []).append((np.asarray(got[name]), np.asarray(expected)))
    checks = []
    for name, pairs in per_output.items():
        got = np.concatenate([g.reshape(1, -1) if g.ndim < 2 else g.reshape(g.shape[0], -1) for g, _ in pairs])
        exp = np.concatenate([e.reshape(1, -1) if e.ndim < 2 else e.reshape(e.shape[0], -1) for _, e in pairs])
        if got.dtype.kind not in "fc":
            same = bool(np.array_equal(got, exp))
            checks.append(OutputCheck(name, 0.0 if same else float("inf"), 0.0 if same else float("inf"),
                                      1.0 if same else 0.0, None, same))
            continue
        err, scale = max_error(got, exp)
        rel = err / scale
        checks.append(OutputCheck(name, err, rel, _cosine(got, exp), _top1(got, exp), rel <= tolerance))
    return checks


def verify(model: onnx.ModelProto, nb_data: bytes, samples: list[dict], tolerance: float | None = None,
           input_shapes=None) -> dict:
    """Run both sides on ``samples``; the report's ``verify`` section."""
    import optcli

    predictor = optcli.load(nb_data)
    tol = default_tolerance(predictor.plan) if tolerance is None else tolerance
    ref_name, run_ref = reference_runner(model, input_shapes)
    checks = compare(samples, run_ref, predictor.run, tol)
    return {"reference": ref_name, "samples": len(samples), "tolerance": tol, "passed": all(c.passed for c in checks),
            "outputs": [c.__dict__ for c in checks]}


def format_verify(section: dict) -> str:
    lines = [f"verify against {section['reference']} on {section['samples']} input(s), relative tolerance "
             f"{section['tolerance']:.0e}:"]
    for o in section["outputs"]:
        top1 = f", top-1 agreement {o['top1_agreement']:.1%}" if o["top1_agreement"] is not None else ""
        lines.append(f"  {o['name']}: max abs error {o['max_abs_error']:.3g} (relative {o['relative_error']:.2e}), "
                     f"cosine {o['cosine']:.6f}{top1} - {'ok' if o['passed'] else 'FAIL'}")
    return "\n".join(lines)
