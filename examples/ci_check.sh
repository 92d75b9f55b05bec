#!/bin/sh
# Use a .nb from a CI step: optimize, check the .nb against the original model, keep a benchmark
# row, and fail the job (non-zero exit) when the optimized model's outputs drift.
#
#   examples/ci_check.sh MODEL.onnx [OUT_DIR]       (MAX_DIFF=1e-4 and TARGETS=opencl,arm by default)
#
# Exit codes: 0 pass, 2 bad input (unreadable model, bad flag), 3 the outputs differ too much.
set -eu
MODEL=${1:?usage: ci_check.sh MODEL.onnx [OUT_DIR]}
OUT=${2:-ci_out}
MAX_DIFF=${MAX_DIFF:-1e-4}
TARGETS=${TARGETS:-opencl,arm}
mkdir -p "$OUT"

# 1. optimize; --verify runs the original and the .nb on the same inputs and exits 3 (writing no .nb)
#    when they disagree beyond the precision's tolerance.
opt --model_file="$MODEL" --valid_targets="$TARGETS" --optimize_out="$OUT/model" --report="$OUT/report.json" \
    --verify --quiet

# 2. the gate on this machine: onnxruntime in the same process, same inputs; exit 3 above MAX_DIFF.
#    The CSV row (latency, init time, memory, ratio, difference) goes into the job's history.
optcli bench "$OUT/model.nb" --runs 5 --warmup 1 --profile_runs 0 --compare_onnx "$MODEL" \
    --max_diff "$MAX_DIFF" --csv > "$OUT/bench.csv"
echo "ci_check: $MODEL passed (max difference <= $MAX_DIFF); results in $OUT/"
