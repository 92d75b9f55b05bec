"""Fuzzing the `.nb` reader (short run, part of CI; the long run is ``test_fuzz_long.py``).

Extends ``tests/nb/test_fuzz.py`` (truncation at every offset, resealed byte mutations, wrong
types via hypothesis, inflated fields, deep nesting).  Here every load also runs under the hang
guard and the allocation bound of ``nbfuzz.load_or_clear_error``, and the mutations cover the
rest of the list: wrong types at *every* path of the body, future format versions with a valid
checksum, checksum mismatches, unsealed bit flips, and msgpack headers claiming huge counts.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optcli.errors import NbFormatError
from optcli.nb.layout import CHECKSUM_SIZE, FORMAT_VERSION, HEADER_SIZE
from optcli.nb.reader import load_bytes
from tests.reliability.nbfuzz import (
    body_paths,
    load_or_clear_error,
    load_run_or_clear_error,
    parts,
    rebuild,
    replaced,
    reseal,
    seed_models,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WRONG = [None, True, -1, 2**64 - 1, -(2**63), 1.5, float("nan"), "", "x" * 40, b"\x80\x03", [], [None], {},
         {"k": 1}, [[[[[[1]]]]]]]


@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    return seed_models()


def test_seeds_load_and_cover_gpu_steps(seeds):
    for data in seeds.values():
        assert load_or_clear_error(data) == "ok"
    plan, _ = load_bytes(seeds["opencl"])
    assert any(s.target == "opencl" for s in plan.steps)
    assert any(s.proto for s in load_bytes(seeds["arm"])[0].steps), "the arm seed needs a fallback step"


@pytest.mark.parametrize("seed", ["arm", "opencl", "native"])
def test_wrong_msgpack_type_at_every_level(seeds, seed):
    """Each path of the body (the root, every map, list and scalar) replaced by values of
    every other msgpack type; every file that loads is run on a small input, which must give a
    result (on the GPU, the host's) or an OptError: never another exception (before, a file with
    ``outputs[0].name = ""`` loaded and its run raised a KeyError, and wrongly typed attributes
    a KernelError that blamed optcli)."""
    body, blob = parts(seeds[seed])
    paths = list(body_paths(body))
    assert len(paths) > 50
    outcomes: dict[str, int] = {}
    for path in paths:
        for value in WRONG:
            outcome = load_run_or_clear_error(rebuild(replaced(body, path, value), blob), measure_memory=False)
            kind = outcome if outcome == "ran" else "refused"
            outcomes[kind] = outcomes.get(kind, 0) + 1
    assert outcomes.get("refused") and outcomes.get("ran", 0) > 100, outcomes


def test_an_output_with_an_empty_name_is_refused_at_load(seeds):
    body, blob = parts(seeds["opencl"])
    body["outputs"][0]["name"] = ""
    assert "outputs[0]: empty name" in load_or_clear_error(rebuild(body, blob))


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 7, 2**31, 2**32 - 1])
def test_future_and_past_format_versions_with_valid_checksum(seeds, version):
    data = bytearray(seeds["arm"])
    struct.pack_into("<I", data, 8, version)
    message = load_or_clear_error(reseal(bytes(data[:-CHECKSUM_SIZE])))
    assert f"version {version}" in message and f"reads versions 1 to {FORMAT_VERSION}" in message


def test_checksum_mismatch_in_every_checksum_byte(seeds):
    data = seeds["arm"]
    for i in range(len(data) - CHECKSUM_SIZE, len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x01
        assert "checksum mismatch" in load_or_clear_error(bytes(damaged), measure_memory=False)


@FUZZ
@given(data=st.data())
def test_unsealed_bit_flips_are_caught(seeds, data):
    raw = bytearray(seeds[data.draw(st.sampled_from(["arm", "opencl"]))])
    for _ in range(data.draw(st.integers(1, 4))):
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    outcome = load_or_clear_error(bytes(raw))
    assert outcome != "ok" or bytes(raw) == seeds["arm"] or bytes(raw) == seeds["opencl"]


@FUZZ
@given(data=st.data())
def test_resealed_mutations_within_bounds(seeds, data):
    """Random overwrites, insertions and deletions in the header and body, checksum recomputed,
    under the time and memory guards."""
    raw = bytearray(seeds[data.draw(st.sampled_from(["arm", "opencl"]))][:-CHECKSUM_SIZE])
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if kind == "set":
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[pos:pos + data.draw(st.integers(1, 8))]
    load_or_clear_error(reseal(bytes(raw)))


def _huge_headers(n_body: int) -> list[bytes]:
    """msgpack documents whose headers claim far more than the body holds."""
    full = 2**32 - 1
    nested = (b"\xdd" + n_body.to_bytes(4, "big")) * 900  # arrays each claiming the body's size
    return [
        b"\xdd" + full.to_bytes(4, "big"),  # array32 of 4 G items
        b"\xdf" + full.to_bytes(4, "big"),  # map32 of 4 G pairs
        b"\xdb" + full.to_bytes(4, "big") + b"abc",  # str32 of 4 GiB
        b"\xc6" + full.to_bytes(4, "big") + b"abc",  # bin32 of 4 GiB
        b"\x81\xa4name\xdd" + (n_body // 2).to_bytes(4, "big") + b"\xc0" * 16,  # plausible, short
        nested + b"\x00" * (n_body - len(nested)),  # truncated nest: ~900 x n preallocated lists
        b"\x81\xa5steps" + (b"\xdd" + (n_body // 3).to_bytes(4, "big")) * 200 + b"\x90" * (n_body // 2),
    ]


@pytest.mark.parametrize("case", range(7))
def test_inflated_msgpack_counts_allocate_within_the_file_bound(seeds, case):
    _, blob = parts(seeds["arm"])
    raw = _huge_headers(200_000)[case]
    message = load_or_clear_error(rebuild(None, blob, raw_body=raw))
    assert message != "ok"


def test_inflated_counts_inside_a_real_body(seeds):
    """A real body whose `steps` array header is patched to claim more items than follow."""
    body, blob = parts(seeds["arm"])
    packed = bytearray(msgpack.packb(body, use_bin_type=True))
    key = msgpack.packb("steps")
    at = packed.index(key) + len(key)
    assert packed[at] & 0xF0 == 0x90  # a fixarray
    patched = packed[:at] + b"\xdd" + (len(packed)).to_bytes(4, "big") + packed[at + 1:]
    assert load_or_clear_error(rebuild(None, blob, raw_body=bytes(patched))) != "ok"


def test_body_with_trailing_bytes_is_refused(seeds):
    body, blob = parts(seeds["arm"])
    raw = msgpack.packb(body, use_bin_type=True) + b"\xc0"
    assert "extra data" in load_or_clear_error(rebuild(None, blob, raw_body=raw))


def test_header_lengths_inflated(seeds):
    data = seeds["arm"]
    for field, value in ((40, 2**63), (48, 2**63 + 64), (56, 2**64 - 1), (32, 0)):
        damaged = bytearray(data[:-CHECKSUM_SIZE])
        struct.pack_into("<Q", damaged, field, value)
        with pytest.raises(NbFormatError):
            load_bytes(reseal(bytes(damaged)))
    assert HEADER_SIZE == 64
