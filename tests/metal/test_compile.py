"""Every Metal library the `metal` target can emit compiles: each kernel source under every set
of defines its launches can get (``optcli.gpu.variants``) and both precisions, rendered by
``render_metal`` and parsed by clang as C++17 against ``metal_shim.h`` with Metal's address
spaces enforced.  The shim declares only what Metal provides, so an OpenCL-only builtin fails."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from optcli.gpu.dialect import kernel_params, load_source, render_metal, render_opencl
from optcli.gpu.variants import program_variants, synchronizing_entries
from tests.metal import shim

pytestmark = pytest.mark.skipif(shim.compilers() is None, reason="no clang (pip install ziglang)")


def all_libraries() -> list[tuple[str, dict]]:
    return [(s, {**d, "STORAGE_HALF": h}) for s, d in program_variants() for h in (0, 1)]


def test_every_variant_compiles():
    libs = all_libraries()
    out = shim.build_dir() / "syntax"
    out.mkdir(exist_ok=True)
    files = []
    for k, (source, defines) in enumerate(libs):
        path = out / f"{k:04d}-{source.replace('.', '_')}.metal.cpp"
        path.write_text(f"// {source} {defines}\n{render_metal(source, defines)}")
        files.append(path)
    jobs = max(2, os.cpu_count() or 2)
    chunks = [files[i::jobs] for i in range(jobs)]  # one clang per chunk: startup once, files in parallel
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda chunk: shim.syntax_check(chunk, f"{len(chunk)} Metal libraries"), chunks))
    entries = sum(len(kernel_params(load_source(s))) for s, _ in libs)
    compile_only = synchronizing_entries()
    print(f"\n{len(libs)} Metal libraries ({entries} kernel entries) compiled; "
          f"compile-only (cooperating work items): {sorted(compile_only) or 'none'}")


def test_shim_rejects_opencl_builtins(tmp_path):
    """The OpenCL rendering (vload_half, mad, __global...) must not pass for Metal."""
    path = tmp_path / "opencl.cpp"
    path.write_text("#include <metal_stdlib>\n" + render_opencl("gemm.cl", {"STORAGE_HALF": 1}))
    with pytest.raises(AssertionError, match="does not compile"):
        shim.syntax_check([path], "OpenCL text")


def test_shim_enforces_address_spaces(tmp_path):
    """A device pointer handed to a helper taking a plain pointer fails, as in Metal."""
    path = tmp_path / "space.cpp"
    path.write_text("#include <metal_stdlib>\nusing namespace metal;\ninline float first(const float* p) "
                    "{ return p[0]; }\nkernel void k(device const float* x [[buffer(0)]], device float* y "
                    "[[buffer(1)]]) { y[0] = first(x); }\n")
    with pytest.raises(AssertionError, match="does not compile"):
        shim.syntax_check([path], "address spaces")


def test_metal_signature():
    text = render_metal("softmax.cl", {"STORAGE_HALF": 1})
    sig = re.search(r"kernel void softmax_channel\((.*)\)$", text, re.M).group(1)
    assert sig.startswith("device const STORAGE* x [[buffer(0)]], device STORAGE* y [[buffer(1)]], "
                          "constant int& count [[buffer(2)]]")
    assert sig.endswith("uint3 _gid [[thread_position_in_grid]]")
    assert "#define STORAGE half" in text and "#include <metal_stdlib>" in text
    assert "vload" not in text and "__kernel" not in text and "__global" not in text
    resize = render_metal("resize.cl", {})
    assert "constant float& scale_h [[buffer(9)]]" in resize


def test_clang_is_real():
    """Guard against a silently passing compiler: a plain syntax error must fail."""
    check, _ = shim.compilers()
    proc = subprocess.run([*check, "-fsyntax-only", "-x", "c++", "-"], input="int x = ;", capture_output=True,
                          text=True)
    assert proc.returncode != 0
