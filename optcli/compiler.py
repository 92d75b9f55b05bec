"""The optimize job end to end: read the model, run the pass pipeline, lower, serialize, report.

Used by the `opt` command and by Python callers (``optcli.optimize``).  Nothing here writes a
file; the CLI writes the bytes atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from optcli._version import __version__
from optcli.advice import advise
from optcli.errors import InternalError, ModelError, NbFormatError, UsageError
from optcli.frontend.onnx_reader import read_model
from optcli.frontend.shapes import parse_input_shapes
from optcli.ir import Graph
from optcli.nb.layout import FORMAT_VERSION, SUPPORTED_DTYPES
from optcli.nb.reader import load_bytes
from optcli.nb.writer import to_bytes
from optcli.passes import pipeline
from optcli.passes.base import PassContext
from optcli.passes.place_nodes import placement_report
from optcli.plan import Plan, lower
from optcli.targets import TARGETS, parse_targets

PRECISIONS = ("fp32", "fp16")


@dataclass
class CompileResult:
    plan: Plan
    data: bytes
    report: dict
    warnings: list[str] = field(default_factory=list)


def compile_model(
    model_file: str | Path | None = None,
    model_dir: str | Path | None = None,
    model: onnx.ModelProto | None = None,
    valid_targets: str | list[str] | None = "arm",
    input_shapes: str | dict[str, list[int]] | None = None,
    disabled_passes: tuple[str, ...] | set[str] = (),
    placement_overrides: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    precision: str = "fp32",
    tune: str | None = None,
    quant_type: str | None = None,
    enable_fp16: bool = False,
    verify: bool = False,
    verify_tolerance: float | None = None,
    calib_data: str | Path | None = None,
    calib_preprocess: str | None = None,
    verify_samples: int = 8,
    calibrator: str = "percentile",
    verify_data: str | Path | None = None,
    verify_top1: float | None = None,
) -> CompileResult:
    """Optimize a model.  ``quant_type``: QUANT_INT8 / QUANT_INT16 (weight-only, per output channel);
    ``enable_fp16``: weights stored as fp16 and GPU tensors in half (``precision="fp16"``).
    ``verify``: judge the result against the original on ``verify_data``, else ``calib_data``, else
    ``verify_samples`` seeded random inputs (``optcli/verify.py`` for the rule)."""
    if enable_fp16:
        precision = "fp16"
    if precision not in (*PRECISIONS, "auto"):
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, auto; got '{precision}'")
    full_int8 = quant_type == "INT8" or precision == "auto"
    weight_scheme = None if full_int8 else _weight_scheme(quant_type, enable_fp16)
    targets = parse_targets(valid_targets)
    shapes = parse_input_shapes(input_shapes) if isinstance(input_shapes, str) or input_shapes is None \
        else dict(input_shapes)
    graph = read_model(str(model_file) if model_file else None, str(model_dir) if model_dir else None,
                       shapes, model=model)
    before = graph.op_counts()
    nodes_before = len(graph.nodes)
    ctx = PassContext(targets=targets, options={"placement_overrides": dict(placement_overrides or {}),
                                                "weight_scheme": weight_scheme})
    if full_int8:
        from optcli.calib import load_samples

        if not calib_data:
            raise UsageError("int8 quantization (--quant_type=INT8 or --precision=auto) calibrates on real inputs: "
                             "give --calib_data=DIR")
        ctx.options.update(int8_calibrator=calibrator, precision_auto=precision == "auto",
                           auto_budget=verify_tolerance,
                           calib_samples=load_samples(calib_data, graph.inputs, calib_preprocess))
        precision = "fp32"
    records = pipeline.optimize(graph, ctx, set(disabled_passes), progress=progress)
    graph.metadata["precision"] = precision
    plan = lower(graph, [t.name for t in targets], ctx.options.get("memory"), ctx.options.get("weight_formats"))
    _check_dtypes(plan, graph.metadata.get("source", "model"))
    tuning = _tune(plan, tune) if tune else None
    data = to_bytes(plan)
    _check_readable(data, graph.metadata.get("source", "model"))
    report = build_report(graph, plan, ctx, records, before, nodes_before, data)
    report["advice"] = advise(plan, report)
    if tuning is not None:
        report["tuning"] = tuning
    if full_int8:
        report["int8"] = {"calibrator": calibrator, "samples": len(ctx.options["calib_samples"]),
                          "kept_float": ctx.options.get("int8_kept_float", [])}
    if verify:
        report["verify"] = _verify(model, model_file, model_dir, plan, data, shapes, ctx, verify_tolerance, verify_top1,
                                   verify_data, calib_data, calib_preprocess, verify_samples)
        report["warnings"] = list(ctx.warnings)
    return CompileResult(plan, data, report, list(ctx.warnings))


def _verify(model, model_file, model_dir, plan: Plan, data: bytes, shapes, ctx: PassContext, tolerance, top1,
            verify_data, calib_data, calib_preprocess, count: int) -> dict:
    from optcli.calib import load_samples, random_samples
    from optcli.frontend.onnx_reader import find_model_file, load_onnx
    from optcli.verify import verify

    original = model if model is not None else load_onnx(find_model_file(
        str(model_file) if model_file else None, str(model_dir) if model_dir else None))
    if verify_data or calib_data:
        flag = "--verify_data" if verify_data else "--calib_data"
        samples = load_samples(verify_data or calib_data, plan.inputs, calib_preprocess, flag=flag)
        source = flag[2:]
    else:
        samples, source = random_samples(plan.inputs, count), "random"
        ctx.warnings.append(f"--verify judged the model on {count} seeded random inputs, a weak verdict: random "
                            "inputs drive many models (detectors, segmenters) into corners real data never reaches. "
                            "Give real samples with --verify_data=DIR or --calib_data=DIR")
    return verify(original, data, samples, tolerance, shapes, data=source, top1=top1)


WEIGHT_QUANT_TYPES = {"QUANT_INT8": "int8", "QUANT_INT16": "int16"}  # weight-only; INT8 is full int8 PTQ


def _weight_scheme(quant_type: str | None, enable_fp16: bool) -> str | None:
    if quant_type is not None and quant_type not in WEIGHT_QUANT_TYPES:
        raise UsageError(f"--quant_type must be one of {', '.join(WEIGHT_QUANT_TYPES)}, got '{quant_type}'")
    if quant_type and enable_fp16:
        raise UsageError("--quant_model and --enable_fp16 both choose how weights are stored; give one")
    return WEIGHT_QUANT_TYPES.get(quant_type) if quant_type else ("fp16" if enable_fp16 else None)


def _tune(plan: Plan, level: str) -> dict:
    """Time kernel variants on this machine's GPU and write the winners into the plan."""
    if not any(TARGETS[s.target].device == "gpu" for s in plan.steps):
        raise UsageError("--tune needs GPU steps; optimize with --valid_targets=opencl,arm")
    from optcli.runtime.gpu_plan import GpuSteps
    from optcli.runtime.opencl import ClDevice, DeviceUnavailable
    from optcli.runtime.tuning import tune

    try:
        dev = ClDevice.shared()
    except DeviceUnavailable as exc:
        raise UsageError(f"--tune runs on the device it tunes, and this machine has none usable: {exc}") from None
    steps = GpuSteps(plan, dev, plan.metadata.get("precision", "fp32"), {"opencl"})
    choices = tune(steps, level)
    return {"level": level, "device": dev.name,
            "steps": {plan.steps[i].name: {"kernel": c.kernel, "local_size": c.local_size, "time_us": c.time_us}
                      for i, c in sorted(choices.items())}}


def _check_readable(data: bytes, source: str) -> None:
    """Read the produced bytes back with the validation ``optcli.load`` applies (the reader, then
    the runtime's checks of the steps and its shape derivation): a file our own loader refuses is
    our bug, and must never reach the disk."""
    from optcli.runtime.plan_shapes import check_at_load

    try:
        check_at_load(load_bytes(data, "<the .nb being written>")[0], "<the .nb being written>")
    except NbFormatError as exc:
        raise InternalError(f"{source}: opt produced a .nb its own reader refuses ({exc}); nothing was written. "
                            "This is a bug in optcli: please report it with the model") from None


def _check_dtypes(plan: Plan, source: str) -> None:
    """Refuse, at optimize time, tensors a `.nb` cannot describe (bfloat16, float8, int4...)."""
    for kind, items in (("input", plan.inputs), ("output", plan.outputs)):
        for v in items:
            if v.dtype not in SUPPORTED_DTYPES and v.dtype != "unknown":
                raise ModelError(f"{source}: {kind} '{v.name}' has element type {v.dtype}, which optcli does not "
                                 f"support; supported: {', '.join(SUPPORTED_DTYPES)}")
    for name, w in plan.weights.items():
        if w.dtype.name not in SUPPORTED_DTYPES:
            raise ModelError(f"{source}: weight '{name}' has element type {w.dtype.name}, which optcli does not "
                             "support; convert it (e.g. to float32) before optimizing")


def build_report(graph: Graph, plan: Plan, ctx: PassContext, records: list[dict], ops_before: dict,
                 nodes_before: int, data: bytes) -> dict:
    placement = ctx.options.get("placement", {})
    steps = []
    fallback_ops: dict[str, int] = {}
    for i, s in enumerate(plan.steps):
        fallback = TARGETS[s.target].uses_fallback(s.kernel)
        if fallback:
            fallback_ops[s.op_type] = fallback_ops.get(s.op_type, 0) + 1
        steps.append({"index": i, "name": s.name, "op": s.op_type, "domain": s.domain, "target": s.target,
                      "kernel": s.kernel, "fallback": fallback,
                      "reason": placement.get(s.name, {}).get("reason", "")})
    weights_bytes = _stored_weight_bytes(plan)
    mem = plan.memory
    report = {
        "tool_version": __version__,
        "format_version": FORMAT_VERSION,
        "source": graph.metadata.get("source", ""),
        "targets": plan.targets,
        "inputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape or [])} for v in plan.inputs],
        "outputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape or [])} for v in plan.outputs],
        "nodes_before": nodes_before,
        "nodes_after": len(plan.steps),
        "ops_before": ops_before,
        "ops_after": graph.op_counts(),
        "passes": records,
        "steps": steps,
        "fallback_ops": dict(sorted(fallback_ops.items())),
        "precision": plan.metadata.get("precision", "fp32"),
        "transfers": _transfers(plan),
        "memory": {"peak_activation_bytes": mem.arena_bytes, "naive_activation_bytes": mem.naive_bytes,
                   "dynamic": mem.arena_bytes is None},
        "sizes": {"file_bytes": len(data), "weights_bytes": weights_bytes,
                  "weights_by_dtype": _by_dtype(plan)},
        "fold_failures": list(ctx.options.get("fold_failures", [])),
        "warnings": list(ctx.warnings),
    }
    report.update(placement_report(report))  # steps_per_target, placement_reasons
    return report


def _transfers(plan: Plan) -> dict[str, int | None]:
    """Host<->device copies per run and the bytes they move (None when a shape is dynamic)."""
    copies = [s for s in plan.steps if s.domain == "optcli" and s.op_type in ("Upload", "Download")]
    sizes = [plan.values[s.inputs[0]].nbytes() for s in copies]
    return {"uploads": sum(s.op_type == "Upload" for s in copies),
            "downloads": sum(s.op_type == "Download" for s in copies),
            "bytes_per_run": None if any(b is None for b in sizes) else sum(sizes)}


_STORED_ITEMSIZE = {"int8": 1, "int16": 2, "fp16": 2}
_STORED_DTYPE = {"int8": "int8", "int16": "int16", "fp16": "float16"}


def _stored_weight_bytes(plan: Plan) -> int:
    return sum(_by_dtype(plan).values())


def _by_dtype(plan: Plan) -> dict[str, int]:
    """Weight bytes as stored in the file, per stored dtype."""
    out: dict[str, int] = {}
    for name, w in plan.weights.items():
        scheme = plan.weight_formats.get(name, (None, 0))[0]
        dtype = _STORED_DTYPE.get(scheme, w.dtype.name)
        nbytes = int(w.size) * _STORED_ITEMSIZE[scheme] if scheme else int(w.nbytes)
        out[dtype] = out.get(dtype, 0) + nbytes
    return dict(sorted(out.items()))
