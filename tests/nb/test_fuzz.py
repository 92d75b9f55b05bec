"""Fuzzing the .nb reader: damaged files give NbFormatError and nothing else.

The checksum is recomputed after each mutation (``_reseal``) so the damage reaches the msgpack
and schema checks behind it, as a deliberately crafted file would.
"""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError
from optcli.nb.layout import CHECKSUM_SIZE, HEADER, HEADER_SIZE, MAGIC, align
from optcli.nb.reader import load_bytes


def _reseal(data: bytes) -> bytes:
    return data + hashlib.sha256(data).digest()


@pytest.fixture(scope="module")
def tiny() -> bytes:
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("Einsum", ["y", "y"], ["z"], equation="nchw,nchw->nchw")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    return optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).data


def _load_ok_or_clear_error(data: bytes) -> None:
    try:
        load_bytes(data)
    except NbFormatError:
        pass


def test_truncation_at_every_offset(tiny):
    for cut in range(len(tiny)):
        with pytest.raises(NbFormatError):
            load_bytes(tiny[:cut])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_resealed_byte_mutations(tiny, data):
    raw = bytearray(tiny[:-CHECKSUM_SIZE])
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    _load_ok_or_clear_error(_reseal(bytes(raw)))


def _rebuild(body: object, blob: bytes) -> bytes:
    packed = msgpack.packb(body, use_bin_type=True)
    blob_off = align(HEADER_SIZE + len(packed))
    header = HEADER.pack(MAGIC, 1, 0, b"0.1.0", HEADER_SIZE, len(packed), blob_off, len(blob))
    return _reseal(header + packed + b"\0" * (blob_off - HEADER_SIZE - len(packed)) + blob)


def _parts(tiny: bytes) -> tuple[dict, bytes]:
    _, _, _, _, _, body_len, blob_off, blob_len = HEADER.unpack_from(tiny)
    return msgpack.unpackb(tiny[HEADER_SIZE:HEADER_SIZE + body_len]), tiny[blob_off:blob_off + blob_len]


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_wrong_types_anywhere_in_the_body(tiny, data):
    body, blob = _parts(tiny)
    # Pick a path into the body and replace what is there with an arbitrary msgpack value.
    node = body
    for _ in range(data.draw(st.integers(0, 4))):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], (dict, list)) or not node[key]:
                break
            node = node[key]
        elif isinstance(node, list) and node:
            idx = data.draw(st.integers(0, len(node) - 1))
            if not isinstance(node[idx], (dict, list)) or not node[idx]:
                break
            node = node[idx]
        else:
            break
    if isinstance(node, dict) and node:
        node[data.draw(st.sampled_from(sorted(node)))] = data.draw(msgpack_values)
    elif isinstance(node, list) and node:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(msgpack_values)
    _load_ok_or_clear_error(_rebuild(body, blob))


@pytest.mark.parametrize("mutate", [
    lambda b: b["weights"][0].update(nbytes=1 << 60),
    lambda b: b["weights"][0].update(offset=3),
    lambda b: b["weights"][0].update(shape=[1 << 40, 1 << 40]),
    # zero elements, but dims numpy cannot form (its reshape raised ValueError: issue 23)
    lambda b: b["weights"][0].update(shape=[0, 1 << 62, 1 << 62], nbytes=0),
    lambda b: b["weights"][0].update(shape=[0, (1 << 64) - 1], nbytes=0),
    # the same in a $tensor attribute (zero bytes of data)
    lambda b: b["steps"][0]["attrs"].update(value={"$tensor": {"dtype": "float32", "shape": [0, 1 << 62, 1 << 62],
                                                               "data": b""}}),
    lambda b: b["steps"][0]["attrs"].update(value={"$tensor": {"dtype": "float32", "shape": [0, (1 << 64) - 1],
                                                               "data": b""}}),
    lambda b: b["inputs"][0].update(shape=[0, (1 << 64) - 1]),
    lambda b: b["steps"][0].update(inputs=["nowhere"]),
    lambda b: b["steps"][-1].update(proto=b"\xff\xff\xff"),
    lambda b: b.update(steps=[b["steps"][0]] * 3),
    lambda b: b["memory"].update(offsets={"x": -5}),
    lambda b: b["inputs"][0].update(shape=list(range(100))),
])
def test_inflated_and_inconsistent_fields(tiny, mutate):
    body, blob = _parts(tiny)
    mutate(body)
    with pytest.raises(NbFormatError):
        load_bytes(_rebuild(body, blob))


def test_deep_nesting_is_refused(tiny):
    _, blob = _parts(tiny)
    # {"name": [[[...1...]]]} 100,000 levels deep, written byte by byte (0x91 = array of one).
    body = b"\x81\xa4name" + b"\x91" * 100_000 + b"\x01"
    blob_off = align(HEADER_SIZE + len(body))
    header = HEADER.pack(MAGIC, 1, 0, b"0.1.0", HEADER_SIZE, len(body), blob_off, len(blob))
    with pytest.raises(NbFormatError):
        load_bytes(_reseal(header + body + b"\0" * (blob_off - HEADER_SIZE - len(body)) + blob))


def test_a_name_with_a_line_break_still_makes_a_one_line_message(tiny):
    """Issue 23: an attribute name holding a newline, quoted in the error, made a two-line message."""
    body, blob = _parts(tiny)
    body["steps"][0]["attrs"]["evil\nname"] = {"$not_a_tensor": 1}
    with pytest.raises(NbFormatError) as exc:
        load_bytes(_rebuild(body, blob))
    message = str(exc.value)
    assert "evil\\nname" in message and "\n" not in message
