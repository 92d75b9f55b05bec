"""The optimize job end to end: read the model, run the pass pipeline, lower, serialize, report.

Used by the `opt` command and by Python callers (``optcli.optimize``).  Nothing here writes a
file; the CLI writes the bytes atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from optcli._version import __version__
from optcli.advice import advise
from optcli.compile_options import CompileOptions
from optcli.errors import InternalError, ModelError, NbFormatError, UsageError
from optcli.frontend.input_shapes import parse_input_shapes
from optcli.frontend.onnx_reader import read_model
from optcli.ir import Graph
from optcli.nb.layout import SUPPORTED_DTYPES
from optcli.nb.reader import load_bytes
from optcli.nb.writer import format_version, to_bytes
from optcli.ops.reference import CONTROL_FLOW, body_ops
from optcli.passes import pipeline
from optcli.passes.base import Int8Settings, PassContext
from optcli.passes.place_nodes import placement_report
from optcli.plan import PRECISIONS, Plan, lower
from optcli.targets import TARGETS, parse_targets

if TYPE_CHECKING:
    import onnx


@dataclass
class CompileResult:
    plan: Plan
    data: bytes
    report: dict
    warnings: list[str] = field(default_factory=list)


def compile_model(options: CompileOptions | None = None, progress: Callable[[str], None] | None = None,
                  **fields) -> CompileResult:
    """Optimize a model: ``options``, or its fields as keyword arguments (``CompileOptions``);
    ``progress`` is called with each pass's record (``name``, ``changed``, ``nodes_before``,
    ``nodes_after``) as soon as the pass finishes."""
    o = options if options is not None else CompileOptions(**fields)
    precision = "fp16" if o.enable_fp16 else o.precision
    if precision not in (*PRECISIONS, "auto"):
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, auto; got '{precision}'")
    full_int8 = o.quant_type == "INT8" or precision == "auto"
    weight_scheme = None if full_int8 else _weight_scheme(o.quant_type, o.enable_fp16)
    targets = parse_targets(o.valid_targets)
    shapes = parse_input_shapes(o.input_shapes) if isinstance(o.input_shapes, str) or o.input_shapes is None \
        else dict(o.input_shapes)
    found: list[str] = []  # what the model declares and its graph does not compute
    source = _source(o)
    graph = read_model(source.path, None, shapes, model=source.model, warnings=found, strict=True,
                       label=source.label)
    before = graph.op_counts()
    nodes_before = len(graph.nodes)
    ctx = PassContext(targets=targets, placement_overrides=dict(o.placement_overrides or {}),
                      weight_scheme=weight_scheme)
    for message in found:
        ctx.warn(message)
    if full_int8:
        from optcli.calib import load_samples

        if not o.calib_data:
            raise UsageError("int8 quantization (--quant_type=INT8 or --precision=auto) calibrates on real inputs: "
                             "give --calib_data=DIR")
        ctx.int8 = Int8Settings(o.calibrator, load_samples(o.calib_data, graph.inputs, o.calib_preprocess),
                                precision_auto=precision == "auto", auto_budget=o.verify_tolerance)
        precision = "fp32"
    records = pipeline.optimize(graph, ctx, set(o.disabled_passes), progress=progress)
    graph.metadata["precision"] = precision
    plan = lower(graph, [t.name for t in targets], ctx.results.memory, ctx.results.weight_formats)
    _check_dtypes(plan, graph.metadata.get("source", "model"))
    tuning = _tune(plan, o.tune) if o.tune else None
    data = to_bytes(plan)
    _check_readable(data, graph.metadata.get("source", "model"))
    report = build_report(graph, plan, ctx, records, before, nodes_before, data)
    report["advice"] = advise(plan, report)
    if source.converted is not None:
        report["converted"] = source.converted
    if tuning is not None:
        report["tuning"] = tuning
    if ctx.int8 is not None:
        report["int8"] = {"calibrator": o.calibrator, "samples": len(ctx.int8.samples),
                          "kept_float": ctx.results.int8_kept_float}
    if o.verify:
        report["verify"] = _verify(o, source, plan, data, shapes, ctx)
        report["warnings"] = list(ctx.warnings)
    return CompileResult(plan, data, report, list(ctx.warnings))


@dataclass
class _Source:
    """The model to read: an ONNX file (``path``) or a model in memory (``model``: the caller's, or
    what a Paddle / TFLite model converted to, ``converted`` saying how, ``label`` naming it)."""

    path: str | None = None
    model: onnx.ModelProto | None = None
    converted: dict | None = None
    label: str | None = None


def _source(o: CompileOptions) -> _Source:
    if o.model is not None:
        if o.model_file or o.model_dir or o.param_file:
            raise UsageError("give the model once: model= or model_file / model_dir, not both")
        return _Source(model=o.model)
    from optcli.frontend.model_formats import convert, identify

    found = identify(o.model_file, o.model_dir, o.param_file)
    if found.format == "onnx":
        return _Source(path=str(found.path))
    model, converted = convert(found)
    return _Source(model=model, converted=converted, label=found.path.name)


def _verify(o: CompileOptions, source: _Source, plan: Plan, data: bytes, shapes, ctx: PassContext) -> dict:
    """Judge the plan against the model it came from (for a converted model: the converter's ONNX)."""
    from optcli.calib import load_samples, random_samples
    from optcli.frontend.onnx_reader import load_onnx
    from optcli.verify import verify

    original = source.model if source.model is not None else load_onnx(Path(source.path))
    if o.verify_data or o.calib_data:
        flag = "--verify_data" if o.verify_data else "--calib_data"
        samples = load_samples(o.verify_data or o.calib_data, plan.inputs, o.calib_preprocess, flag=flag)
        source = flag[2:]
    else:
        # Random inputs for dims the model leaves free would be guessed sizes: a guess that does not
        # fit the model (a window larger than the image) was then reported as the user's input error.
        free = [f"'{v.name}' [{', '.join(str(d) for d in v.shape)}]" for v in plan.inputs
                if v.shape is not None and any(not isinstance(d, int) for d in v.shape[1:])]
        if free:
            raise UsageError(f"--verify on random inputs needs sizes for the dynamic dims of input(s) "
                             f"{', '.join(free)}: give them with --input_shapes (e.g. the size your app feeds), or "
                             "give real samples with --verify_data=DIR")
        samples, source = random_samples(plan.inputs, o.verify_samples), "random"
        ctx.warnings.append(f"--verify judged the model on {o.verify_samples} seeded random inputs, a weak verdict: "
                            "random inputs drive many models (detectors, segmenters) into corners real data never "
                            "reaches. "
                            "Give real samples with --verify_data=DIR or --calib_data=DIR")
    def compile_reference() -> bytes:  # the float reference where onnxruntime is not installed
        return compile_model(model=original, valid_targets="arm", input_shapes=shapes).data

    return verify(original, data, samples, compile_reference, o.verify_tolerance, data=source, top1=o.verify_top1)


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
    from optcli.runtime.opencl.device import ClDevice, DeviceUnavailable
    from optcli.runtime.opencl.steps import OpenClSteps
    from optcli.runtime.opencl.tuning import tune

    try:
        dev = ClDevice.shared()
    except DeviceUnavailable as exc:
        raise UsageError(f"--tune runs on the device it tunes, and this machine has none usable: {exc}") from None
    steps = OpenClSteps(plan, dev, plan.metadata.get("precision", "fp32"), {"opencl"})
    choices = tune(steps, level)
    return {"level": level, "device": dev.name,
            "steps": {plan.steps[i].name: {"kernel": c.kernel, "local_size": c.local_size, "time_us": c.time_us}
                      for i, c in sorted(choices.items())}}


def _check_readable(data: bytes, source: str) -> None:
    """Read the produced bytes back with the validation ``optcli.load`` applies (the reader, then
    the runtime's checks of the steps and its shape derivation): a file our own loader refuses is
    our bug, and must never reach the disk."""
    from optcli.runtime.load_checks import check_at_load

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
    placement = ctx.results.placement
    steps = []
    fallback_ops: dict[str, int] = {}
    for i, s in enumerate(plan.steps):
        fallback = TARGETS[s.target].uses_fallback(s.kernel)
        if fallback:
            fallback_ops[s.op_type] = fallback_ops.get(s.op_type, 0) + 1
        steps.append({"index": i, "name": s.name, "op": s.op_type, "domain": s.domain, "target": s.target,
                      "kernel": s.kernel, "fallback": fallback,
                      "reason": placement.get(s.name, {}).get("reason", "")})
        if s.proto is not None and s.op_type in CONTROL_FLOW:
            steps[-1]["body_ops"] = [{"op": op, "domain": domain, "runs": runs}
                                     for op, domain, runs in body_ops(s.proto)]
    weights_bytes = _stored_weight_bytes(plan)
    mem = plan.memory
    report = {
        "tool_version": __version__,
        "format_version": format_version(plan),
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
        "fold_failures": list(ctx.results.fold_failures),
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
