"""The .nb container: round trip, determinism, zero-copy weights, and clear errors on damage."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

import optcli
from optcli.errors import NbFormatError
from optcli.nb.layout import ALIGN, CHECKSUM_SIZE, FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC
from optcli.nb.reader import load_bytes, load_file
from optcli.runtime.load_checks import check_at_load


def _reseal(data: bytes) -> bytes:
    """Recompute the checksum after an edit, to reach the checks behind it."""
    body = data[:-CHECKSUM_SIZE]
    return body + hashlib.sha256(body).digest()


def test_round_trip_preserves_plan(small_cnn):
    _, result, _ = small_cnn
    plan, header = load_bytes(result.data)
    assert header["format_version"] == 1  # no compiled If/Loop/Scan body: the oldest format that holds it
    assert header["tool_version"] == optcli.__version__
    assert [s.kernel for s in plan.steps] == [s.kernel for s in result.plan.steps]
    assert sorted(plan.weights) == sorted(result.plan.weights)
    for name, w in result.plan.weights.items():
        np.testing.assert_array_equal(plan.weights[name], w)
    assert plan.memory.arena_bytes == result.plan.memory.arena_bytes


def test_same_input_gives_identical_bytes(small_cnn):
    model, result, _ = small_cnn
    again = optcli.optimize(model=model)
    assert again.data == result.data


def test_weights_are_aligned_and_mapped_without_copy(small_nb):
    plan, header = load_file(small_nb)
    assert header["blob_offset"] % ALIGN == 0
    for w in plan.weights.values():
        assert not w.flags.owndata and not w.flags.writeable
        assert w.ctypes.data % ALIGN == 0 or w.size == 0


def test_header_layout(small_cnn):
    data = small_cnn[1].data
    magic, version, flags, tool, body_off, body_len, blob_off, blob_len = HEADER.unpack_from(data)
    assert magic == MAGIC and version == 1 and flags == 0 and body_off == HEADER_SIZE
    assert blob_off + blob_len + CHECKSUM_SIZE == len(data)


@pytest.mark.parametrize("cut", [0, 10, HEADER_SIZE, HEADER_SIZE + 5, -CHECKSUM_SIZE - 1, -1])
def test_truncated_file_is_a_clear_error(small_cnn, cut):
    data = small_cnn[1].data
    with pytest.raises(NbFormatError):
        load_bytes(data[:cut])


def test_bit_flip_is_caught_by_checksum(small_cnn):
    data = bytearray(small_cnn[1].data)
    data[len(data) // 2] ^= 0x10
    with pytest.raises(NbFormatError, match="checksum"):
        load_bytes(bytes(data))


def test_future_version_names_both_versions(small_cnn):
    data = bytearray(small_cnn[1].data)
    struct.pack_into("<I", data, 8, FORMAT_VERSION + 1)
    with pytest.raises(NbFormatError, match=f"version {FORMAT_VERSION + 1}.*reads versions 1 to {FORMAT_VERSION}"):
        load_bytes(_reseal(bytes(data)))


def test_bad_magic(small_cnn):
    data = b"NOTANB!!" + small_cnn[1].data[8:]
    with pytest.raises(NbFormatError, match="not an optcli .nb file"):
        load_bytes(data)


def test_malformed_body_is_rejected_after_checksum(small_cnn):
    data = bytearray(small_cnn[1].data)
    # Overwrite the start of the msgpack body with a msgpack integer: a body that is not a map.
    data[HEADER_SIZE] = 0x05
    with pytest.raises(NbFormatError):
        load_bytes(_reseal(bytes(data)))


def test_unknown_kernel_is_rejected(small_cnn):
    import msgpack

    from optcli.nb.layout import align

    data = small_cnn[1].data
    _, _, _, _, _, body_len, blob_off, blob_len = HEADER.unpack_from(data)
    body = msgpack.unpackb(data[HEADER_SIZE:HEADER_SIZE + body_len])
    body["steps"][0]["kernel"] = "onnx.Conv.from_the_future"
    new_body = msgpack.packb(body, use_bin_type=True)
    new_blob_off = align(HEADER_SIZE + len(new_body))
    header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, b"0.1.0", HEADER_SIZE, len(new_body), new_blob_off, blob_len)
    rebuilt = header + new_body + b"\0" * (new_blob_off - HEADER_SIZE - len(new_body)) + \
        data[blob_off:blob_off + blob_len]
    plan, _ = load_bytes(rebuilt + hashlib.sha256(rebuilt).digest())  # the form is fine: the reader takes it
    with pytest.raises(NbFormatError, match="does not have"):
        check_at_load(plan, "<bytes>")  # this optcli has no such kernel
    with pytest.raises(NbFormatError, match="does not have"):
        optcli.load(rebuilt + hashlib.sha256(rebuilt).digest())


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(NbFormatError, match="no such file"):
        load_file(tmp_path / "nope.nb")
    (tmp_path / "empty.nb").write_bytes(b"")
    with pytest.raises(NbFormatError, match="empty"):
        load_file(tmp_path / "empty.nb")
    with pytest.raises(NbFormatError, match="directory"):
        load_file(tmp_path)


def test_scalar_weights_keep_rank_zero():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(3.0, np.float32), "s")])
    data = optcli.optimize(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                           disabled_passes={"fold_constants"}).data
    plan, _ = load_bytes(data)
    assert plan.weights["s"].shape == ()
