"""Command line: `opt` (Paddle Lite compatible flags) and `optcli` (subcommands).

Exit codes: 0 success, 2 user error (one line: what, where, what to do), 1 internal error.
The `.nb` and the report are written atomically: on any failure nothing is left behind.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click

from optcli._version import __version__
from optcli.commands.bench import bench_command
from optcli.commands.inspect import inspect_command
from optcli.commands.run import run_command
from optcli.errors import OptError, OutputError, TargetError, UsageError
from optcli.nb.layout import FORMAT_VERSION
from optcli.preprocess import HELP as PREPROCESS_HELP
from optcli.progress import silenced

BOOL_FLAG = {"is_flag": False, "flag_value": "true", "default": "false", "type": click.BOOL}


def _interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def _progress(quiet: bool):
    if quiet or not _interactive():
        return None

    def show(record: dict) -> None:
        click.echo(f"\r\033[Kpass {record['name']}: {record['nodes_after']} nodes", nl=False, err=True)

    return show


def _load_placement_config(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"--placement_config: cannot read {p}: {exc.strerror}") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml  # optional: only for YAML placement files

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise UsageError("--placement_config: YAML needs PyYAML (pip install pyyaml); or use JSON") from None
    except Exception as exc:
        raise UsageError(f"--placement_config: {p} does not parse: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise UsageError(f"--placement_config: {p} must map node names or op types to a target name")
    from optcli.targets import get_target

    return {k: get_target(v).name for k, v in data.items()}


def _split_passes(values: tuple[str, ...]) -> set[str]:
    return {p.strip() for v in values for p in v.replace(" ", ",").split(",") if p.strip()}


@click.command(name="opt", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--model_dir", metavar="DIR", help="Directory holding the model: model.onnx or a single .onnx "
              "file, plus its external data files; or a Paddle inference model (inference.pdmodel or inference.json "
              "with inference.pdiparams, or an old __model__ directory); or one .tflite file.")
@click.option("--model_file", metavar="FILE", help="The model file: ONNX, a Paddle program (.pdmodel, Paddle 3's "
              ".json) or a TFLite flatbuffer, told apart by content. Paddle and TFLite models are converted to ONNX "
              "first, by paddle2onnx (pip install 'optcli[paddle]') or tf2onnx (pip install 'optcli[tflite]').")
@click.option("--param_file", metavar="FILE", help="A Paddle program's parameters file (.pdiparams), when its "
              "name is not the program's with .pdiparams (Paddle Lite's --param_file).")
@click.option("--valid_targets", default="arm", show_default=True, metavar="LIST",
              help="Targets, commas or spaces: opencl, metal, arm (host, x86 and cpu also mean the host CPU). "
                   "Each op goes to the first GPU target, in the order listed, that can run it; the host CPU is "
                   "always the last resort, wherever it is listed and when it is left out, so every op can run "
                   "(arm,opencl means opencl,arm).")
@click.option("--optimize_out", metavar="NAME", help="Output path; '.nb' is appended when missing.")
@click.option("--optimize_out_type", default="naive_buffer", show_default=True,
              type=click.Choice(["naive_buffer"]), help="Output format (only naive_buffer, the .nb file).")
@click.option("--input_shapes", metavar="SPEC", help='Pin dynamic input dims: "x:1,3,224,224;y:1,10". Dims '
              "not pinned stay dynamic and the runtime accepts any size that fits.")
@click.option("--disable_pass", multiple=True, metavar="NAME[,NAME]", help="Skip a pass (repeatable); "
              "see --print_passes for names.")
@click.option("--placement_config", metavar="FILE", help="JSON or YAML mapping node names or op types to "
              "a target, overriding automatic placement.")
@click.option("--report", "report_path", metavar="FILE.json", help="Write a machine-readable report: passes "
              "and what each changed, nodes before/after, placement and kernel per step, steps per target, why "
              "ops could not go to a GPU target, nodes that failed to fold, sizes, warnings.")
@click.option("--print_supported_ops", help="Print the op x target table of native kernels and exit.",
              **BOOL_FLAG)
@click.option("--print_all_ops", help="Print every op known (ONNX standard and fused) with how each target "
              "runs it, and exit.", **BOOL_FLAG)
@click.option("--print_model_ops", help="Print the model's ops against the chosen targets: where each runs "
              "and which use the generic fallback.", **BOOL_FLAG)
@click.option("--display_kernels", help="Print the kernel chosen for every step.", **BOOL_FLAG)
@click.option("--print_passes", help="Print the pass pipeline in order and exit.", **BOOL_FLAG)
@click.option("--advise", help="Print performance advice: what in this model will be slow on the chosen GPU "
              "target, why, the estimated cost and the nodes (also in --report as 'advice').", **BOOL_FLAG)
@click.option("--precision", type=click.Choice(["fp32", "fp16", "auto"]), default="fp32", show_default=True,
              help="Storage precision of GPU tensors: fp16 stores half (vload_half) and accumulates in fp32; the "
                   "host CPU always computes fp32. auto: int8 per op where the measured error stays inside the "
                   "budget (--verify_tolerance, default 5e-2), float elsewhere (needs --calib_data).")
@click.option("--quant_model", help="Store weights compressed (with --quant_type): the .nb shrinks about 4x "
              "(QUANT_INT8) or 2x (QUANT_INT16); weights are restored to float once at load.", **BOOL_FLAG)
@click.option("--quant_type", type=click.Choice(["QUANT_INT8", "QUANT_INT16", "INT8"]), default=None,
              help="QUANT_INT8/QUANT_INT16 (with --quant_model): weight-only, symmetric, per output channel. "
                   "INT8: full post-training quantization (int8 weights, u8 activations) calibrated on --calib_data: "
                   "integer kernels on the host (arm), the same quantization as a float view on GPU targets.")
@click.option("--calibrator", type=click.Choice(["minmax", "percentile", "entropy"]), default="percentile",
              show_default=True, help="How INT8 activation ranges come from the calibration samples.")
@click.option("--enable_fp16", help="Store weights as fp16 (about 2x smaller) and GPU tensors as half "
              "(same as --precision=fp16 for the GPU).", **BOOL_FLAG)
@click.option("--verify", help="Run the original model (onnxruntime, else the fp32 arm plan) and the optimized "
              ".nb on the same inputs (--verify_data, else --calib_data, else seeded random inputs with a warning "
              "that the verdict is weak; a model with dynamic dims then needs --input_shapes) and report per output "
              "SNR (dB), cosine similarity, max error relative to the output's scale (per channel for maps) and, "
              "for classifier-like [N, K] outputs, top-1/top-5 agreement. Pass rule per plan precision: SNR >= 80 "
              "dB (fp32), 60 dB (QUANT_INT16), 40 dB (fp16), 20 dB (int8), differences within rounding always "
              "pass and, for int8 on real samples, top-1 >= 95%. A failure on real samples exits with code 3 and "
              "writes no .nb; one on random inputs only warns.", **BOOL_FLAG)
@click.option("--verify_tolerance", type=float, default=None, metavar="R",
              help="--verify's noise budget: the largest RMS error per RMS of each output (SNR >= -20*log10(R) dB; "
                   "default by plan precision: fp32 1e-4, QUANT_INT16 1e-3, fp16 1e-2, int8 0.1). With "
                   "--precision=auto also the per-op budget on the max error relative to the output's scale.")
@click.option("--verify_top1", type=click.FloatRange(0, 1), default=None, metavar="FRACTION",
              help="Top-1 agreement --verify requires of classifier-like [N, K] outputs (default 0.95 for int8 "
                   "plans on real samples, else not judged; 0 turns it off).")
@click.option("--verify_data", metavar="DIR", help="Samples --verify runs on (held out from calibration), in "
              "--calib_data's formats, images through --calib_preprocess.")
@click.option("--calib_data", metavar="DIR", help="Samples for calibration (and --verify when no --verify_data): one "
              "per file, .npy, .npz keyed by input name, or images (with --calib_preprocess; needs optcli[images]).")
@click.option("--calib_preprocess", metavar="SPEC", help=PREPROCESS_HELP + " The same spec and code as optcli run "
              "--preprocess; applies to --verify_data too.")
@click.option("--tune", type=click.Choice(["fast", "normal", "exhaustive"]), default=None,
              help="Time GPU kernel variants and work-group sizes on this machine's device and keep the fastest "
                   "(run it on the machine whose GPU you tune; winners are also cached for tuned loads).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@click.version_option(__version__, "--version", message=f"opt (optcli) %(version)s, .nb format v{FORMAT_VERSION}")
def opt_command(model_dir, model_file, param_file, valid_targets, optimize_out, optimize_out_type, input_shapes,
                disable_pass, placement_config, report_path, print_supported_ops, print_all_ops,
                print_model_ops, display_kernels, print_passes, advise, precision, tune, quant_model, quant_type,
                enable_fp16, verify, verify_tolerance, verify_top1, verify_data, calib_data, calib_preprocess,
                calibrator, quiet):
    """Optimize a model (ONNX, Paddle or TFLite) for the given targets and write one compact NAME.nb file.

    \b
    Examples:
      opt --model_file=mobilenet.onnx --valid_targets=arm --optimize_out=mobilenet
      opt --model_dir=./model --valid_targets=opencl,arm --optimize_out=out/model --report=report.json
      opt --model_dir=./mobilenet_v1 --valid_targets=opencl,arm --optimize_out=mobilenet_v1_opt  (Paddle)
      opt --model_file=detect.tflite --valid_targets=opencl,arm --optimize_out=detect
      opt --print_supported_ops
    """
    from optcli import tables

    if print_passes:
        click.echo(tables.passes_table())
        return
    if print_supported_ops or print_all_ops:
        from optcli.targets import parse_targets

        targets = parse_targets(valid_targets)
        click.echo(tables.all_ops_table(targets) if print_all_ops else tables.supported_ops_table(targets))
        return
    if not model_dir and not model_file:
        raise UsageError("no model given; use --model_file=FILE or --model_dir=DIR (see opt --help)")
    if not optimize_out and not (print_model_ops or display_kernels or advise):
        raise UsageError("no output given; use --optimize_out=NAME to write NAME.nb")

    from optcli.compile_options import CompileOptions, quant_type_of
    from optcli.compiler import compile_model
    from optcli.nb.writer import write_atomic

    show = _progress(quiet)
    with silenced(quiet):
        options = CompileOptions(model_file=model_file, model_dir=model_dir, param_file=param_file,
                                 valid_targets=valid_targets,
                                 input_shapes=input_shapes, disabled_passes=_split_passes(disable_pass),
                                 placement_overrides=_load_placement_config(placement_config),
                                 precision=precision, tune=tune, calibrator=calibrator,
                                 quant_type=quant_type_of(quant_model, quant_type),
                                 enable_fp16=enable_fp16, verify=verify, verify_tolerance=verify_tolerance,
                                 verify_top1=verify_top1, verify_data=verify_data, calib_data=calib_data,
                                 calib_preprocess=calib_preprocess)
        result = compile_model(options, progress=show)
    if show:
        click.echo("\r\033[K", nl=False, err=True)
    if not quiet:
        for w in result.warnings:
            click.echo(f"opt: warning: {w}", err=True)
    if print_model_ops:
        click.echo(tables.model_ops_table(result.report))
    if display_kernels:
        click.echo(tables.kernels_table(result.report))
    if advise:
        from optcli.advice import format_advice

        click.echo(format_advice(result.report.get("advice", [])))
    out = None
    if optimize_out:
        out = Path(optimize_out if optimize_out.endswith(".nb") else optimize_out + ".nb")
        if out.is_dir():
            raise UsageError(f"--optimize_out: {out} is a directory; give a file name")
    checked = result.report.get("verify")
    if checked is not None:
        from optcli.verify import format_verify

        click.echo(format_verify(checked), err=True)
        if not checked["passed"] and checked.get("data") != "random":
            out = None  # a model that fails verification on real samples is not shipped; the report says why
    if out:
        write_atomic(result.data, out)
    if report_path:
        report = {**result.report, "output": str(out) if out else None}
        try:
            write_atomic((json.dumps(report, indent=2) + "\n").encode(), report_path)
        except OutputError as exc:
            if out:
                out.unlink(missing_ok=True)  # all or nothing: no .nb without its report
            raise UsageError(f"--report: {exc}") from None
    if out:
        if not quiet:
            r = result.report
            mem = r["memory"]
            peak = (f"; peak activations {mem['peak_activation_bytes'] / 1e6:.2f} MB (naive "
                    f"{mem['naive_activation_bytes'] / 1e6:.2f} MB)" if mem["peak_activation_bytes"] else "")
            click.echo(f"wrote {out} ({len(result.data) / 1e6:.2f} MB): {r['nodes_before']} nodes -> "
                       f"{_steps_summary(r, r['steps_per_target'])}{peak}", err=True)
            moved_all = _moved_to_host(r)
            if moved_all:
                click.echo(f"opt: {moved_all}", err=True)
    if checked is not None and not checked["passed"] and checked.get("data") == "random":
        # A weak verdict: random inputs drive many models where real data never goes. It warns, it does
        # not fail the job on its own.
        click.echo("opt: warning: --verify fails on random inputs only, a weak verdict; the .nb was written. Judge "
                   "it on real samples with --verify_data=DIR (or --calib_data=DIR) to gate on it", err=True)
    elif checked is not None and not checked["passed"]:
        from optcli.verify import VerifyError

        failed = [f"{o['name']} ({'; '.join(o['failures'])})" for o in checked["outputs"] if not o["passed"]]
        raise VerifyError(f"verification failed for output(s) {', '.join(failed)}; rule for {checked['precision']} "
                          f"plans: {checked['rule']['text']}; no .nb written. Use a higher precision, or "
                          "--verify_tolerance / --verify_top1 if the error is acceptable")


def _steps_summary(report: dict, per_target: dict[str, int]) -> str:
    """'N steps on arm', or 'N steps: K of N steps on opencl, M on arm' when the plan has GPU
    targets: a GPU target listed is not a GPU target used, so say how much it got."""
    from optcli.targets import TARGETS

    n = report["nodes_after"]
    gpu = [t for t in report["targets"] if TARGETS[t].device == "gpu"]
    if not gpu:
        return f"{n} steps on {', '.join(report['targets'])}"
    parts = [f"{per_target.get(t, 0)} of {n} steps on {t}" for t in gpu]
    parts += [f"{per_target.get(t, 0)} on {t}" for t in report["targets"] if t not in gpu]
    return f"{n} steps: {', '.join(parts)}"


def _moved_to_host(report: dict) -> str | None:
    """When the cost model moved every GPU node back to the host: that, and the estimates why."""
    from optcli.passes.keep_small_islands_on_host import NAME

    record = next((p["changed"] for p in report["passes"] if p["name"] == NAME), {})
    gpu_nodes = record.get("gpu_nodes", 0)
    if not gpu_nodes or record.get("nodes_moved") != gpu_nodes:
        return None
    host = report["targets"][-1]
    return (f"the cost model moved all {gpu_nodes} GPU node(s) to {host}: on the GPU they would save an estimated "
            f"{record['saving_ns'] / 1e3:.1f} us per run, but copying their data there and back would cost "
            f"{record['copy_ns'] / 1e3:.1f} us (keep them on the GPU with --disable_pass={NAME})")


def _interrupted(prog: str) -> None:
    """Ctrl-C: one line and exit 130 at once.  Every ``finally`` has run by now (an output file is
    never half-written); what is left is the interpreter's teardown, where releasing the OpenCL
    objects of a run left early waits for the device to finish what was queued (seconds on a slow
    device), so it is skipped."""
    click.echo(f"{prog}: interrupted", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _run_cli(command: click.Command, prog: str) -> None:
    """Run a click command with our exit-code contract."""
    try:
        command.main(prog_name=prog, standalone_mode=False)
    except OptError as exc:
        click.echo(f"{prog}: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # what click makes of Ctrl-C (KeyboardInterrupt): the conventional 130
        _interrupted(prog)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _interrupted(prog)
    except Exception as exc:  # internal error: say so, keep the traceback for OPTCLI_DEBUG=1
        if os.environ.get("OPTCLI_DEBUG"):
            traceback.print_exc()
        click.echo(f"{prog}: internal error: {type(exc).__name__}: {exc} (set OPTCLI_DEBUG=1 for the "
                   "traceback and please report it)", err=True)
        sys.exit(1)
    sys.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", message=f"optcli %(version)s, .nb format v{FORMAT_VERSION}")
def optcli_group():
    """optcli: ahead-of-time ONNX optimizer and runtime.  `optcli opt --help` for the optimizer."""


optcli_group.add_command(opt_command, name="opt")
optcli_group.add_command(inspect_command)
optcli_group.add_command(run_command)
optcli_group.add_command(bench_command)


@optcli_group.command(name="devices")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-check", is_flag=True, help="Skip building and running a test kernel on each device.")
def devices_command(as_json, no_check):
    """List OpenCL devices, the capabilities optcli relies on, and whether each is usable.

    Each device is labelled gpu, cpu, accelerator or simulator.  A device is usable when it builds
    and runs a test kernel; GPU steps run on the best ranked usable device: a discrete GPU, an
    integrated GPU, another accelerator, then OpenCL on the CPU.  A simulator (Oclgrind) runs
    only when named with --device / device=.  Exits with code 2 when no device but a simulator is
    usable, and says how to get one.
    """
    from optcli.runtime.opencl.devices import HOW_TO_GET_ONE, list_devices

    found = list_devices(check=not no_check)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif found:
        for i, d in enumerate(found):
            state = "usable" if d["usable"] else "NOT usable: " + "; ".join(d["problems"])
            if d["usable"] and no_check:
                state = "not checked (--no-check)"
            if d["usable"] and d["simulator"]:
                state += " when named (a simulator: never picked unasked)"
            click.echo(f"[{i}] {d['label']}: {d['name']} ({d['kind']}, {d['platform']}) - {state}")
            click.echo(f"    {d['version']}, driver {d['driver']}, {d['compute_units']} compute units, "
                       f"{d['global_mem_mb']} MB memory ({d['max_alloc_mb']} MB per buffer)")
            click.echo(f"    work-group <= {d['max_work_group_size']}, local memory {d['local_mem_kb']} KB, "
                       f"fp16 {'native' if d['fp16_native'] else 'storage only'}, images "
                       f"{d['image2d_max'] if d['image_support'] else 'no'}")
            click.echo(f"    recommended: --precision={d['recommended']['precision']} ({d['recommended']['why']})")
    chosen = [i for i, d in enumerate(found) if d["runs_gpu_steps"]]
    if chosen and not as_json:
        d = found[chosen[0]]
        click.echo(f"GPU steps run on [{chosen[0]}] {d['name']}: the best ranked usable device ({d['rank']}; the "
                   "order: discrete GPU, integrated GPU, accelerator, OpenCL on the CPU), unless --device / device= "
                   "names another")
    if not no_check and not chosen:
        what = ("no usable OpenCL device but a simulator" if any(d["usable"] for d in found) else
                "no usable OpenCL device" if found else "no OpenCL platform or device found")
        raise TargetError(f"{what}: GPU steps will run on the CPU; {HOW_TO_GET_ONE}")


def opt_main() -> None:
    _run_cli(opt_command, "opt")


def optcli_main() -> None:
    _run_cli(optcli_group, "optcli")
