"""Runs the native host kernels (kernels/host/*.c) under AddressSanitizer and UndefinedBehaviorSanitizer.

Why: the kernels index raw buffers with sizes that come, in the end, from `.nb` files; the Python
guards (``native.library.require``) are meant to stop every unsafe call, and this checks that the
C never reads or writes out of bounds or hits undefined behaviour on what gets through (issue 23).

It compiles the sources with setup.py's own CFLAGS (read from setup.py, so the two cannot drift)
plus ``-O1 -g -fsanitize=address,undefined`` into a temporary ``_optcli_native_sanitized.so``, then
runs pytest against it through ``OPTCLI_NATIVE_LIBRARY`` (optcli/native/library.py), with ASan's
runtime preloaded into Python (which is not built with it):

    python tools/sanitize_native.py            # tests/native, the .nb fuzzers, hostile conv attributes
    python tools/sanitize_native.py --ci       # CI's subset: about 3 minutes on 2 cores
    python tools/sanitize_native.py --keep /tmp/san      # the same, keeping the library
    OPTCLI_FUZZ_EXAMPLES=10000 python tools/sanitize_native.py --library /tmp/san/_optcli_native_sanitized.so \
        --long-fuzz                            # the long fuzz run (about 10 minutes)

The first report ends its process (ASan aborts, UBSan exits 1), so the test, and this, fail; every
child process the selected tests start must exit 0.  The report is on stderr (pytest runs with
``--capture=sys``: its usual capture of fd 2 would lose the text of a process that aborts), and
ASan's are also written to files (``log_path``) and printed at the end: any there makes this exit 1.  OpenCL is
kept out of the run (``OPTCLI_OPENCL_DEVICE`` names no device, so none is picked and the GPU tests
skip with the reason): PoCL and its LLVM are not what is under test, and pip's PoCL cannot even be
found under ASan (its ICD loader dlopens it by a bare name, which ASan's dlopen interceptor resolves
without the loader's RUNPATH).  Linux and GCC only (its runtime libraries); the aarch64 cross build
(tests/native/test_aarch64.py, under qemu) is left out, and so are the AVX-512 variants on a CPU
without AVX-512 (their tests skip).
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# -fexpensive-optimizations: at -O1 GCC forms no FMAs (-ffp-contract=fast needs this pass), and the
# rounding of a build without them falls outside the tests' fp32 tolerance in a few sums.
SANITIZE = ["-O1", "-fexpensive-optimizations", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined"]
# CI's build: pointer-overflow's checks on every pointer increment, instrumented again by ASan, made
# up 40% of the build (gemm.c: 107 s of CPU with them, 62 s without); ASan still checks every access
# those pointers make.  -g1: line tables, all a report's stack needs.
CI_BUILD = ["-g1", "-fno-sanitize=pointer-overflow"]

# Every test that calls the C with real data: the native suite (minus the aarch64 cross build),
# the .nb fuzzers at their fixed-seed budgets (a fuzzed file that loads is run, native kernels
# included) and the convs with hostile attributes that the load checks must stop before the C.
# test_codegen reads the machine code of the shipped -O2 build (unrolled taps, no spills): at -O1
# with the sanitizers' instrumentation that code is another, so it is left to the plain suite.
FULL = ["tests/native", "tests/reliability/test_nb_fuzz.py", "tests/reliability/test_fuzz_long.py",
        "tests/runtime/test_blocked_kernels_at_load.py", "tests/runtime/test_conv_geometry_at_load.py",
        "--deselect", "tests/native/test_aarch64.py", "--deselect", "tests/native/test_codegen.py"]
# CI's subset (about 3 minutes on 2 cores, most of it the build): the same tests with the blocked
# kernels' pool at one thread only (their "[t2-..." cases repeat each kernel with 2 threads; the pool
# itself still runs at several sizes in test_thread_pool and the other kernels' tests).
CI = [*FULL, "-k", "not [t2-"]
LONG_FUZZ = ["tests/reliability/test_fuzz_long.py"]
NO_DEVICE = "no device: sanitizer run"  # as OPTCLI_OPENCL_DEVICE, a name no OpenCL device has


def setup_lists() -> tuple[list[str], list[str]]:
    """setup.py's SOURCES and CFLAGS (literal lists), read without running setup.py."""
    found = {}
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", "") in (
                "SOURCES", "CFLAGS"):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["SOURCES"], found["CFLAGS"]


def build(out: Path, extra: list[str], cc: str = "gcc") -> Path:
    """Compile every source side by side (one process per core, as setup.py does) and link the library."""
    sources, cflags = setup_lists()
    flags = [f for f in cflags if not f.startswith(("-O", "-g"))] + SANITIZE + extra + ["-fPIC"]
    start = time.monotonic()

    def compile_one(src: str) -> Path:
        obj = out / (Path(src).stem + ".o")
        subprocess.run([cc, *flags, "-c", str(ROOT / src), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    lib = out / "_optcli_native_sanitized.so"  # the name starts with LIB_PREFIX: threadpoolctl finds it
    subprocess.run([cc, "-shared", "-pthread", "-fsanitize=address,undefined", *map(str, objects), "-o", str(lib)],
                   check=True)
    print(f"sanitize_native: built {lib.name} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return lib


def sanitizer_env(lib: Path, logs: Path, cc: str = "gcc") -> dict[str, str]:
    runtimes = [subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True,
                               check=True).stdout.strip() for name in ("libasan.so", "libubsan.so")]
    return {
        **os.environ,
        # ASan must be the first library in the process; Python is not linked with it, so preload it.
        "LD_PRELOAD": ":".join(runtimes),
        # detect_leaks=0: CPython and numpy keep memory until exit by design.  abort_on_error /
        # halt_on_error: the first report ends the process, so a test cannot go on past it.
        "ASAN_OPTIONS": f"detect_leaks=0:abort_on_error=1:log_path={logs}/asan",
        # GCC's UBSan runtime ignores log_path: its reports go to stderr, and halt_on_error fails the process.
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "OPTCLI_NATIVE_LIBRARY": str(lib),
        "OPTCLI_REQUIRE_NATIVE": "1",
        # blocked regions at the library's width, not the plain kernels AVX2 machines run them with
        # by default (ops/blocked.py): the native blocked kernels are what needs the sanitizers
        "OPTCLI_HOST_BLOCKED": "1",
        "OPTCLI_OPENCL_DEVICE": NO_DEVICE,  # no OpenCL device: see the module docstring
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ci", action="store_true", help="CI's subset (about 3 minutes on 2 cores)")
    mode.add_argument("--long-fuzz", action="store_true",
                      help="only test_fuzz_long.py (set OPTCLI_FUZZ_EXAMPLES for its length)")
    parser.add_argument("--library", type=Path, help="a sanitized library built before (skips the build)")
    parser.add_argument("--keep", type=Path, help="build into this folder and keep the library (for --library)")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (after --) in place of the selection")
    args = parser.parse_args(argv)
    selection = args.pytest_args or (CI if args.ci else LONG_FUZZ if args.long_fuzz else FULL)
    with tempfile.TemporaryDirectory(prefix="optcli-sanitize-") as tmp:
        work = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        lib = args.library.resolve() if args.library else build(args.keep or work, CI_BUILD if args.ci else [])
        logs = work / "reports"
        logs.mkdir()
        start = time.monotonic()
        # --capture=sys: pytest's default capture of fd 2 would swallow a report the process aborts on.
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", *selection]
        rc = subprocess.run(pytest, cwd=ROOT, env=sanitizer_env(lib, logs)).returncode
        reports = sorted(p for p in logs.iterdir() if p.is_file())
        for report in reports:
            print(f"sanitize_native: report {report.name}:\n{report.read_text()}", file=sys.stderr)
        print(f"sanitize_native: pytest exited {rc} after {time.monotonic() - start:.0f} s, "
              f"{len(reports)} sanitizer report(s)", file=sys.stderr)
    return 1 if rc != 0 or reports else 0


if __name__ == "__main__":
    sys.exit(main())
