"""The fully connected kernels against a float64 product.

The GEMM's (kernels/host/gemm.c ``optcli_fc_f32``, ``native.prepared_fc``): rows through the
GEMM's every work item (4 rows or fewer: the thin one; under 16 columns: dot products; tiles of
whole and partial rows and columns), K over one packed block, the bias as a residual row, every
fused activation, 1 and 2 threads; ``FullyConnected`` on 16 rows or more taking it.

The few-row one (kernels/host/fc_rows.c, ``native.prepared_fc_rows``) against
a float64 product: 1 to 8 rows (a row group of four and its remainder), K of 1 and primes, N below
one vector, between vectors and past a whole register tile, every fused activation, with and
without bias, non-contiguous and higher-rank X, 1 and 2 threads (the threaded split of column tiles
on a large product); and ``FullyConnected`` in a Loop-like step taking it."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.ops.activation import apply_activation
from optcli.ops.gemm import fully_connected
from optcli.ops.registry import StepAttrs
from tests.helpers import assert_close
from tests.native.cases import ACT_PARAMS

RNG = np.random.default_rng(23)


def _reference(x, w, b, act):
    y = x.astype(np.float64).reshape(-1, w.shape[0]) @ w.astype(np.float64)
    if b is not None:
        y = y + b
    a, be = ACT_PARAMS.get(act, (0.0, 0.0))
    y = apply_activation(y.astype(np.float32), act, a, be)
    return y.reshape(x.shape[:-1] + (w.shape[1],))


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8])
@pytest.mark.parametrize("k,n", [(1, 1), (7, 5), (96, 8), (13, 30), (126, 288), (3, 33), (5, 71)])
def test_fc_rows_matches_float64(rows, k, n, pool_threads):
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    for bias in (b, None):
        got = native.prepared_fc_rows(w, bias, None, 0.0, 0.0)(x)
        assert_close(got, _reference(x, w, bias, None), what=f"rows {rows} k {k} n {n} bias {bias is not None}")


@pytest.mark.parametrize("act", list(ACT_PARAMS))
def test_fc_rows_fused_activation(act, pool_threads):
    x = RNG.standard_normal((3, 19)).astype(np.float32)
    w = RNG.standard_normal((19, 45)).astype(np.float32)  # a whole tile, a partial one, 5 columns alone
    b = RNG.standard_normal(45).astype(np.float32)
    got = native.prepared_fc_rows(w, b, act, *ACT_PARAMS[act])(x)
    assert_close(got, _reference(x, w, b, act), what=act)


def test_fc_rows_threaded_split_of_a_large_product(pool_threads):
    """8 x 300 x 131 multiply-adds: over the kernel's threshold, so at 2 threads the column tiles
    go to the pool, the last (with the 3 columns past the vectors) included."""
    x = RNG.standard_normal((8, 300)).astype(np.float32)
    w = RNG.standard_normal((300, 131)).astype(np.float32)
    b = RNG.standard_normal(131).astype(np.float32)
    assert_close(native.prepared_fc_rows(w, b, "relu", 0.0, 0.0)(x), _reference(x, w, b, "relu"))


def test_fc_rows_shapes_it_takes_and_refuses(native_lib):
    w = RNG.standard_normal((6, 10)).astype(np.float32)
    call = native.prepared_fc_rows(w, None, None, 0.0, 0.0)
    x3 = RNG.standard_normal((1, 2, 6)).astype(np.float32)  # rank 3: rows over the leading axes
    assert_close(call(x3), _reference(x3, w, None, None))
    xt = RNG.standard_normal((6, 2)).astype(np.float32).T  # not contiguous: copied, same answer
    assert_close(call(xt), _reference(np.ascontiguousarray(xt), w, None, None))
    assert call(RNG.standard_normal((9, 6)).astype(np.float32)) is None  # more rows than it takes
    assert call(RNG.standard_normal((2, 6))) is None  # float64
    assert call(RNG.standard_normal((2, 5)).astype(np.float32)) is None  # K differs
    assert native.prepared_fc_rows(np.zeros((1024, 129), np.float32), None, None, 0.0, 0.0) is None  # too large


def test_fully_connected_step_runs_fc_rows(native_lib, monkeypatch):
    """A bound FullyConnected step on one row (a Loop body's GRU gate) makes the few-row call once
    and keeps it while the same weights come back; its answer is the float64 one."""
    made = []
    real = native.prepared_fc_rows

    def counted(*args):
        made.append(args)
        return real(*args)

    monkeypatch.setattr(native, "prepared_fc_rows", counted)
    w = RNG.standard_normal((23, 37)).astype(np.float32)
    b = RNG.standard_normal((1, 37)).astype(np.float32)  # a [1, N] bias taken as [N]
    attrs = StepAttrs({"activation": "sigmoid", "activation_alpha": 0.0, "activation_beta": 0.0})
    for _ in range(3):
        x = RNG.standard_normal((1, 23)).astype(np.float32)
        (y,) = fully_connected([x, w, b], attrs)
        assert_close(y, _reference(x, w, b.reshape(-1), "sigmoid"))
    assert len(made) == 1


def test_small_plain_layer_takes_fc_rows(native_lib, monkeypatch):
    """A small layer with nothing fused (a decoder's 96x30 logits) takes the few-row kernel too:
    through the fast call path its one C call beats numpy's product and bias Add."""
    made = []
    real = native.prepared_fc_rows
    monkeypatch.setattr(native, "prepared_fc_rows", lambda *a: made.append(a) or real(*a))
    w = RNG.standard_normal((96, 30)).astype(np.float32)
    x = RNG.standard_normal((1, 96)).astype(np.float32)
    attrs = StepAttrs({})
    for _ in range(2):
        (y,) = fully_connected([x, w, None], attrs)
        assert_close(y, _reference(x, w, None, None))
    assert len(made) == 1



@pytest.mark.parametrize("rows,k,n", [(1, 1, 1), (3, 7, 5), (4, 96, 300), (5, 13, 15), (16, 128, 16), (17, 5, 3),
                                      (32, 128, 512), (33, 1000, 10), (61, 1100, 37), (200, 64, 64), (7, 31, 1025)])
def test_gemm_fc_matches_float64(rows, k, n, pool_threads):
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    for bias in (b, None):
        got = native.prepared_fc(w, bias, None, 0.0, 0.0)(x)
        assert_close(got, _reference(x, w, bias, None), what=f"rows {rows} k {k} n {n} bias {bias is not None}")


@pytest.mark.parametrize("act", list(ACT_PARAMS))
@pytest.mark.parametrize("rows,n", [(2, 45), (19, 7), (40, 100)])
def test_gemm_fc_fused_activation(act, rows, n, pool_threads):
    x = RNG.standard_normal((rows, 19)).astype(np.float32)
    w = RNG.standard_normal((19, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    got = native.prepared_fc(w, b, act, *ACT_PARAMS[act])(x)
    assert_close(got, _reference(x, w, b, act), what=f"{act} rows {rows} n {n}")


def test_gemm_fc_shapes_it_takes_and_refuses(native_lib):
    w = RNG.standard_normal((6, 10)).astype(np.float32)
    call = native.prepared_fc(w, None, None, 0.0, 0.0)
    x3 = RNG.standard_normal((2, 9, 6)).astype(np.float32)  # rank 3: rows over the leading axes
    assert_close(call(x3), _reference(x3, w, None, None))
    xt = RNG.standard_normal((6, 20)).astype(np.float32).T  # not contiguous: copied, same answer
    assert_close(call(xt), _reference(np.ascontiguousarray(xt), w, None, None))
    assert call(np.zeros((0, 6), np.float32)).shape == (0, 10)
    assert call(RNG.standard_normal((20, 6))) is None  # float64
    assert call(RNG.standard_normal((20, 5)).astype(np.float32)) is None  # K differs


def test_fully_connected_step_on_many_rows_runs_the_gemm_fc(native_lib, monkeypatch):
    """A bound FullyConnected step on 16 rows or more (a transformer's layer on its tokens) makes the
    GEMM's call once and keeps it while the same weights come back; its answer is the float64 one,
    GELU fused."""
    made = []
    real = native.prepared_fc

    def counted(*args):
        made.append(args)
        return real(*args)

    monkeypatch.setattr(native, "prepared_fc", counted)
    w = RNG.standard_normal((64, 200)).astype(np.float32)
    b = RNG.standard_normal(200).astype(np.float32)
    attrs = StepAttrs({"activation": "gelu", "activation_alpha": 0.0, "activation_beta": 0.0})
    for rows in (16, 32, 16):
        x = RNG.standard_normal((2, rows // 2, 64)).astype(np.float32)
        (y,) = fully_connected([x, w, b], attrs)
        assert_close(y, _reference(x, w, b, "gelu"))
    assert len(made) == 1


def test_gemm_fc_on_a_packed_weight_every_variant(lanes, native_lib):
    """The weight packed once (``optcli_fc_pack_f32``) for the variant in use gives the float64
    product on shapes over several column bands and K blocks, at 1 and 2 threads; packed for one
    variant and run on another (the panel width differs) it is not read, and the answer is the
    same."""
    old_threads = native.set_num_threads(1)
    try:
        for threads in (1, 2):
            native.set_num_threads(threads)
            for rows, k, n in [(16, 128, 16), (33, 700, 97), (64, 130, 512), (200, 31, 33)]:
                x = RNG.standard_normal((rows, k)).astype(np.float32)
                w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
                b = RNG.standard_normal(n).astype(np.float32)
                call = native.prepared_fc(w, b, "relu", 0.0, 0.0)
                assert_close(call(x), _reference(x, w, b, "relu"),
                             what=f"{lanes} lanes, {threads} threads: rows {rows} k {k} n {n}")
        for other in (4, 8, 16):
            if other != lanes and native_lib._lib.optcli_gemm_variant(other) == other:
                assert_close(call(x), _reference(x, w, b, "relu"), what=f"packed for {lanes} lanes, run on {other}")
    finally:
        native.set_num_threads(old_threads)


def test_gemm_fc_packs_only_weights_it_may_copy(native_lib, monkeypatch):
    """A weight over FC_PACK_MAX_WEIGHTS is not copied into panels (its memory again): the GEMM packs
    per call, with the same answer."""
    from optcli.native import fc_rows

    monkeypatch.setattr(fc_rows, "FC_PACK_MAX_WEIGHTS", 100)
    w = RNG.standard_normal((20, 40)).astype(np.float32)
    assert fc_rows._packed(w) == (None, 0)
    x = RNG.standard_normal((33, 20)).astype(np.float32)
    assert_close(native.prepared_fc(w, None, None, 0.0, 0.0)(x), _reference(x, w, None, None))
