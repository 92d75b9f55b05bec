"""Compile the rendered Metal kernels as C++ against ``metal_shim.h``, and run them on the host.

Metal cannot run on Linux; clang can still parse every rendered Metal library (``syntax_check``)
and, for kernels whose work items do not cooperate, run it: ``ShimProgram`` compiles one library
(one kernel source, one set of defines) with a C++ driver per entry that loops over the grid,
and ``run_node`` plays a GPU kernel's launches on numpy buffers in the packed layout, as the
OpenCL harness does on PoCL.

The compiler is the clang that the ``ziglang`` wheel ships (``python -m ziglang``: offline,
pinned), else a system ``clang``.  Libraries are built with ``-nostdlib``: the math functions
they call (expf, tanhf...) resolve against the Python process's libm when loaded.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path

import numpy as np

from optcli.gpu.dialect import kernel_arguments, kernel_params, load_source, render_metal
from optcli.gpu.layout import pack, packed_elements, unpack
from optcli.gpu.registry import Launch, TempRef, TensorRef, WeightRef

HERE = Path(__file__).resolve().parent
FLAGS = ["-x", "c++", "-std=c++17", f"-I{HERE / 'include'}", "-Wno-unknown-attributes", "-Werror",
         "-Wdouble-promotion"]


@cache
def compilers() -> tuple[list[str], list[str]] | None:
    """(syntax-check command, shared-library command), or None when no clang is available."""
    try:
        import ziglang  # noqa: F401

        zig = [sys.executable, "-m", "ziglang"]
        # `zig c++ -fsyntax-only` wants an output file; `zig clang` is clang itself.
        return [*zig, "clang"], [*zig, "cc"]
    except ImportError:
        clang = shutil.which("clang")
        return ([clang], [clang]) if clang else None


@cache
def build_dir() -> Path:
    """Compiled shim libraries, shared by every test of the session."""
    path = Path(tempfile.mkdtemp(prefix="optcli-metal-shim-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{what} does not compile:\n{proc.stderr[-6000:]}")


def syntax_check(files: list[Path], what: str) -> None:
    """Parse and type-check translation units as Metal would see them (address spaces on)."""
    check, _ = compilers()
    _run([*check, "-fsyntax-only", "-DMETAL_SHIM_ADDRESS_SPACES", *FLAGS, *map(str, files)], what)


# ------------------------------------------------------------------------------ execution


_KINDS = {"device const STORAGE*": "IN", "device STORAGE*": "OUT", "constant int&": "INT", "constant float&": "FLOAT",
          "constant float*": "EPI"}
ARG_KINDS = ("IN", "OUT", "INT", "FLOAT", "EPI")  # kinds that take an argument slot (not thread ids)


def metal_entries(text: str) -> dict[str, list[str]]:
    """entry -> parameter kinds (IN, OUT, INT (buffer sizes too), FLOAT, EPI, then thread ids), read off the rendered
    Metal signatures themselves: the shim drives what Metal would see, argument i at index i."""
    entries = {}
    for m in re.finditer(r"^kernel void (\w+)\((.*)\)\s*$", text, re.M):  # one line per signature
        kinds = []
        for i, part in enumerate(p.strip() for p in m.group(2).split(", ")):
            kind = next((k for prefix, k in _KINDS.items() if part.startswith(prefix + " ")), None)
            if kind is not None:
                assert part.endswith(f"[[buffer({i})]]"), f"{m.group(1)}: argument {i} is not at buffer({i})"
            kinds.append(kind or part.split()[1])  # _gid / _gsize / _lid / _lsize
        entries[m.group(1)] = kinds
    return entries


def _driver(entries: dict[str, list[str]]) -> str:
    """One ``extern "C"`` entry per kernel: loop over the grid, arguments from flat arrays.  Each
    work item is a threadgroup of its own (one thread: a barrier waits for nobody), which models a
    kernel that reads its threadgroup's size (``LSIZE``) and works with any; one that reads its
    local id without it assumes a group size the serial loop cannot give."""
    out = []
    for entry, kinds in entries.items():
        args = []
        for k, kind in enumerate(kinds):
            args.append({"IN": f"(const STORAGE*)b[{k}]", "OUT": f"(STORAGE*)b[{k}]", "INT": f"iv[{k}]",
                         "EPI": f"(const float*)b[{k}]",
                         "FLOAT": f"fv[{k}]", "_gid": "uint3{x, y, z}",
                         "_gsize": "uint3{(uint)g[0], (uint)g[1], (uint)g[2]}", "_lid": "uint3{0, 0, 0}",
                         "_lsize": "uint3{1, 1, 1}"}.get(kind, kind))
            assert kind != "_lid" or "_lsize" in kinds, f"{entry} uses local ids without the group's size: a " \
                                                        "serial grid loop does not model it"
        out.append(f'extern "C" void run_{entry}(void* const* b, const int* iv, const float* fv, const int* g) {{\n'
                   f"    for (uint z = 0; z < (uint)g[2]; ++z)\n"
                   f"        for (uint y = 0; y < (uint)g[1]; ++y)\n"
                   f"            for (uint x = 0; x < (uint)g[0]; ++x) {entry}({', '.join(args)});\n}}\n")
    return "\n".join(out)


class ShimProgram:
    """One rendered Metal library (its full text) compiled to a host shared library."""

    def __init__(self, text: str):
        self.entries = metal_entries(text)
        full = f"{text}\n\n// ---- host driver\n{_driver(self.entries)}"
        key = hashlib.sha256(full.encode()).hexdigest()[:24]
        lib = build_dir() / f"{key}.so"
        if not lib.exists():
            cpp = build_dir() / f"{key}.cpp"
            cpp.write_text(full)
            _, link = compilers()
            arch = ["-mf16c"] if platform.machine() in ("x86_64", "AMD64") else []
            tmp = lib.with_suffix(f".{threading.get_ident()}.tmp")
            _run([*link, *FLAGS, *arch, "-O1", "-fno-math-errno", "-fPIC", "-shared", "-nostdlib", str(cpp),
                  "-o", str(tmp)], text.splitlines()[0] + " ...")
            tmp.replace(lib)
        self.lib = ctypes.CDLL(str(lib))

    def run(self, entry: str, args: list, grid: tuple[int, ...]) -> None:
        """Arguments in signature order (``dialect.signature_params``: buffer sizes included):
        numpy arrays (or anything with a data pointer: ints) for buffers and the epilogue's
        floats, numbers for scalars."""
        kinds = [k for k in self.entries[entry] if k in ARG_KINDS]
        assert len(kinds) == len(args), f"{entry}: {len(kinds)} parameters, {len(args)} arguments"
        n = len(kinds)
        bufs = (ctypes.c_void_p * n)()
        ints = np.zeros(n, np.int32)
        floats = np.zeros(n, np.float32)
        for k, (kind, a) in enumerate(zip(kinds, args)):
            if kind in ("IN", "OUT", "EPI"):
                if kind == "EPI":
                    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size == 8, f"{entry} epilogue"
                if isinstance(a, np.ndarray):
                    assert a.flags.c_contiguous, f"{entry} argument {k}"
                    a = a.ctypes.data
                bufs[k] = a
            elif kind == "INT":
                assert -2**31 <= int(a) < 2**31, f"{entry} argument {k}={a} overflows int"
                ints[k] = int(a)
            else:
                floats[k] = float(a)
        g = np.array((tuple(int(v) for v in grid) + (1, 1, 1))[:3], np.int32)
        fn = getattr(self.lib, f"run_{entry}")
        fn.restype = None
        fn(bufs, ints.ctypes.data_as(ctypes.c_void_p), floats.ctypes.data_as(ctypes.c_void_p),
           g.ctypes.data_as(ctypes.c_void_p))


_PROGRAMS: dict[str, ShimProgram] = {}
_LOCK = threading.Lock()


def program_text(text: str) -> ShimProgram:
    with _LOCK:
        prog = _PROGRAMS.get(text)
    if prog is None:
        prog = ShimProgram(text)
        with _LOCK:
            _PROGRAMS[text] = prog
    return prog


def program(source: str, defines: dict) -> ShimProgram:
    return program_text(render_metal(source, defines))


class HostLaunchContext:
    """``optcli.gpu.registry.LaunchContext`` over numpy buffers in storage precision."""

    def __init__(self, shapes: dict, consts: dict, buffers: dict, precision: str):
        self.shapes, self.consts, self.buffers, self.precision = shapes, consts, buffers, precision
        self.storage = np.float16 if precision == "fp16" else np.float32
        self.weights: dict[str, np.ndarray] = {}
        self.temps: dict[str, np.ndarray] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.consts[name].shape) if name in self.consts else tuple(self.shapes[name])

    def const(self, name: str):
        return self.consts.get(name) if name else None

    def tensor(self, name: str) -> TensorRef:
        return TensorRef(name)

    def weight(self, key: str, array) -> WeightRef:
        data = np.ascontiguousarray(np.asarray(array).reshape(-1), dtype=self.storage)
        self.weights[key] = data if data.size else np.zeros(4, self.storage)
        return WeightRef(key)

    def temp(self, key: str, elements: int) -> TempRef:
        if key not in self.temps:
            self.temps[key] = np.full(max(4, elements), np.nan, self.storage)  # garbage, as on a GPU
        return TempRef(key)

    def resolve(self, arg):
        if isinstance(arg, TensorRef):
            return self.buffers[arg.name]
        if isinstance(arg, WeightRef):
            return self.weights[arg.key]
        if isinstance(arg, TempRef):
            return self.temps[arg.key]
        return arg


def launch_arguments(launch: Launch, ctx: HostLaunchContext) -> list:
    """A launch's arguments in signature order, as the runtimes bind them
    (``dialect.kernel_arguments``): each buffer's size is the numpy array's own length."""
    params = kernel_params(load_source(launch.source))[launch.entry]
    bound = kernel_arguments(params, launch.args, launch.entry, ctx.resolve, lambda a: a.size)
    return [value for _kind, value in bound]


def run_launches(launches: list[Launch], ctx: HostLaunchContext) -> list[tuple[str, str, dict]]:
    """Run launches in order; returns (source, entry, defines) of each, for coverage."""
    seen = []
    for launch in launches:
        defines = {**launch.defines, "STORAGE_HALF": int(ctx.precision == "fp16")}
        program(launch.source, defines).run(launch.entry, launch_arguments(launch, ctx), launch.global_size)
        seen.append((launch.source, launch.entry, defines))
    return seen


def run_node(kern, graph, node, inputs: dict[str, np.ndarray], precision: str = "fp32"):
    """(outputs unpacked to NCHW float32, launches run) of one GPU kernel on one IR node."""
    storage = np.float16 if precision == "fp16" else np.float32
    shapes = {n: tuple(graph.shape_of(n)) for n in [*node.inputs, *node.outputs] if n and n not in graph.initializers}
    buffers = {name: pack(np.asarray(x, np.float32), storage) for name, x in inputs.items()}
    for name in node.outputs:
        if name:  # garbage the kernel must overwrite (padding lanes included)
            buffers[name] = np.full(max(4, packed_elements(shapes[name])), 7.0, storage)
    ctx = HostLaunchContext(shapes, dict(graph.initializers), buffers, precision)
    seen = run_launches(kern.launch(ctx, node), ctx)
    outs = [unpack(buffers[n][: packed_elements(shapes[n])].astype(np.float32), shapes[n]) for n in node.outputs if n]
    return outs, seen, buffers
