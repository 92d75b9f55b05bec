"""The long `.nb` fuzz run: a short fixed budget on every test run, as long as you ask for.

    OPTCLI_FUZZ_EXAMPLES=100000 .venv/bin/pytest tests/reliability/test_fuzz_long.py -q

runs each test below for that many hypothesis examples (a few ms each); unset, each runs
``DEFAULT_EXAMPLES`` (CI's budget: a few seconds in all).  Every file is checked by
``nbfuzz.load_run_or_clear_error``: the reader gives NbFormatError or a plan, under the hang
guard and the allocation bound, and a file that loads is loaded by the runtime and run on a
small input, which must give a result (on the GPU, the host's) or an OptError.  Hypothesis keeps
failing examples in ``.hypothesis/`` and replays them first.
"""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optcli.nb.layout import CHECKSUM_SIZE, HEADER_SIZE
from tests.reliability.nbfuzz import body_paths, load_run_or_clear_error, parts, rebuild, replaced, reseal, seed_models

DEFAULT_EXAMPLES = 50
EXAMPLES = int(os.environ.get("OPTCLI_FUZZ_EXAMPLES", "0") or 0) or DEFAULT_EXAMPLES
# A fixed seed for the default budget (every run checks the same files); a long run explores.
LONG = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES == DEFAULT_EXAMPLES,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=12)
    | st.binary(max_size=24),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
HEADERS = [b"\xdc", b"\xdd", b"\xde", b"\xdf", b"\xd9", b"\xda", b"\xdb", b"\xc4", b"\xc5", b"\xc6", b"\xc7", b"\xd4"]


@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    return seed_models()


@LONG
@given(data=st.data())
def test_long_byte_mutations(seeds, data):
    raw = bytearray(seeds[data.draw(st.sampled_from(sorted(seeds)))][:-CHECKSUM_SIZE])
    for _ in range(data.draw(st.integers(1, 12))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate"]))
        if kind == "set":
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del raw[pos:pos + data.draw(st.integers(1, 16))]
        elif pos > HEADER_SIZE:
            del raw[pos:]
        if not raw:
            break
    load_run_or_clear_error(reseal(bytes(raw)) if data.draw(st.booleans()) else bytes(raw))


@LONG
@given(data=st.data())
def test_long_structured_body_mutations(seeds, data):
    body, blob = parts(seeds[data.draw(st.sampled_from(sorted(seeds)))])
    for _ in range(data.draw(st.integers(1, 4))):
        paths = list(body_paths(body))
        body = replaced(body, data.draw(st.sampled_from(paths)), data.draw(msgpack_values))
    load_run_or_clear_error(rebuild(body, blob))


@LONG
@given(data=st.data())
def test_long_inflated_headers_in_the_body(seeds, data):
    """A msgpack length header with a huge (or just wrong) count spliced into a real body."""
    body, blob = parts(seeds[data.draw(st.sampled_from(sorted(seeds)))])
    packed = bytearray(msgpack.packb(body, use_bin_type=True))
    pos = data.draw(st.integers(0, len(packed) - 1))
    head = data.draw(st.sampled_from(HEADERS))
    width = {0xdc: 2, 0xde: 2, 0xda: 2, 0xc5: 2, 0xd9: 1, 0xc4: 1, 0xc7: 1, 0xd4: 1}.get(head[0], 4)
    count = data.draw(st.integers(0, 2 ** (8 * width) - 1))
    packed[pos:pos + data.draw(st.integers(0, 6))] = head + count.to_bytes(width, "big")
    load_run_or_clear_error(rebuild(None, blob, raw_body=bytes(packed)))


# Each window attribute's length in 2-D, and values mostly in its plausible range, sometimes any small int.
WINDOW_ATTRIBUTES = {"pads": (4, st.integers(0, 4)), "strides": (2, st.integers(1, 4)),
                     "dilations": (2, st.integers(1, 3)), "kernel_shape": (2, st.integers(1, 5))}


@LONG
@given(data=st.data())
def test_long_window_attributes(seeds, data):
    """The `native` seed's convs and pooling with small hostile window attributes (and group), its input
    at another spatial size, the recorded shapes of the values it derives kept or dropped: the load
    checks refuse what does not fit, and what they let through (a few percent) runs the native kernels on
    geometry no test wrote; under tools/sanitize_native.py, ASan and UBSan watch those calls."""
    body, blob = parts(seeds["native"])
    windows = [s for s in body["steps"] if s["op"] in ("Conv", "MaxPool")]
    for _ in range(data.draw(st.integers(1, 3))):
        attrs = data.draw(st.sampled_from(windows))["attrs"]
        name = data.draw(st.sampled_from([*WINDOW_ATTRIBUTES, "group"]))
        if name == "group":
            attrs[name] = data.draw(st.integers(-1, 17))
        else:  # mostly of the right length
            size, plausible = WINDOW_ATTRIBUTES[name]
            size = data.draw(st.sampled_from([size] * 3 + [1, 3]))
            attrs[name] = data.draw(st.lists(plausible | st.integers(-2, 40), min_size=size, max_size=size))
    if data.draw(st.booleans()):
        body["inputs"][0]["shape"][2:] = data.draw(st.lists(st.integers(1, 24), min_size=2, max_size=2))
    if data.draw(st.booleans()):
        for value in body["values"]:
            if value["name"] != body["inputs"][0]["name"]:
                value["shape"] = None
    load_run_or_clear_error(rebuild(body, blob))
