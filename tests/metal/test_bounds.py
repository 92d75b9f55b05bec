"""Memory safety by construction, in the dialect (both languages): kernel bodies reach buffers
only through the checked ``LOAD*`` / ``STORE*`` macros, every rendered kernel gets each
buffer's length as an argument, and (Metal rendering, run through the shim) a launch sized from
a crafted file neither writes past its output nor reads past its input.  The OpenCL side runs
on a device: ``tests/gpu/test_memory_safety.py``, and under oclgrind ``tests/gpu/test_oclgrind.py``."""

from __future__ import annotations

import re

import numpy as np
import pytest

from optcli.gpu.dialect import (
    METAL_PRELUDE,
    OPENCL_PRELUDE,
    _kernel_bodies,
    kernel_params,
    load_source,
    render_metal,
    render_opencl,
    signature_params,
)
from optcli.gpu.layout import pack, packed_elements
from optcli.gpu.registry import Launch, TensorRef, get_gpu_kernel
from optcli.gpu.variants import source_names
from optcli.ir import Node
from tests.metal import shim

needs_clang = pytest.mark.skipif(shim.compilers() is None, reason="no clang (pip install ziglang)")
CHECKED = {"LOAD4": 0, "LOAD1": 0, "STORE4": 1, "STORE1": 1}  # macro -> position of its buffer argument


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", re.sub(r"//[^\n]*", " ", text), flags=re.S)


def _enclosing_call(text: str, at: int) -> tuple[str, int, str] | None:
    """(callee, argument index, that argument's text) of the innermost parenthesis around
    ``at`` (callee "[" inside an index), or None at top level."""
    depth = 0
    for k in range(at - 1, -1, -1):
        if text[k] in ")]":
            depth += 1
        elif text[k] in "([" and depth:
            depth -= 1
        elif text[k] in "([":
            break
    else:
        return None
    if text[k] == "[":
        return "[", 0, ""
    level, end = 0, k + 1
    while end < len(text) and not (level == 0 and text[end] == ")"):
        level += text[end] in "(["
        level -= text[end] in ")]"
        end += 1
    args, offset = _split_args(text[k + 1:end]), k + 1
    for index, arg in enumerate(args):
        if offset <= at < offset + len(arg):
            callee = re.search(r"(\w+)\s*$", text[:k])
            return (callee.group(1) if callee else "", index, arg.strip())
        offset += len(arg) + 1
    return None


def _split_args(text: str) -> list[str]:
    parts, level, cur = [], 0, ""
    for ch in text:
        if ch == "," and level == 0:
            parts.append(cur)
            cur = ""
            continue
        level += ch in "(["
        level -= ch in ")]"
        cur += ch
    return [*parts, cur]


def unchecked_accesses(source: str) -> list[str]:
    """Every mention of a buffer parameter in a kernel body that is not the buffer argument of
    a checked macro (indexing it, passing it to a helper, pointer arithmetic...)."""
    text = load_source(source)
    found = []
    for entry, body in _kernel_bodies(text).items():
        body = _strip_comments(body)
        for p in kernel_params(text)[entry]:
            if p.kind not in ("IN", "OUT"):
                continue
            for m in re.finditer(rf"(?<![\w.]){p.name}(?!\w)", body):
                call = _enclosing_call(body, m.start())
                if call is None or CHECKED.get(call[0]) != call[1] or call[2] != p.name:
                    line = body[body.rfind("\n", 0, m.start()) + 1: body.find("\n", m.end())].strip()
                    found.append(f"{source}:{entry}: '{p.name}' in `{line}`")
    return found


def test_kernels_touch_buffers_only_through_checked_macros():
    problems = [p for s in source_names() for p in unchecked_accesses(s)]
    assert not problems, "\n".join(problems)


def test_the_scanner_sees_an_unchecked_access(monkeypatch):
    """Break the rule on purpose: direct indexing, a helper call and pointer arithmetic are all found."""
    bad = ("KERNEL(bad, IN(x), OUT(y), INT(n))\n{\n    const int i = GID(0);\n    y[i] = LOAD1(x, i);\n"
           "    STORE1(helper(x), y, i);\n    STORE4(LOAD4(x + 4, i), y, i);\n}\n")
    monkeypatch.setattr("tests.metal.test_bounds.load_source", lambda name: bad)
    assert len(unchecked_accesses("bad.cl")) == 3


@pytest.mark.parametrize("render", [render_opencl, render_metal], ids=["opencl", "metal"])
def test_every_rendered_kernel_takes_each_buffers_length(render):
    for source in source_names():
        text = render(source, {"STORAGE_HALF": 0})
        for entry, params in kernel_params(load_source(source)).items():
            sig = re.search(rf"kernel void {entry}\((.*)\)", text).group(1)
            for p in params:
                if p.kind in ("IN", "OUT"):
                    assert re.search(rf"\bint&? {p.name}_n\b", sig), f"{source}:{entry} has no length for {p.name}"
            assert sig.count(",") + 1 >= len(signature_params(params))


@pytest.mark.parametrize("prelude", [OPENCL_PRELUDE, METAL_PRELUDE], ids=["opencl", "metal"])
def test_the_access_macros_check_their_index(prelude):
    for macro in CHECKED:
        line = next(x for x in prelude.splitlines() if x.startswith(f"#define {macro}("))
        assert "IN_RANGE" in line, line


# ------------------------------------------------------------------------- the Metal rendering, run
SENTINEL = 7.0
CRAFTED = {"x0": (1, 4, 4, 4), "x1": (1, 4, 64, 4), "y": (1, 8, 4, 4)}  # x1 recorded far too tall


@needs_clang
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_crafted_concat_stays_inside_its_output_on_the_metal_rendering(precision):
    storage = np.float16 if precision == "fp16" else np.float32
    rng = np.random.default_rng(0)
    out = packed_elements(CRAFTED["y"])
    parent = np.full(out + (1 << 14), SENTINEL, storage)  # the output, then a guard region
    buffers = {n: pack(rng.standard_normal(CRAFTED[n]).astype(np.float32), storage) for n in ("x0", "x1")}
    buffers["y"] = parent[:out]  # the kernel's bound is this view's length
    ctx = shim.HostLaunchContext(CRAFTED, {}, buffers, precision)
    node = Node("Concat", ["x0", "x1"], ["y"], {"axis": 1}, "crafted")
    shim.run_launches(get_gpu_kernel("gpu.onnx.Concat.default").launch(ctx, node), ctx)
    assert np.all(parent[out:] == SENTINEL), f"{int(np.sum(parent[out:] != SENTINEL))} values written past y"


@needs_clang
def test_a_read_past_an_input_gives_zeros_on_the_metal_rendering():
    parent = np.full(64 + 1024, SENTINEL, np.float32)
    parent[:64] = np.arange(64)
    y = np.full(256, -1.0, np.float32)
    ctx = shim.HostLaunchContext({}, {}, {"x": parent[:64], "y": y}, "fp32")
    shim.run_launches([Launch("tensor.cl", "copy4", [TensorRef("x"), TensorRef("y"), 64], (64,))], ctx)
    assert np.array_equal(y[:64], np.arange(64)) and np.all(y[64:] == 0.0)
