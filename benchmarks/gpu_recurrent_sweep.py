"""How the GPU's recurrence should be launched, measured: LSTM and GRU layers of several widths,
run with the whole sequence in one launch (a work-group per batch row and direction) and with one
launch per step spread over the GPU, beside optcli's host plan and onnxruntime on the CPU.

``optcli.gpu.ops_recurrent.WHOLE_SEQUENCE_HIDDEN`` picks between the two ways by the layer's
width; this sweep is what that threshold should come from on a real GPU (the GPU check runs it:
``benchmarks/gpu_check.sh``).  Every plan is checked against onnxruntime before it is timed.

    python benchmarks/gpu_recurrent_sweep.py [--device NAME] [--budget 60] [--out sweep.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GATES = {"LSTM": 4, "GRU": 3}
KEEP_ON_GPU = {"keep_small_islands_on_host"}  # one-layer models would otherwise stay on the CPU


def layer_model(op: str, hidden: int, seq: int, inp: int, batch: int, direction: str) -> onnx.ModelProto:
    """One recurrent layer with random constant weights (Y and Y_h as outputs)."""
    rng = np.random.default_rng(hidden)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    scale = 1.0 / np.sqrt(hidden)
    inits = [numpy_helper.from_array((rng.standard_normal((dirs, g * hidden, inp)) * scale).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((dirs, g * hidden, hidden)) * scale).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((dirs, 2 * g * hidden)) * 0.1).astype(np.float32), "B")]
    attrs = {"hidden_size": hidden, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], **attrs)
    graph = helper.make_graph([node], f"{op.lower()}{hidden}", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [seq, batch, inp])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                                      helper.make_tensor_value_info("y_h", TensorProto.FLOAT, None)],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def timed(fn, runs: int, seconds: float) -> dict:
    fn()
    fn()
    times = []
    stop = time.perf_counter() + seconds
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() > stop:
            break
    return {"median_ms": round(float(np.median(times)), 3), "min_ms": round(float(min(times)), 3), "runs": len(times)}


def measure(op: str, hidden: int, direction: str, seq: int, inp: int, device: str | None, share: float) -> dict:
    """One layer: onnxruntime and optcli's host plan on the CPU, the GPU plan launched both ways."""
    import onnxruntime as ort

    import optcli
    from optcli.gpu import ops_recurrent
    from optcli.tolerance import max_error

    model = layer_model(op, hidden, seq, inp, 1, direction)
    feeds = {"x": np.random.default_rng(0).standard_normal((seq, 1, inp)).astype(np.float32)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    row: dict = {"op": op, "hidden": hidden, "direction": direction, "seq": seq,
                 "onnxruntime_cpu": timed(lambda: session.run(None, feeds), 50, share)}
    host = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    row["optcli_arm"] = timed(lambda: host.run(feeds), 50, share)
    gpu_plan = optcli.optimize(model=model, valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU).data
    saved = ops_recurrent.WHOLE_SEQUENCE_HIDDEN
    try:
        for mode, threshold in (("whole_sequence", 1 << 30), ("per_step", 0)):
            ops_recurrent.WHOLE_SEQUENCE_HIDDEN = threshold  # launches are planned at load
            predictor = optcli.load(gpu_plan, require_gpu=True, device=device)
            out = predictor.run(feeds)
            errors = [max_error(out[name], want) for name, want in zip(("y", "y_h"), expected)]
            row[mode] = {**timed(lambda p=predictor: p.run(feeds), 50, share),
                         "max_rel_err": float(max(err / max(scale, 1e-12) for err, scale in errors))}
    finally:
        ops_recurrent.WHOLE_SEQUENCE_HIDDEN = saved
    return row


def sweep(device: str | None, budget: float, configs: list[tuple[str, int, str]], seq: int, inp: int) -> list[dict]:
    deadline = time.monotonic() + budget
    rows = []
    for n, (op, hidden, direction) in enumerate(configs):
        left = deadline - time.monotonic()
        if left < 2:
            rows.append({"op": op, "hidden": hidden, "direction": direction, "skipped": "the budget ran out"})
            continue
        row = measure(op, hidden, direction, seq, inp, device, left / (len(configs) - n) / 4)  # four engines
        rows.append(row)
        print(f"{op} hidden {hidden} {direction}: " + ", ".join(
            f"{k} {v['median_ms']} ms" for k, v in row.items() if isinstance(v, dict)), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="part of the OpenCL device's name (default: the runtime's choice)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for the whole sweep")
    parser.add_argument("--seq", type=int, default=100)
    parser.add_argument("--input", type=int, default=64)
    parser.add_argument("--hidden", default="64,256,512,1024")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    widths = [int(h) for h in args.hidden.split(",")]
    configs = [("LSTM", widths[0], "bidirectional")] + [(op, h, "forward") for h in widths for op in ("LSTM", "GRU")]
    rows = sweep(args.device, args.budget, configs, args.seq, args.input)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
