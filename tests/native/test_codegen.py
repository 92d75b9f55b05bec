"""What the compiler made of the hottest loops: the x86-64 AVX2 clones of the GEMM register tiles
and of the blocked conv's tiles, read back from the built library with objdump.

Two GCC behaviours halved those kernels' speed with every result still right, so no other test
saw them:
- the ReLU/Clip bound, hoisted out of the tile loops, took the 16th vector register that the
  GEMM's 12 accumulators, 2 loads and broadcast need, and GCC spilled an accumulator instead: a
  store and a reload per k (every ReLU conv of ResNet-18 at half speed, 74 -> 37 GFLOP/s);
- a vector returned by an inlined helper compiled for the default target is lowered for that
  target: the AVX2 clone built each broadcast from eight ``vinsertps``.

The library's build has no -march (one wheel runs on every x86-64), so these are properties of the
clones, checked where they are made: on x86-64 with objdump (binutils, present wherever gcc built
the library)."""

from __future__ import annotations

import functools
import platform
import re
import shutil
import subprocess

import pytest

from optcli import native

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
                                reason="reads x86-64 machine code with objdump")

GEMM_TILES = [f"gk8_{act}.arch_x86_64_v3" for act in ("none", "relu", "clip", "later")]
_FMA_FROM_STACK = re.compile(r"vfmadd\w+ps (-?0x[0-9a-f]+)?\(%rsp\),%ymm\d+,%ymm\d+")


def spilled_accumulators(instructions: list[str]) -> int:
    """FMAs that read a stack slot which one of the next few instructions writes back: an
    accumulator living in memory across the loop (a reload and a store per multiply-add)."""
    spills = 0
    for i, ins in enumerate(instructions):
        m = _FMA_FROM_STACK.match(ins)
        if m:
            slot = f"{m.group(1) or ''}(%rsp)"
            spills += any(nxt.startswith("vmov") and nxt.endswith("," + slot) for nxt in instructions[i + 1:i + 6])
    return spills


def lane_by_lane_broadcasts(instructions: list[str]) -> int:
    """vinsertps instructions: a vector built one float at a time (a broadcast is one vbroadcastss)."""
    return sum(ins.startswith("vinsertps") for ins in instructions)


@functools.lru_cache(maxsize=2)
def functions(path: str) -> dict[str, list[str]]:
    """The library's functions, name -> instructions (mnemonic and operands)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True,
                          check=True).stdout
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif current is not None and "\t" in line:
            current.append(line.split("\t", 1)[1].strip())
    return out


@pytest.fixture
def code(native_lib) -> dict[str, list[str]]:
    return functions(str(native.library_path()))


def test_the_checks_see_what_they_look_for():
    """Both checks on the code GCC made before the fixes (excerpts of the old clones)."""
    spilled = ["vbroadcastss -0x4(%rcx,%r9,1),%ymm3", "vfmadd213ps 0x1a0(%rsp),%ymm3,%ymm0",
               "vfmadd231ps %ymm3,%ymm1,%ymm4", "vmovaps %ymm0,0x1a0(%rsp)"]
    assert spilled_accumulators(spilled) == 1
    assert spilled_accumulators(["vfmadd231ps 0x20(%rsp),%ymm3,%ymm0", "vmovaps %ymm0,0x40(%rsp)"]) == 0
    built = ["vmovss (%rcx,%r14,4),%xmm13", "vinsertps $0xe,%xmm13,%xmm13,%xmm14",
             "vinsertps $0x10,%xmm13,%xmm0,%xmm0", "vinsertf128 $0x1,%xmm14,%ymm0,%ymm0"]
    assert lane_by_lane_broadcasts(built) == 2


@pytest.mark.parametrize("name", GEMM_TILES)
def test_gemm_tiles_keep_their_accumulators_in_registers(code, name):
    if name not in code:
        pytest.fail(f"{name} is not in the library: the GEMM's AVX2 clones were renamed; update this test")
    assert spilled_accumulators(code[name]) == 0, f"{name} spills an accumulator in its K loop"


def test_blocked_conv_tiles_broadcast_in_one_instruction(code):
    spans = [name for name in code if name.startswith("bc8_") and name.endswith(".arch_x86_64_v3")]
    assert spans, "the blocked conv's AVX2 clones (bc8_*) are not in the library"
    built = {name: lane_by_lane_broadcasts(code[name]) for name in spans}
    assert not any(built.values()), f"vectors built lane by lane: {built}"


def stack_operand_fmas(instructions: list[str]) -> int:
    """Multiply-adds with an operand on the stack: the activations' polynomial constants, or spills."""
    return sum(ins.startswith("vfmadd") and "(%rsp)" in ins for ins in instructions)


@pytest.mark.parametrize("name", ["item_3x3.arch_x86_64_v3", "item_5x5.arch_x86_64_v3"])
def test_depthwise_tiles_read_their_inputs_from_the_scratch(code, name):
    """The depthwise items inline the same activation code as the GEMM's act_rows, whose constants
    are read from the stack; any stack operand beyond those is a spilled input or accumulator (the
    3x3 item had 119 against act_rows' 49, its tiles 2x slower)."""
    activations = stack_operand_fmas(code["gk8_act_rows.arch_x86_64_v3"])
    assert stack_operand_fmas(code[name]) <= activations, f"{name}: inputs or accumulators on the stack"


def stack_near_integer_products(instructions: list[str], reach: int = 6) -> int:
    """Vector loads or stores through the stack within ``reach`` instructions of a vpmaddwd: an int32
    accumulator or a widened input living in memory inside the integer convs' tap or K loop."""
    near = 0
    for i, ins in enumerate(instructions):
        if ins.startswith("vpmaddwd"):
            window = instructions[max(0, i - reach):i + reach + 1]
            near += any("(%rsp)" in w and "%ymm" in w for w in window)
    return near


@pytest.mark.parametrize("name", ["tile_avx2", "dw_rows_avx2", "pw_tile_avx2", "pw_tile8_avx2"])
def test_integer_conv_loops_keep_their_sums_in_registers(code, name):
    """The integer GEMM's 4x16 register tile (8 accumulators, 2 loads and a broadcast), the depthwise
    rows' tap loops (qgemm.c, qdepthwise.c; GCC inlines the two-row variant into dw_rows_avx2) and the
    pointwise kernel's tiles and their residual loops (qpointwise.c): their epilogues keep a run waiting to
    be stored and a small buffer for short stores on the stack, nothing near a product may."""
    assert stack_near_integer_products(["vpmaddwd %ymm3,%ymm4,%ymm4", "vmovdqa %ymm4,0x40(%rsp)"]) == 1
    if name not in code:
        pytest.fail(f"{name} is not in the library: the integer conv's AVX2 functions were renamed; update this test")
    products = sum(ins.startswith("vpmaddwd") for ins in code[name])
    assert products >= 2, f"{name} has {products} vpmaddwd: not the AVX2 path this test reads"
    assert stack_near_integer_products(code[name]) == 0, f"{name} keeps sums or inputs on the stack in its loop"


def test_integer_depthwise_float_sums_stay_in_registers(code):
    """The integer depthwise's channels-in-lanes path (qdepthwise_lanes.c: exact float32 sums with FMA, its
    row loops inlined into lanes_item): each tap's weights loaded once for 8 pixels' sums, which stay in
    registers, so every multiply-add reads its input from the tile and none reads the stack or spills a sum."""
    if "lanes_item" not in code:
        pytest.fail("lanes_item is not in the library: the lanes depthwise was renamed; update this test")
    fmas = sum(ins.startswith("vfmadd") for ins in code["lanes_item"])
    assert fmas >= 8, f"lanes_item has {fmas} FMAs: its 8 pixels' sums are not unrolled"
    assert stack_operand_fmas(code["lanes_item"]) == 0, "lanes_item reads weights or sums from the stack"
    assert spilled_accumulators(code["lanes_item"]) == 0, "lanes_item keeps a sum on the stack"
