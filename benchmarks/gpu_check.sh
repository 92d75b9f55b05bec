#!/usr/bin/env bash
# The GPU check of issue 21 in one command (see benchmarks/README.md):
#
#   bash benchmarks/gpu_check.sh prepare        # here, with the internet: fills .gpu_check/
#   bash benchmarks/gpu_check.sh run [--quick]  # on the GPU machine (no package index), with .gpu_check/ carried
#   bash benchmarks/gpu_check.sh run --dry-run [--icd] [--install] [--device NAME] [--quick] [--size small]
#                                               # here: the same run on this machine's OpenCL device (PoCL),
#                                               # without the ICD set-up (--icd: with it) and without
#                                               # installing anything (--install: into $PYTHON's environment)
#
# prepare downloads pyopencl's wheel and the pure-Python packages it needs (for Python $GPU_CHECK_PY,
# default 3.12, manylinux x86_64) into .gpu_check/wheels/, and builds optcli's native host library from
# this tree into .gpu_check/native/ (stripped, gzipped: its -O3 build takes minutes, more than the run
# can spare).  run installs those wheels with pip (--no-index), installs optcli from the tree without
# building the native library (the prebuilt one is copied in), then hands over to
# benchmarks/gpu_check.py, which writes $OUT/gpu_check.json (default OUT: ./gpu_check_out) and a log.
# The whole run keeps within $GPU_CHECK_BUDGET_S seconds (default 450; 270 with --quick).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
PREP=${GPU_CHECK_DIR:-$ROOT/.gpu_check}
PYVER=${GPU_CHECK_PY:-3.12}
PACKAGES="pyopencl pytools platformdirs siphash24 typing_extensions"  # pyopencl and what it needs beyond numpy

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
command -v timeout > /dev/null || timeout() { shift; "$@"; }  # coreutils' timeout, where there is one

prepare() {
    local py=${PYTHON:-python3} wheels="$PREP/wheels" specs
    rm -rf "$wheels" && mkdir -p "$wheels" "$PREP/native" || return 1
    # The versions this checkout's environment runs (tested here), else the newest.
    specs=$("$py" - "$PACKAGES" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1].split():
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
EOF
) || return 1
    echo "prepare: downloading for Python $PYVER (manylinux x86_64): $(echo $specs)"
    # shellcheck disable=SC2086
    "$py" -m pip download --quiet --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --no-deps -d "$wheels" $specs || { echo "prepare: pip download failed"; return 1; }
    prepare_native "$py" || return 1
    git rev-parse HEAD > "$PREP/commit.txt" 2>/dev/null || echo "unknown" > "$PREP/commit.txt"
    git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >> "$PREP/commit.txt"
    ls -l "$wheels" "$PREP/native"
    echo "prepare: $(du -sh "$PREP" | cut -f1) in $PREP; carry it: carry [\".gpu_check\"], then: bash benchmarks/gpu_check.sh run"
}

prepare_native() {  # the native host library, built from this tree unless its sources are unchanged
    local py=$1 dir="$PREP/native" sum tmp lib
    sum=$(cat setup.py kernels/host/*.c kernels/host/*.h | sha256sum | cut -d' ' -f1)
    if [ -f "$dir/_optcli_native.so.gz" ] && [ "$(cat "$dir/sources.sha256" 2>/dev/null)" = "$sum" ]; then
        echo "prepare: native library already built from these sources"; return 0
    fi
    [ "${GPU_CHECK_NATIVE:-build}" = skip ] && { echo "prepare: GPU_CHECK_NATIVE=skip: no native library"; return 0; }
    tmp=$(mktemp -d) && echo "prepare: building the native host library (minutes: gcc -O3) ..."
    if ! "$py" setup.py -q build_ext -b "$tmp/lib" -t "$tmp/obj" > "$tmp/build.log" 2>&1; then
        tail -20 "$tmp/build.log"; rm -rf "$tmp"; echo "prepare: native build failed"; return 1
    fi
    lib=$(ls "$tmp"/lib/optcli/native/_optcli_native*.so 2>/dev/null | head -1)
    [ -n "$lib" ] || { tail -20 "$tmp/build.log"; rm -rf "$tmp"; echo "prepare: no native library built"; return 1; }
    strip --strip-unneeded "$lib" 2>/dev/null
    gzip -9 -c "$lib" > "$dir/_optcli_native.so.gz" && echo "$sum" > "$dir/sources.sha256"
    rm -rf "$tmp"
}

install() {  # on the GPU machine: nothing can be downloaded there
    local py=$1 t0=$SECONDS rc
    export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
    if "$py" -c "import pyopencl" 2>/dev/null; then
        echo "install: pyopencl is already installed"; echo "pyopencl=present" >> "$SETUP"
    elif ! ls "$PREP"/wheels/pyopencl-*.whl > /dev/null 2>&1; then
        echo "install: no pyopencl wheel in $PREP/wheels: run 'bash benchmarks/gpu_check.sh prepare' where the" \
             "internet is reachable, and carry .gpu_check"; echo "pyopencl=missing" >> "$SETUP"
    else
        timeout 120 "$py" -m pip install --no-index --find-links "$PREP/wheels" pyopencl; rc=$?
        if [ $rc -ne 0 ]; then  # no pip, or a refusal: the wheels are zip files
            echo "install: pip failed ($rc): unpacking the wheels into $WORK/site"
            for w in "$PREP"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$WORK/site"; done
            export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"; rc=unpacked
        fi
        echo "pyopencl=$rc" >> "$SETUP"
    fi
    if ! ls optcli/native/_optcli_native*.so > /dev/null 2>&1 && [ -f "$PREP/native/_optcli_native.so.gz" ]; then
        gzip -dc "$PREP/native/_optcli_native.so.gz" > optcli/native/_optcli_native.prebuilt.so \
            && echo "native=prebuilt by prepare" >> "$SETUP"
    fi
    OPTCLI_NATIVE_BUILD=${OPTCLI_NATIVE_BUILD:-0} timeout 180 "$py" -m pip install --no-deps --no-build-isolation \
        --no-index -e .; rc=$?
    echo "optcli=$rc" >> "$SETUP"
    # An editable install leaves the sources uncompiled, and where the tree is not writable every
    # process compiles them again (0.2 s of each warm load on the first GPU check): compile them
    # once, as a wheel install does.
    "$py" -m compileall -q -j 0 optcli > /dev/null 2>&1; echo "compileall=$?" >> "$SETUP"
    echo "install_seconds=$((SECONDS - t0))" >> "$SETUP"
}

run() {
    local py=${PYTHON:-python3} dry=0 quick=0 inst=0 arg budget args=()
    for arg in "$@"; do
        case $arg in
            --dry-run) dry=1 ;; --quick) quick=1 ;; -h|--help) usage; return 0 ;;
            --install) inst=1; continue ;;  # with --dry-run: install too (into $PYTHON: a throwaway environment)
        esac
        args+=("$arg")
    done
    budget=${GPU_CHECK_BUDGET_S:-$([ $quick = 1 ] && echo 270 || echo 450)}
    WORK=$(mktemp -d) SETUP="$WORK/setup.txt"
    : > "$SETUP"
    echo "gpu_check run $* (budget ${budget}s) in $ROOT, Python: $("$py" -V 2>&1)"
    if [ $dry = 1 ] && [ $inst = 0 ]; then
        echo "install: skipped (--dry-run: this environment as it is)"; echo "install=skipped (--dry-run)" >> "$SETUP"
    else
        install "$py"
    fi
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_COMMAND="bash benchmarks/gpu_check.sh run $*"
    timeout $((budget - SECONDS + 20)) "$py" benchmarks/gpu_check.py run --out "$OUT" --work "$WORK" \
        --setup "$SETUP" --budget $((budget - SECONDS)) --prepared "$PREP" ${args[@]+"${args[@]}"}
    local rc=$?
    [ $rc = 124 ] && echo "gpu_check: the driver ran past the budget and was stopped; $OUT/gpu_check.json has" \
        "the parts that finished"
    rm -rf "$WORK"
    return $rc
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
    prepare) prepare "$@" ;;
    run)
        OUT=${OUT:-$ROOT/gpu_check_out}
        mkdir -p "$OUT" || exit 1
        run "$@" 2>&1 | tee "$OUT/gpu_check.log"
        exit "${PIPESTATUS[0]}" ;;
    *) usage; exit 2 ;;
esac
