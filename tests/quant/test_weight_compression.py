"""Weight-only compression (int8/int16 per output channel, fp16): sizes, accuracy, both targets."""

from __future__ import annotations

import numpy as np
import pytest

import optcli
from optcli.errors import NbFormatError
from optcli.ops.weight_quant import dequantize, quantize
from optcli.tolerance import RELATIVE, max_error
from optcli.zoo import build, sample_inputs


@pytest.fixture(scope="module")
def mobilenet():
    # Full width (real parameter count), small input: sizes are the real model's.
    model = build("mobilenet_v2", full=True, resolution=64)
    base = optcli.optimize(model=model)
    feeds = sample_inputs(model)
    return model, base, feeds, optcli.load(base.data).run(feeds)["output"]


@pytest.mark.parametrize("kwargs, max_ratio, budget", [
    ({"quant_type": "QUANT_INT8"}, 0.27, RELATIVE["int8"]),
    ({"quant_type": "QUANT_INT16"}, 0.52, 1e-3),
    ({"enable_fp16": True}, 0.52, RELATIVE["fp16"]),
])
def test_size_and_accuracy(mobilenet, kwargs, max_ratio, budget):
    model, base, feeds, reference = mobilenet
    result = optcli.optimize(model=model, **kwargs)
    assert len(result.data) <= max_ratio * len(base.data), len(result.data) / len(base.data)
    err, scale = max_error(optcli.load(result.data).run(feeds)["output"], reference)
    assert err / scale <= budget


@pytest.mark.opencl
def test_compressed_weights_on_the_gpu(mobilenet):
    model, _, feeds, reference = mobilenet
    result = optcli.optimize(model=model, valid_targets="opencl,arm", quant_type="QUANT_INT8")
    out = optcli.load(result.data, require_gpu=True).run(feeds)["output"]
    err, scale = max_error(out, reference)
    assert err / scale <= RELATIVE["int8"]


def test_report_counts_stored_bytes(mobilenet):
    model = mobilenet[0]
    sizes = optcli.optimize(model=model, quant_type="QUANT_INT8").report["sizes"]
    assert sizes["weights_by_dtype"]["int8"] > 10 * sizes["weights_by_dtype"].get("float32", 0)


@pytest.mark.parametrize("scheme, axis", [("int8", 0), ("int16", 1), ("fp16", 0)])
def test_quantize_round_trip(scheme, axis):
    w = np.random.default_rng(0).standard_normal((6, 5, 3, 3)).astype(np.float32)
    w[2] = 0  # an all-zero channel keeps a valid scale
    stored, scales = quantize(w, scheme, axis)
    back = dequantize(stored, scheme, axis, scales)
    step = {"int8": 1 / 127, "int16": 1 / 32767, "fp16": 1e-3}[scheme]
    assert np.max(np.abs(back - w)) <= step * np.abs(w).max() + 1e-7


def test_bad_scales_in_the_file_are_refused(mobilenet):
    import hashlib

    import msgpack

    from optcli.nb.layout import HEADER, HEADER_SIZE, MAGIC, align

    data = optcli.optimize(model=build("mobilenet_v2", resolution=32, width=0.25), quant_type="QUANT_INT8").data
    _, _, _, _, _, body_len, blob_off, blob_len = HEADER.unpack_from(data)
    body = msgpack.unpackb(data[HEADER_SIZE:HEADER_SIZE + body_len])
    quantized = next(w for w in body["weights"] if "quant" in w)
    quantized["quant"]["scales"] = quantized["quant"]["scales"][:-1]
    packed = msgpack.packb(body, use_bin_type=True)
    off = align(HEADER_SIZE + len(packed))
    rebuilt = HEADER.pack(MAGIC, 1, 0, b"0.1.0", HEADER_SIZE, len(packed), off, blob_len) + packed + \
        b"\0" * (off - HEADER_SIZE - len(packed)) + data[blob_off:blob_off + blob_len]
    with pytest.raises(NbFormatError, match="scales do not match"):
        optcli.load(rebuilt + hashlib.sha256(rebuilt).digest())
