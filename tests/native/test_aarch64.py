"""The native kernels built for aarch64 (Debian's gcc-aarch64-linux-gnu) and run under qemu-user,
against the numpy kernels: the `arm` target's C code really runs on ARM, NEON lowering of the
vector extensions included.  Skips with the reason where the cross compiler or qemu is absent
(``.ci/run`` installs both when it can)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from optcli import kernels, native
from optcli.native import recurrent as native_recurrent
from optcli.native.blocked_window import pack_depthwise_weights
from optcli.ops.activation import activate, apply_activation
from optcli.ops.conv import conv_im2col
from optcli.ops.elementwise import add
from optcli.ops.normalization import layer_normalization
from optcli.ops.pool import _axis_counts, average_pool, max_pool
from optcli.ops.spatial import window
from tests.helpers import assert_close
from tests.native.blocked_cases import (
    DW_CASES,
    GAP_SHAPES,
    POOL_CASES,
    axis_counts,
    from_blocked,
    ref_depthwise,
    ref_pool,
    to_blocked,
)
from tests.native.blocked_cases import geometry as blocked_geometry
from tests.native.cases import ACT_PARAMS, DEPTHWISE_CASES, GROUPED_STEM_CASES, STEM_CASES, make_case, numpy_depthwise

SRC = Path(kernels.__file__).parent / "host"  # the C sources setup.py builds
DRIVER = Path(__file__).parent / "driver.c"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
CODES = native.ACTIVATION_CODES
ACTS = list(ACT_PARAMS)


def _tools() -> tuple[str, str]:
    cc, qemu = shutil.which(CROSS_CC), shutil.which(QEMU) or shutil.which("qemu-aarch64-static")
    missing = [name for name, path in ((CROSS_CC, cc), (QEMU, qemu)) if not path]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: apt-get install gcc-aarch64-linux-gnu "
                    "qemu-user)")
    return cc, qemu


@pytest.fixture(scope="module")
def aarch64_driver(tmp_path_factory) -> tuple[str, Path]:
    cc, qemu = _tools()
    out = tmp_path_factory.mktemp("aarch64") / "driver"
    sources = sorted(str(p) for p in SRC.glob("*.c"))
    cmd = [cc, "-O2", "-std=c11", "-ffp-contract=fast", "-pthread", "-static", "-Wall", "-Werror", "-Wno-psabi",
           f"-I{SRC}", str(DRIVER), *sources, "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"cross build failed: {' '.join(cmd)}\n{res.stderr}"
    return qemu, out


def _bits(v: float) -> int:
    return int(np.array([v], np.float32).view(np.int32)[0])


def _write_case(path: Path, kind: int, act: str | int | None, geom: list[int],
                arrays: list[np.ndarray | None]) -> None:
    """The driver's case file (see driver.c); the last array is the bias, absent when None."""
    a, b = ACT_PARAMS.get(act, (0.0, 0.0))
    bias = arrays[-1]
    code = act if isinstance(act, int) else CODES[act]
    head = [kind, code, int(bias is not None), *geom, *[0] * (15 - len(geom)), _bits(a), _bits(b)]
    with open(path, "wb") as f:
        f.write(np.array(head, np.int64).tobytes())
        for arr in arrays:
            if arr is not None:
                f.write(np.ascontiguousarray(arr, np.float32).tobytes())


def _depthwise_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    cases = []
    for i, (name, xs, ws, attrs) in enumerate(DEPTHWISE_CASES):
        if len(xs) != 4 or xs[1] == 1 or xs[1] * xs[2] * xs[3] > 200_000:  # the numpy path's scope; quick under qemu
            continue
        act = ACTS[i % len(ACTS)] if i % 3 else None
        x, w, b, full = make_case(xs, ws, attrs, seed=i, activation=act, bias=i % 4 != 1)
        win = window(full, xs[2:], ws[2:])
        geom = [*xs, ws[0], *ws[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out]
        src, dst = tmp / f"dw{i}.in", tmp / f"dw{i}.out"
        _write_case(src, 0, act, geom, [x, w, b])
        cases.append((src, dst, numpy_depthwise(x, w, b, full), f"{name} {act}"))
    return cases


def _epilogue_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    rng = np.random.default_rng(7)
    cases = []
    for i, act in enumerate([None, *ACTS]):
        n, c, hw = 1 + i % 2, 3 + 2 * i, (1, 7, 8, 9, 49, 100)[i % 6]
        y = (rng.standard_normal((n, c, hw)) * 4).astype(np.float32)
        s = rng.standard_normal(c).astype(np.float32) if i % 2 else None
        b = rng.standard_normal(c).astype(np.float32) if i % 3 else None
        a, be = ACT_PARAMS.get(act, (0.0, 0.0))
        with mock.patch.object(native.library, "_lib", None):
            want = y * (1 if s is None else s[None, :, None]) + (0 if b is None else b[None, :, None])
            want = apply_activation(want.astype(np.float32), act, a, be)
        src, dst = tmp / f"ep{i}.in", tmp / f"ep{i}.out"
        _write_case(src, 1, act, [n, c, hw, int(s is not None)], [y, s, b])
        cases.append((src, dst, want, f"affine+{act} {n}x{c}x{hw}"))
    return cases


def _prelu_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """PRelu with a slope per channel: planes (lanes 1, 4-lane vectors and a tail), a dense layer's
    [rows, N] (lanes N: vectors and a tail), the blocked [N, Cb, HW, B]; zero and negative slopes,
    NaN and infinities; even sizes in place."""
    rng = np.random.default_rng(17)
    cases = []
    for i, (n, c, hw, lanes) in enumerate([(1, 28, 484, 1), (2, 13, 7, 1), (1, 1, 3, 1), (1, 1, 3, 37),
                                           (1, 2, 9, 8), (2, 3, 5, 4), (1, 5, 1, 1)]):
        x = (rng.standard_normal((n, c, hw, lanes)) * 3).astype(np.float32)
        x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf][: min(3, x.size)]
        s = rng.standard_normal((c, lanes)).astype(np.float32)
        s.reshape(-1)[0] = 0.0
        with np.errstate(invalid="ignore"):
            want = np.where(x >= 0, x, x * s[None, :, None, :]).astype(np.float32)
        src, dst = tmp / f"prelu{i}.in", tmp / f"prelu{i}.out"
        _write_case(src, 20, None, [n, c, hw, lanes], [x, s, None])
        cases.append((src, dst, want, f"channel prelu {n}x{c}x{hw}x{lanes}"))
    return cases


def _pool_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    rng = np.random.default_rng(5)
    cases = []
    shapes = [((1, 5, 13, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
              ((2, 3, 9, 20), {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1}),
              ((1, 7, 12, 12), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 1, 2, 1]}),
              ((1, 3, 17, 38), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # 2x2 max: vectors and a tail
              # max read straight from the input (rows of a vector or more), column stride 2, asymmetric pads
              ((1, 3, 15, 37), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1})]
    for i, (xs, attrs) in enumerate(shapes):
        for op, kernel in ((1, max_pool), (2, average_pool)):
            full = {**attrs, "count_include_pad": i % 2}
            x = rng.standard_normal(xs).astype(np.float32)
            win = window(full, xs[2:], full["kernel_shape"], ceil_mode=bool(full.get("ceil_mode", 0)))
            geom = [*xs, xs[1], *win.kernel, *win.strides, *win.dilations, *win.pad_begin, *win.out]
            counts = [1.0 / c for c in _axis_counts(win, xs[2:], bool(i % 2))] if op == 2 else [None, None]
            with mock.patch.object(native.library, "_lib", None):
                want = kernel([x], dict(full))[0]
            src, dst = tmp / f"pool{i}-{op}.in", tmp / f"pool{i}-{op}.out"
            _write_case(src, 2, op, geom, [x, *counts, None])
            cases.append((src, dst, want, f"{kernel.__name__} {xs} {attrs}"))
    return cases


def _gemm_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The GEMM's 4-lane tiles (NEON registers) on odd shapes, K over one block (768); under 16
    columns its narrow path (dot products along K, 8 rows x 2 columns), N = 1..15, K = 1 and K off
    the 4 lanes, rows off the 8-row tiles; 16 to 256 columns taken transposed on packed panels."""
    rng = np.random.default_rng(11)
    cases = []
    plain = [(1, 1, 1, 1), (2, 7, 13, 31), (1, 13, 800, 49), (1, 24, 5, 197), (1, 6, 16, 16), (3, 17, 3, 5),
             (2, 3, 40, 100), (1, 9, 1, 15), (2, 37, 130, 3), (1, 1024, 64, 1), (1, 19, 33, 2), (1, 8, 7, 14),
             (1, 100, 1001, 1)]
    # the transposed product of small planes (M a multiple of 4; 8-column panels, a last one of 4)
    transposed = [(1, 4, 1, 16), (2, 12, 37, 49), (1, 40, 97, 196), (1, 8, 5, 23), (1, 320, 16, 256)]
    for i, (batch, m, k, n) in enumerate(plain + transposed):
        act = [None, *ACTS][i * 2 % (len(ACTS) + 1)]
        w = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
        x = rng.standard_normal((batch, k, n)).astype(np.float32)
        r = rng.standard_normal((batch, m, n)).astype(np.float32) if i % 2 else None
        b = rng.standard_normal(m).astype(np.float32) if i % 3 else None
        pre = np.einsum("mk,bkn->bmn", w.astype(np.float64), x.astype(np.float64))
        pre = pre + (0 if b is None else b[:, None]) + (0 if r is None else r)
        want = apply_activation(pre.astype(np.float32), act, *ACT_PARAMS.get(act, (0.0, 0.0)))
        src, dst = tmp / f"gemm{i}.in", tmp / f"gemm{i}.out"
        transposed = i >= len(plain)
        _write_case(src, 3, act, [batch, m, k, n, int(r is not None), int(transposed)], [w, x, r, b])
        cases.append((src, dst, want, f"gemm {batch}x{m}x{k}x{n} {act} residual={r is not None} "
                                      f"transposed={transposed}"))
    return cases


def _elementwise_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """Stand-alone activations (GELU's 4-lane form), row means and LayerNormalization, rows and strided."""
    rng = np.random.default_rng(13)
    cases = []
    for i, (act, n) in enumerate([("gelu", 1), ("gelu", 37), ("gelu_tanh", 1000), ("sigmoid", 9), ("gelu", 20000)]):
        x = (rng.standard_normal(n) * 4).astype(np.float32)
        with mock.patch.object(native.library, "_lib", None):
            want = apply_activation(x.copy(), act)
        src, dst = tmp / f"act{i}.in", tmp / f"act{i}.out"
        _write_case(src, 4, act, [n], [x, None])
        cases.append((src, dst, want, f"{act} over {n}"))
    for i, (act, n) in enumerate([("relu", 1), (None, 40000), ("clip", 8195)]):
        x, b = (rng.standard_normal((2, n)) * 4).astype(np.float32)
        fused = {"activation": act, "activation_alpha": 0.0, "activation_beta": 6.0} if act else {}
        with mock.patch.object(native.library, "_lib", None):
            want = add([x, b], fused)[0]
        src, dst = tmp / f"add{i}.in", tmp / f"add{i}.out"
        head = [9, native.ACTIVATION_CODES[act], 0, n, *[0] * 14, _bits(0.0), _bits(6.0)]
        with open(src, "wb") as f:
            f.write(np.array(head, np.int64).tobytes() + x.tobytes() + b.tobytes())
        cases.append((src, dst, want, f"add + {act} over {n}"))
    for i, (rows, nb, act) in enumerate([(64, 96, "tanh"), (3, 1, None), (5, 37, "relu"), (2, 9000, None)]):
        x, b = (rng.standard_normal(rows * nb) * 4).astype(np.float32), rng.standard_normal(nb).astype(np.float32)
        with mock.patch.object(native.library, "_lib", None):
            want = add([x.reshape(rows, nb), b], {"activation": act} if act else {})[0].reshape(-1)
        src, dst = tmp / f"addp{i}.in", tmp / f"addp{i}.out"
        head = [9, native.ACTIVATION_CODES[act], 0, rows * nb, nb, *[0] * 13, _bits(0.0), _bits(0.0)]
        with open(src, "wb") as f:
            f.write(np.array(head, np.int64).tobytes() + x.tobytes() + b.tobytes())
        cases.append((src, dst, want, f"add of a {nb}-float row + {act} over {rows} rows"))
    for i, (rows, k, n) in enumerate([(1, 1, 1), (1, 96, 288), (3, 13, 45), (5, 7, 5), (8, 300, 131)]):
        act = [None, "sigmoid", "tanh", "relu", "gelu"][i]
        x = rng.standard_normal((rows, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None
        pre = x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)
        want = apply_activation(pre.astype(np.float32), act, *ACT_PARAMS.get(act, (0.0, 0.0)))
        src, dst = tmp / f"fcrows{i}.in", tmp / f"fcrows{i}.out"
        _write_case(src, 19, act, [rows, k, n], [x, w, b])
        cases.append((src, dst, want, f"fc rows {rows}x{k}x{n} {act} bias={b is not None}"))
    # the GEMM's fully connected layer (optcli_fc_f32): thin, narrow and tiled work items, the bias as a row
    for i, (rows, k, n) in enumerate([(3, 13, 45), (17, 5, 3), (40, 100, 70), (9, 900, 33)]):
        act = ["gelu", None, "relu", "sigmoid"][i]
        x = rng.standard_normal((rows, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if i != 1 else None
        pre = x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)
        want = apply_activation(pre.astype(np.float32), act, *ACT_PARAMS.get(act, (0.0, 0.0)))
        src, dst = tmp / f"fc{i}.in", tmp / f"fc{i}.out"
        _write_case(src, 30, act, [rows, k, n, i % 2], [x, w, b])  # odd cases: the weight packed first
        cases.append((src, dst, want, f"gemm fc {rows}x{k}x{n} {act} bias={b is not None}"))
    for i, (rows, n) in enumerate([(1, 1), (3, 7), (2, 19), (4, 2050)]):  # softmax rows: tails, 1024-float blocks
        x = (rng.standard_normal((rows, n)) * 10).astype(np.float32)
        if i == 2:
            x[1, 3] = np.nan  # a NaN row
        with np.errstate(invalid="ignore"):
            e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
            want = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        src, dst = tmp / f"softmax{i}.in", tmp / f"softmax{i}.out"
        _write_case(src, 31, None, [rows, n], [x, None])
        cases.append((src, dst, want, f"softmax {rows}x{n}"))
    for i, (outer, n, inner) in enumerate([(1, 3, 5), (2, 16, 21), (1, 4, 530)]):  # softmax along a middle axis
        x = (rng.standard_normal((outer, n, inner)) * 10).astype(np.float32)
        if i == 1:
            x[1, 3, 7] = np.inf  # an infinite row
        with np.errstate(invalid="ignore"):
            e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
            want = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        src, dst = tmp / f"softmax_mid{i}.in", tmp / f"softmax_mid{i}.out"
        _write_case(src, 32, None, [outer, n, inner], [x, None])
        cases.append((src, dst, want, f"softmax {outer}x{n}x{inner} along the middle"))
    for i, (rows, n) in enumerate([(1, 1), (7, 13), (3, 5000)]):
        x = (rng.standard_normal((rows, n)) + 3).astype(np.float32)
        src, dst = tmp / f"mean{i}.in", tmp / f"mean{i}.out"
        _write_case(src, 6, None, [rows, n], [x, None])
        cases.append((src, dst, x.astype(np.float64).mean(axis=1).astype(np.float32), f"row mean {rows}x{n}"))
    for i, (outer, c, inner) in enumerate([(1, 1, 1), (3, 17, 1), (2, 40, 1), (2, 7, 15), (1, 13, 77)]):
        x = (rng.standard_normal((outer, c, inner)) + 2).astype(np.float32)
        s, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        with mock.patch.object(native.library, "_lib", None):
            y, mean, inv = layer_normalization([np.moveaxis(x, 1, -1), s, b], {"epsilon": 1e-5})
        want = np.concatenate([np.moveaxis(y, -1, 1).ravel(), mean.ravel(), inv.ravel()])
        src, dst = tmp / f"ln{i}.in", tmp / f"ln{i}.out"
        head = [5, 0, 1, outer, c, inner, *[0] * 12, _bits(1e-5), 0]
        with open(src, "wb") as f:
            f.write(np.array(head, np.int64).tobytes() + x.tobytes() + s.tobytes() + b.tobytes())
        cases.append((src, dst, want, f"layer norm {outer}x{c}x{inner}"))
    return cases + _quantized_lstm_cases(tmp, rng)


def _quantized_lstm_cases(tmp: Path, rng) -> list[tuple[Path, Path, np.ndarray, str]]:
    """DynamicQuantizeLSTM's time loop (recurrent.c, QUANTIZE_H) against the numpy loop of
    optcli/ops/recurrent_quant.py, on a projection that loop's layer made."""
    from optcli.ops.recurrent_quant import QuantizedLSTM

    cases = []
    for i, (seq, size, hidden, direction) in enumerate([(1, 1, 1, "forward"), (5, 3, 7, "reverse"),
                                                        (9, 5, 33, "bidirectional")]):
        dirs = 2 if direction == "bidirectional" else 1
        w = rng.integers(-127, 128, (dirs, size, 4 * hidden)).astype(np.int8)
        r = rng.integers(-127, 128, (dirs, hidden, 4 * hidden)).astype(np.int8)
        scales = [np.full(dirs, 0.004, np.float32), rng.uniform(0.001, 0.01, (dirs, 4 * hidden)).astype(np.float32)]
        inputs = [None, w, r, rng.uniform(-0.3, 0.3, (dirs, 8 * hidden)).astype(np.float32), None, None, None, None,
                  scales[0], np.zeros(dirs, np.int8), scales[i % 2], np.zeros(scales[i % 2].shape, np.int8)]
        layer = QuantizedLSTM(inputs, {"hidden_size": hidden, "direction": direction})
        xp = layer.projection(rng.uniform(-1, 1, (seq, 1, size)).astype(np.float32), seq, use_native=False)
        want = np.concatenate([v.ravel() for v in layer.numpy_loop(xp, None, None, None, None)])
        codes = [native.ACTIVATION_CODES[n] for n in ("sigmoid", "tanh", "tanh")]
        head = [21, 0, 0, dirs, seq, 1, hidden, ("forward", "reverse", "bidirectional").index(direction), *codes,
                *[0] * 9]
        src, dst = tmp / f"qlstm{i}.in", tmp / f"qlstm{i}.out"
        with open(src, "wb") as f:
            rt = native_recurrent._panels(layer.rc)  # the C loop reads R^T in panels
            f.write(np.array(head, np.int64).tobytes() + xp.tobytes() + rt.tobytes() + layer.rscale.tobytes())
        cases.append((src, dst, want, f"quantized-h LSTM {seq}x{size}x{hidden} {direction}"))
    return cases


def _conv_gemm_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The implicit GEMM (columns gathered from the padded input while packing), odd geometry."""
    rng = np.random.default_rng(12)
    cases = []
    for i, (xs, ws, attrs) in enumerate([((1, 3, 17, 20), (8, 3, 3, 3), {"strides": [2, 2]}),
                                         ((2, 5, 9, 30), (13, 5, 3, 5), {"strides": [1, 2], "dilations": [2, 1]}),
                                         ((1, 40, 7, 7), (30, 40, 3, 3), {})]):  # 30 rows of 49 columns: shared pack
        act = ACTS[i * 3 % len(ACTS)]
        xp = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        full = {"kernel_shape": list(ws[2:]), **attrs}
        with mock.patch.object(native.library, "_lib", None):
            want = conv_im2col([xp, w, b], dict(full))[0]
        r = rng.standard_normal(want.shape).astype(np.float32) if i % 2 else None
        want = apply_activation(want + (0 if r is None else r), act, *ACT_PARAMS.get(act, (0.0, 0.0)))
        st, dl = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
        geom = [xs[0], ws[0], *xs[1:], *ws[2:], *st, *dl, *want.shape[2:], int(r is not None)]
        src, dst = tmp / f"convgemm{i}.in", tmp / f"convgemm{i}.out"
        _write_case(src, 7, act, geom, [w, xp, r, b])
        cases.append((src, dst, want, f"implicit GEMM {xs} {ws} {attrs} {act}"))
    return cases


def _stem_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The stem conv's 4-lane tiles (NEON registers) on odd shapes, each with an activation or none."""
    cases = []
    for i, (name, xs, ws, attrs) in enumerate(STEM_CASES):
        if xs[1] * xs[2] * xs[3] * ws[0] > 2_000_000:  # quick under qemu
            continue
        act = [None, *ACTS][i % (len(ACTS) + 1)]
        x, w, b, full = make_case(xs, ws, {**attrs, "group": 1}, seed=i, activation=act, bias=i % 4 != 1)
        w /= np.sqrt(np.prod(ws[1:]))
        win = window(full, xs[2:], ws[2:])
        geom = [*xs, ws[0], *ws[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out]
        with mock.patch.object(native.library, "_lib", None):
            want = conv_im2col([x, w, b], dict(full))[0]
        src, dst = tmp / f"stem{i}.in", tmp / f"stem{i}.out"
        _write_case(src, 8, act, geom, [x, w, b])
        cases.append((src, dst, want, f"stem {name} {act}"))
    return cases


def _grouped_stem_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The grouped stem conv (each image's groups as images of their own, with their own weights)."""
    cases = []
    for i, (name, xs, ws, attrs) in enumerate(GROUPED_STEM_CASES):
        act = [None, *ACTS][(i + 1) % (len(ACTS) + 1)]
        x, w, b, full = make_case(xs, ws, attrs, seed=40 + i, activation=act, bias=i % 3 != 1)
        win = window(full, xs[2:], ws[2:])
        geom = [*xs, ws[0], *ws[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out]
        with mock.patch.object(native.library, "_lib", None):
            want = conv_im2col([x, w, b], dict(full))[0]
        src, dst = tmp / f"gstem{i}.in", tmp / f"gstem{i}.out"
        _write_case(src, 17, act, geom, [None])  # the header; groups and the arrays follow
        with open(src, "ab") as f:
            f.write(np.array([attrs["group"]], np.int64).tobytes())
            for arr in (x, w, b):
                if arr is not None:
                    f.write(np.ascontiguousarray(arr, np.float32).tobytes())
        if b is not None:
            with open(src, "r+b") as f:  # has bias
                f.seek(16)
                f.write(np.array([1], np.int64).tobytes())
        cases.append((src, dst, want, f"grouped stem {name} {act}"))
    return cases


def _upsample_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """Upsampling by whole factors: nearest (tap stride 0) and a ConvTranspose's columns, KW = 2
    (the interleaving shuffles) and others, rows that are not whole vectors, with activations."""
    rng, cases = np.random.default_rng(18), []
    for i, (planes, h, w, kh, kw, taps) in enumerate([(3, 5, 7, 2, 2, False), (2, 4, 17, 1, 2, True),
                                                        (5, 3, 9, 3, 2, True), (1, 1, 1, 2, 3, False),
                                                        (4, 6, 16, 2, 1, True), (2, 2, 33, 2, 2, True)]):
        act = [None, *ACTS][i % (len(ACTS) + 1)]
        channels = planes if taps else 1
        ts = h * w if taps else 0
        src = rng.standard_normal((planes, kh * kw if taps else 1, h, w)).astype(np.float32)
        b = rng.standard_normal(channels).astype(np.float32) if taps else None
        if taps:  # y[p, i*kh + a, j*kw + c] = src[p, a*kw + c, i, j]
            want = src.reshape(planes, kh, kw, h, w).transpose(0, 3, 1, 4, 2).reshape(planes, h * kh, w * kw)
            want = want + b[:, None, None]
        else:
            want = np.repeat(np.repeat(src[:, 0], kh, axis=1), kw, axis=2)
        if act is not None:
            want = apply_activation(want.copy(), act, *ACT_PARAMS[act])
        path, dst = tmp / f"up{i}.in", tmp / f"up{i}.out"
        _write_case(path, 18, act, [planes, channels, h, w, kh, kw, src[0].size, ts], [src, b])
        cases.append((path, dst, want, f"upsample {planes}x{h}x{w} by {kh}x{kw} {'taps' if taps else 'nearest'} {act}"))
    return cases


def _blocked_cases(tmp: Path, block: int = 4) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The blocked (NCHWc) window kernels with B = 4 (NEON's width): depthwise with every activation,
    max and average pooling, global average; garbage in the input's pad lanes."""
    rng, cases = np.random.default_rng(17), []
    for i, case in enumerate(c for c in DW_CASES if c[2] * c[3] * c[4] <= 60_000):
        name, n, c, h, w, k, s, d, _ = case
        act = [None, *ACTS][i % (len(ACTS) + 1)]
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        wt = rng.standard_normal((c, 1, *k)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32) if i % 3 else None
        pad_begin, out = blocked_geometry(case)
        bias = None if b is None else np.pad(b, (0, -c % block))
        geom = [n, -(-c // block), h, w, *k, *s, *d, *pad_begin, *out, block]
        src, dst = tmp / f"bdw{i}.in", tmp / f"bdw{i}.out"
        _write_case(src, 12, act, geom, [to_blocked(x, block, 1e30), pack_depthwise_weights(wt, block), bias])
        cases.append((src, dst, _Real(ref_depthwise(x, wt, b, case, act), c, block), f"blocked dw {name} {act}"))
    for i, case in enumerate(c for c in POOL_CASES if c[2] * c[3] * c[4] <= 60_000):
        name, n, c, h, w, k, s, d, _ = case
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        pad_begin, out = blocked_geometry(case)
        geom = [n, -(-c // block), h, w, *k, *s, *d, *pad_begin, *out, block]
        for op, code in (("max", 1), ("avg", 2)):
            src, dst = tmp / f"bpool{i}-{op}.in", tmp / f"bpool{i}-{op}.out"
            counts = list(axis_counts(case)) if op == "avg" else [None, None]
            _write_case(src, 13, code, geom, [to_blocked(x, block), *counts, None])
            cases.append((src, dst, _Real(ref_pool(x, case, op), c, block), f"blocked {op} pool {name}"))
    for i, shape in enumerate(GAP_SHAPES):
        x = (rng.standard_normal(shape) + 3).astype(np.float32)
        src, dst = tmp / f"bgap{i}.in", tmp / f"bgap{i}.out"
        _write_case(src, 14, None, [shape[0], -(-shape[1] // block), shape[2] * shape[3], block],
                    [to_blocked(x, block, 1e30), None])
        want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(np.float32)
        cases.append((src, dst, _Real(want, shape[1], block), f"blocked global average {shape}"))
    return cases


def _blocked_conv_cases(tmp: Path, block: int = 4) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The blocked dense and grouped convs (plain and blocked inputs, residual, every activation) and the
    conversions with B = 4, the cases of test_blocked_conv.py small enough for qemu."""
    from optcli.native.blocked_conv import grouped_fits, pack_conv_weights
    from tests.native.test_blocked_conv import CASES, GROUPED_CASES, grouped_reference
    from tests.native.test_blocked_conv import _case as conv_case

    cases = []
    grouped = [c for c in GROUPED_CASES if grouped_fits(c[2] // c[10], c[3] // c[10], block) and c[4] * c[5] <= 400]
    for i, case in enumerate([c for c in CASES if c[4] * c[5] <= 400] + grouped):
        name, n, c, m, h, w, k, s, d, pads, *rest = case
        groups = rest[0] if rest else 1
        x, wt, b, attrs, ref = conv_case(case, i)
        if groups > 1:
            ref = grouped_reference(x, wt, b, attrs, groups).astype(np.float32)
        act = [None, *ACTS][i % (len(ACTS) + 1)]
        res = np.random.default_rng(i).standard_normal(ref.shape).astype(np.float32)
        want = activate(ref + res, act, *ACT_PARAMS.get(act, (0.0, 0.0)))
        plain = i % 2 == 0
        geom = [n, c, h, w, m, k, k, s, s, d, d, pads[0], pads[1], *ref.shape[2:]]
        src, dst = tmp / f"bconv{i}.in", tmp / f"bconv{i}.out"
        _write_case(src, 11, act, geom, [None])  # the header; the rest follows
        with open(src, "ab") as f:
            f.write(np.array([1 if plain else block, block, 1, groups], np.int64).tobytes())
            for arr in (x if plain else to_blocked(x, block, 1e30), pack_conv_weights(wt, block, groups),
                        to_blocked(res, block), np.pad(b, (0, -m % block))):
                f.write(np.ascontiguousarray(arr, np.float32).tobytes())
        with open(src, "r+b") as f:  # has bias
            f.seek(16)
            f.write(np.array([1], np.int64).tobytes())
        cases.append((src, dst, _Real(want, m, block), f"blocked conv {name} {act}"))
    x = np.random.default_rng(3).standard_normal((2, 13, 5, 7)).astype(np.float32)
    for direction, arr, want in ((0, x, to_blocked(x, block)), (1, to_blocked(x, block), x)):
        src, dst = tmp / f"reorder{direction}.in", tmp / f"reorder{direction}.out"
        _write_case(src, 10, None, [2, 13, 35, block, direction], [arr, None])
        cases.append((src, dst, want, f"blocked conversion {direction}"))
    return cases


class _Real:
    """An expected NCHW answer of c channels, compared with the real lanes of a blocked output (B
    lanes a block): pad lanes hold act(0), or for pooling the input's."""

    def __init__(self, want: np.ndarray, c: int, block: int):
        self.want, self.c = want, c
        n, _, h, w = want.shape
        self.shape = (n, -(-c // block), h, w, block)


def _int8_cases(tmp: Path, variant: int = 6) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The integer convs (every case of tests/native/test_qgemm.py and of test_qpointwise.py, signed and
    unsigned) and the quantized add, against their numpy references: exact, so an off-by-one step fails
    assert_close.  ``variant``: the dot-product path the driver must report (6: sdot, on qemu's default CPU;
    7: smull / sadalp, on a CPU model without the dot product)."""
    from optcli.native.qgemm import pack_quads, prepared_weights
    from optcli.ops import qadd, qconv
    from tests.native.test_qgemm import CASES as QCONV_CASES
    from tests.native.test_qgemm import make as make_qconv
    from tests.native.test_qpointwise import SHAPES as POINTWISE_SHAPES
    from tests.native.test_qpointwise import case as pointwise_case
    from tests.quant.test_qadd import make as make_qadd

    cases = []
    for i, name in enumerate(QCONV_CASES):
        x, w, b, attrs = make_qconv(QCONV_CASES[name], i, i % 2, (i // 2) % 2)
        win = window(attrs, x.shape[2:], w.shape[2:])
        geom = [*x.shape, w.shape[0], *w.shape[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out,
                attrs["group"]]
        qp = [attrs[k] for k in ("x_zero_point", "y_zero_point", "qmin", "qmax", "x_signed", "y_signed")]
        # the routing and packing of optcli/native/qgemm.py (the pointwise kernel's bias has x's zero point in it)
        kind, packed, bias = prepared_weights(w, b, tuple(geom), tuple(qp))
        weights = packed.tobytes()
        src, dst = tmp / f"qconv{i}.in", tmp / f"qconv{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([15, 0, 1, *[0] * 17], np.int64).tobytes())
            route = ("gemm", "depthwise", "pointwise", "dense").index(kind)
            f.write(np.array([*geom, *qp, route, len(weights)], np.int64).tobytes())
            f.write(x.tobytes() + weights + bias.tobytes() + qconv.multiplier(attrs, w.shape[0]).tobytes())
        cases.append((src, dst, qconv.reference(x, w, b, attrs).astype(np.float32), f"qconv {name}"))
    for i, name in enumerate(POINTWISE_SHAPES):  # the pointwise kernel whatever the routing's residual bound
        x, w, b, attrs = pointwise_case(POINTWISE_SHAPES[name], i, i % 2, (i // 2) % 2)
        n, c, h, wd = x.shape
        geom = [n, c, h, wd, w.shape[0], 1, 1, 1, 1, 1, 1, 0, 0, h, wd, attrs["group"]]
        qp = [attrs[k] for k in ("x_zero_point", "y_zero_point", "qmin", "qmax", "x_signed", "y_signed")]
        # whole weights (the sdot tile where the CPU has the dot product) and split ones (the plain tile) in turn
        blob, bias = pack_quads(w, b, qp[0], bool(qp[4]), whole=bool(i % 2))
        src, dst = tmp / f"qpointwise{i}.in", tmp / f"qpointwise{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([15, 0, 1, *[0] * 17], np.int64).tobytes())
            f.write(np.array([*geom, *qp, 2, blob.nbytes], np.int64).tobytes())
            f.write(x.tobytes() + blob.tobytes() + bias.tobytes() + qconv.multiplier(attrs, w.shape[0]).tobytes())
        cases.append((src, dst, qconv.reference(x, w, b, attrs).astype(np.float32), f"qpointwise {name}"))
    from tests.native.test_qpool import CASES as QPOOL_CASES
    from tests.native.test_qpool import reference as qpool_reference
    for i, name in enumerate(QPOOL_CASES):  # the 8-bit max pool, u8 and s8 in turn
        shape, *geom = QPOOL_CASES[name]
        dtype = (np.uint8, np.int8)[i % 2]
        x = np.random.default_rng(i).integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape, dtype=dtype)
        src, dst = tmp / f"qpool{i}.in", tmp / f"qpool{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([22, 0, 0, *[0] * 17], np.int64).tobytes())
            e = [*shape, *[v for pair in geom for v in pair], int(dtype == np.int8)]
            f.write(np.array(e + [0] * (24 - len(e)), np.int64).tobytes())
            f.write(x.tobytes())
        cases.append((src, dst, qpool_reference(x, *geom).astype(np.float32), f"qpool {name}"))
    cases += _qmatmul_cases(tmp)
    src, dst = tmp / "qvariant.in", tmp / "qvariant.out"
    with open(src, "wb") as f:  # the tile the CPU model must take: the test fails if the kernels ran another
        f.write(np.array([26, 0, 0, *[0] * 17], np.int64).tobytes() + np.zeros(24, np.int64).tobytes())
    cases.append((src, dst, np.array([variant], np.float32), f"the integer kernels' path is variant {variant}"))
    for i, signs in enumerate([(0, 0, 0), (1, 1, 1), (0, 1, 1), (1, 0, 0)]):
        a, b, attrs = make_qadd(i, (1, 5, 37, 41), *signs)
        src, dst = tmp / f"qadd{i}.in", tmp / f"qadd{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([16, 0, 0, *[0] * 17], np.int64).tobytes())
            f.write(np.array([a.size, *signs, *[0] * 20], np.int64).tobytes())
            f.write(qadd.params(attrs).tobytes() + a.tobytes() + b.tobytes())
        cases.append((src, dst, qadd.reference(a, b, attrs).astype(np.float32), f"qadd {signs}"))
    return cases + _island_cases(tmp)


def _qmatmul_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The integer dense layer (qmatmul.c: sdot under qemu) on every shape of tests/quant/test_qmatmul.py, u8 and
    s8 in and out, whole weights and split ones (their residual entries) in turn, against the numpy reference."""
    from optcli.native.qgemm import pack_columns
    from optcli.ops import qmatmul
    from tests.quant.test_qmatmul import SHAPES, _case

    cases = []
    for i, (lead, k, m) in enumerate(SHAPES):
        x, w, b, attrs = _case(np.random.default_rng(i), lead, k, m, i % 2, (i // 2) % 2, bool(i % 3))
        weights, aux = pack_columns(w, b, split=bool(i % 2))
        rows = int(np.prod(lead, dtype=np.int64))
        qp = [attrs[a] for a in ("x_zero_point", "y_zero_point", "qmin", "qmax", "x_signed", "y_signed")]
        src, dst = tmp / f"qmatmul{i}.in", tmp / f"qmatmul{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([27, 0, 0, *[0] * 17], np.int64).tobytes())
            e = [rows, k, m, i % 2, *qp, weights.nbytes, aux.size]
            f.write(np.array(e + [0] * (24 - len(e)), np.int64).tobytes())
            f.write(x.tobytes() + weights.tobytes() + aux.tobytes() + qmatmul.multiplier(attrs, m).tobytes())
        cases.append((src, dst, qmatmul.reference(x, w, b, attrs).astype(np.float32).reshape(rows, m),
                      f"qmatmul {lead} x {k} x {m}"))
    return cases


def _island_cases(tmp: Path) -> list[tuple[Path, Path, np.ndarray, str]]:
    """The byte table lookup (the portable loop: aarch64 has no VBMI) and the squeeze-excite multiply and pool
    (kernels/host/qelementwise.c) against their numpy references."""
    from optcli.ops import qlookup, qmul

    rng = np.random.default_rng(23)
    cases = []
    for i, (n, signed) in enumerate([(16384 * 2 + 77, 0), (131, 1), (0, 0)]):
        table = rng.integers(0, 256, 256).astype(np.uint8).view(np.int8 if signed else np.uint8)
        x = rng.integers(0, 256, n).astype(np.uint8)
        src, dst = tmp / f"qlookup{i}.in", tmp / f"qlookup{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([23, 0, 0, *[0] * 17], np.int64).tobytes())
            f.write(np.array([n, signed, *[0] * 22], np.int64).tobytes())
            f.write(table.tobytes() + x.tobytes())
        cases.append((src, dst, qlookup.reference(x, table).astype(np.float32), f"qlookup {n} {signed}"))
    for i, (shape, signs) in enumerate([((1, 5, 13, 11), (0, 0, 0)), ((2, 3, 9, 7), (1, 1, 1)),
                                        ((1, 4, 130, 129), (0, 1, 1))]):
        attrs = {"x_scale": 0.05, "x_zero_point": -3 if signs[0] else 120, "x_signed": signs[0], "g_scale": 0.004,
                 "g_zero_point": 2 if signs[1] else 0, "g_signed": signs[1], "y_scale": 0.05 * 0.004 * 90,
                 "y_zero_point": 5 if signs[2] else 100, "y_signed": signs[2], "qmin": -128 if signs[2] else 0,
                 "qmax": 127 if signs[2] else 255}
        x = rng.integers(0, 256, shape).astype(np.uint8).view(np.int8 if signs[0] else np.uint8)
        g = rng.integers(0, 256, (*shape[:2], 1, 1)).astype(np.uint8).view(np.int8 if signs[1] else np.uint8)
        rows, inner = shape[0] * shape[1], shape[2] * shape[3]
        src, dst = tmp / f"qmul{i}.in", tmp / f"qmul{i}.out"
        zps = [attrs["x_zero_point"], attrs["g_zero_point"], attrs["y_zero_point"], *signs]
        with open(src, "wb") as f:
            f.write(np.array([24, 0, 0, *[0] * 17], np.int64).tobytes())
            f.write(np.array([rows, inner, *zps, *[0] * 16], np.int64).tobytes())
            f.write(np.array([qmul.mul_multiplier(attrs), attrs["qmin"], attrs["qmax"]], np.float32).tobytes())
            f.write(x.tobytes() + g.tobytes())
        cases.append((src, dst, qmul.mul_reference(x, g, attrs).astype(np.float32), f"qmul {shape} {signs}"))
        pool = {**attrs, "y_scale": attrs["x_scale"] * 3, "y_zero_point": 0 if signs[2] else 128}
        src, dst = tmp / f"qgap{i}.in", tmp / f"qgap{i}.out"
        with open(src, "wb") as f:
            f.write(np.array([25, 0, 0, *[0] * 17], np.int64).tobytes())
            f.write(np.array([rows, inner, attrs["x_zero_point"], pool["y_zero_point"], signs[0], signs[2],
                              *[0] * 18], np.int64).tobytes())
            f.write(np.array([qmul.gap_multiplier(pool, inner), pool["qmin"], pool["qmax"]], np.float32).tobytes())
            f.write(x.tobytes())
        want = qmul.gap_reference(x, pool).astype(np.float32).reshape(-1)
        cases.append((src, dst, want, f"qgap {shape} {signs}"))
    return cases


@pytest.mark.parametrize("threads", [1, 3])
def test_kernels_on_aarch64_match_numpy(aarch64_driver, tmp_path, threads):
    qemu, driver = aarch64_driver
    cases = (_depthwise_cases(tmp_path) + _epilogue_cases(tmp_path) + _prelu_cases(tmp_path) + _pool_cases(tmp_path)
             + _gemm_cases(tmp_path)
             + _elementwise_cases(tmp_path) + _conv_gemm_cases(tmp_path) + _stem_cases(tmp_path)
             + _grouped_stem_cases(tmp_path) + _upsample_cases(tmp_path)
             + _blocked_cases(tmp_path) + _blocked_conv_cases(tmp_path) + _int8_cases(tmp_path))
    assert len(cases) >= 80
    args = [str(p) for src, dst, _, _ in cases for p in (src, dst)]
    res = subprocess.run([qemu, str(driver), str(threads), *args], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"driver exited {res.returncode}: {res.stdout}{res.stderr}"
    assert f"{len(cases)} cases, {threads} threads" in res.stdout
    for _, dst, want, what in cases:
        got = np.fromfile(dst, np.float32).reshape(want.shape)
        if isinstance(want, _Real):
            got, want = from_blocked(got, want.c), want.want
        assert_close(got, want, what=f"aarch64: {what}")


def test_integer_kernels_on_aarch64_without_the_dot_product(aarch64_driver, tmp_path):
    """A Cortex-A72 (qemu's CPU model: Armv8.0, no sdot, as on most boards) picks the smull / sadalp tile
    (variant 7) for the 1x1 convs on whole weights: the same integers as numpy's."""
    qemu, driver = aarch64_driver
    cases = _int8_cases(tmp_path, variant=7)
    args = [str(p) for src, dst, _, _ in cases for p in (src, dst)]
    res = subprocess.run([qemu, "-cpu", "cortex-a72", str(driver), "2", *args], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, f"driver exited {res.returncode}: {res.stdout}{res.stderr}"
    for _, dst, want, what in cases:
        assert_close(np.fromfile(dst, np.float32).reshape(want.shape), want, what=f"aarch64 (no dotprod): {what}")
