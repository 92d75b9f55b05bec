"""Builds the optional native host kernels (kernels/host): everything else is in pyproject.toml.

The library is plain C (C11 with GCC/Clang vector extensions) with no Python API, built as
optcli/native/_optcli_native*.so and loaded with ctypes by optcli/native/library.py.  Where no
working C compiler exists (or OPTCLI_NATIVE_BUILD=0 is set), the install goes on without it and
the numpy kernels run: ``optcli.native.status()`` says so.
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Slowest to compile first (about 30 s each for the first three on one core): the files build side
# by side.  Each kernel header is instantiated per vector width and tile shape; the heavy shapes
# live in small noinline functions, because GCC's passes grow faster than a function's size (the
# build took 7 minutes of CPU when each work item inlined all of them).
SOURCES = ["kernels/host/blocked_conv.c", "kernels/host/blocked_window.c", "kernels/host/gemm.c",
           "kernels/host/stem.c", "kernels/host/window.c", "kernels/host/pool.c", "kernels/host/epilogue.c",
           "kernels/host/elementwise.c", "kernels/host/fc_rows.c", "kernels/host/recurrent.c", "kernels/host/qgemm.c",
           "kernels/host/qelementwise.c", "kernels/host/qdepthwise.c", "kernels/host/qdepthwise_lanes.c", "kernels/host/upsample.c",
           "kernels/host/qpointwise.c", "kernels/host/qpool.c",
           "kernels/host/qmatmul.c"]
HEADERS = ["kernels/host/optcli_native.h", "kernels/host/simd.h", "kernels/host/gemm_kernel.h",
           "kernels/host/stem_kernel.h", "kernels/host/blocked_conv_kernel.h", "kernels/host/blocked_window_kernel.h",
           "kernels/host/qconv_kernel.h"]
# No -march=native: x86-64 gets an AVX2/FMA clone of each hot function picked at load (simd.h),
# so the built package still runs on an older CPU.  -ffp-contract=fast lets a*b+c become an FMA,
# which -std=c11 would otherwise forbid.  -fno-wrapv undoes Python's own -fwrapv (its CFLAGS come
# first): wrapping signed arithmetic keeps int loop indices from becoming pointer increments, and
# the GEMM's packing loops ran ~15% slower with it; this C never relies on signed overflow.  -g0
# undoes Python's -g: debug information for these unrolled kernels cost a third of the build time.
CFLAGS = ["-O3", "-g0", "-std=c11", "-ffp-contract=fast", "-fno-wrapv", "-fvisibility=hidden", "-pthread", "-Wall",
          "-Wno-psabi"]


class OptionalBuildExt(build_ext):
    """Build the native kernels if a C compiler works; otherwise say why and carry on."""

    def run(self):
        if os.environ.get("OPTCLI_NATIVE_BUILD", "1").strip() == "0":
            self._skip("OPTCLI_NATIVE_BUILD=0")
            return
        try:
            super().run()
        except Exception as exc:  # no compiler at all, or one that cannot build C11 vector code
            self._skip(exc)

    def build_extension(self, ext):
        _compile_in_parallel(self.compiler)
        try:
            super().build_extension(ext)
        except Exception as exc:
            if ext.name.endswith("_fastcall"):
                print(f"optcli: the fast call path was not built ({exc}); the native kernels will be called "
                      "through ctypes (slower per call)", file=sys.stderr)
            else:
                self._skip(exc)

    def get_export_symbols(self, ext):
        if ext.name.endswith("_fastcall"):
            return super().get_export_symbols(ext)
        return []  # the kernel library is not a Python module: no PyInit_ symbol to export

    @staticmethod
    def _skip(why):
        print(f"optcli: native host kernels not built ({why}); the numpy kernels will run instead",
              file=sys.stderr)


def _compile_in_parallel(compiler):
    """Compile the C files side by side, one per core: distutils compiles one extension's sources
    one after another, and the slowest file alone takes minutes (blocked_window.c), so a 2-core
    install spent the sum of all of them."""
    if getattr(compiler, "_optcli_parallel", False):
        return
    compiler._optcli_parallel = True
    serial = compiler.compile

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        setup = getattr(compiler, "_setup_compile", None)
        if setup is None or len(sources) < 2:
            return serial(sources, output_dir, macros, include_dirs, debug, extra_preargs, extra_postargs, depends)
        macros, objects, extra_postargs, pp_opts, build = setup(output_dir, macros, include_dirs, sources, depends,
                                                                extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            start = time.monotonic()
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
            print(f"optcli: compiled {src} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

        print(f"optcli: compiling the native host kernels ({len(objects)} C files, about a minute on 2 cores)",
              file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=max(1, min(len(objects), os.cpu_count() or 1))) as pool:
            list(pool.map(one, objects))  # list(): the first compile error is raised here
        return objects

    compiler.compile = compile


native = Extension(
    "optcli.native._optcli_native",  # beside optcli/native/library.py, whose library_path() looks there
    sources=SOURCES,
    depends=HEADERS,
    extra_compile_args=CFLAGS,
    extra_link_args=["-pthread"],
    optional=True,
)
# A Python extension of its own (it needs Python's headers, which the kernel library does not): calls
# the library's functions by address without ctypes' per-argument costs (library.function).  Where
# it cannot be built, the kernels still run, called through ctypes.
fastcall = Extension(
    "optcli.native._fastcall",
    sources=["optcli/native/fastcall.c"],
    extra_compile_args=["-O2", "-g0", "-Wall"],
    optional=True,
)

setup(ext_modules=[native, fastcall], cmdclass={"build_ext": OptionalBuildExt})
