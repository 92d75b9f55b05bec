"""Loading a `.nb` never runs code from the file; caches are private and verified.

While files load (and run) here, ``pickle``, ``marshal``, ``eval``, ``exec`` and ``compile`` raise:
a reader that reached for any of them would fail these tests.  Kernel ids outside the runtime's
own library are refused (see also ``tests/nb/test_format.py::test_unknown_kernel_is_rejected``);
the binary cache's private directory and damaged-entry rebuild are tested in
``tests/runtime/test_opencl_runtime.py::test_binary_cache_warm_hit_and_damaged_entry``.
"""

from __future__ import annotations

import builtins
import contextlib
import marshal
import os
import pickle
import stat
import sys
import types
import warnings
from unittest import mock

import numpy as np
import pytest
from onnx import helper

import optcli
from optcli.errors import NbFormatError
from optcli.runtime.gpu_common.disk_cache import private_dir, read_entry, write_entry
from optcli.runtime.opencl.program_cache import ProgramCache
from optcli.runtime.opencl.tuning import Choice, TuningCache
from tests.reliability.nbfuzz import parts, rebuild, seed_models

PAYLOAD = pickle.dumps(types.SimpleNamespace(x=1), protocol=2)  # what a hostile writer might plant


@contextlib.contextmanager
def watching_code_execution(data: bytes):
    """Within the block, record every call that turns bytes or text into running code (pickle,
    marshal, eval, exec, compile) as (function, calling module, whether its argument holds bytes
    of ``data``).  Libraries below us use some of them on their own state (imports compile our
    modules; pyopencl's invoker cache unpickles from its per-user directory), so the tests check
    what matters: no call made by optcli's code, and no call fed with content of the file."""
    calls: list[tuple[str, str, bool]] = []

    def from_file(arg) -> bool:
        if isinstance(arg, str):
            arg = arg.encode("utf-8", "surrogatepass")
        return isinstance(arg, (bytes, bytearray)) and len(arg) >= 4 and bytes(arg) in data

    def watch(name, real):
        def watched(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            calls.append((name, caller, any(from_file(a) for a in args)))
            return real(*args, **kwargs)
        return watched

    targets = [(pickle, n) for n in ("loads", "load")] + [(marshal, n) for n in ("loads", "load")]
    targets += [(builtins, n) for n in ("eval", "exec", "compile")]
    with contextlib.ExitStack() as stack:
        for owner, name in targets:
            stack.enter_context(mock.patch.object(owner, name, watch(f"{owner.__name__}.{name}",
                                                                     getattr(owner, name))))
        yield calls


def assert_no_code_from(calls) -> None:
    """No call by optcli's code, except ``optcli.generated_code`` compiling source it holds to a
    grammar without string literals (its own test below), and no call fed with the file's bytes."""
    ours = [c for c in calls if c[1].startswith("optcli") and c[1] != "optcli.generated_code"]
    fed = [c for c in calls if c[2]]
    assert not ours, f"optcli code called {ours}"
    assert not fed, f"file content reached {fed}"


def _hostile(seed: bytes) -> bytes:
    """A valid file whose strings and bytes look like code: a pickle in an attribute, Python in
    the metadata and names.  All of it must stay data."""
    body, blob = parts(seed)
    body["metadata"]["source"] = "__import__('os').system('touch /tmp/optcli-pwned')"
    body["metadata"]["payload"] = "cos\nsystem\n(S'touch /tmp/optcli-pwned'\ntR."
    for step in body["steps"]:
        step["attrs"]["planted"] = PAYLOAD
    return rebuild(body, blob)


def test_loading_and_running_never_unpickles_or_evaluates():
    seeds = seed_models()
    rng = np.random.default_rng(0)
    for seed in seeds.values():
        data = _hostile(seed)
        with warnings.catch_warnings(), watching_code_execution(data) as calls:
            warnings.simplefilter("ignore")
            p = optcli.load(data)
            # each seed's own input shape (the native seed's image is larger than the others'), named dims 4
            p.run({v.name: rng.standard_normal([d if isinstance(d, int) else 4 for d in v.shape]).astype(np.float32)
                   for v in p.plan.inputs})
            # (the arm seed includes the onnx-reference fallback step, Einsum)
        assert_no_code_from(calls)
        assert p.plan.metadata["payload"].startswith("cos")
        assert p.plan.steps[0].attrs["planted"] == PAYLOAD
    assert not os.path.exists("/tmp/optcli-pwned")


def test_generated_code_refuses_any_string_literal():
    """What a generator writes can hold no text of a file: a quote, a backslash or a comment sign
    ends it before compile, whatever put it there."""
    from optcli.generated_code import GeneratedCodeError, function

    ok = function(["def run(a, b):", "    o = f0([a, b], c1)", "    return {n0: o[0]}"],
                  {"f0": lambda args, c: [sum(args) * c], "c1": 2, "n0": "y"}, "run")
    assert ok(1, 2) == {"y": 6}
    for bad in ["    return __import__('os')", '    return "x"', "    return 1  # note", "    return b\\n",
                "    x = 1; return x", "    return f'{a}'"]:
        with pytest.raises(GeneratedCodeError):
            function(["def run(a, b):", bad], {}, "run")


def test_a_host_plan_runs_generated_code_without_the_files_text():
    """The hostile files' host plans do run as generated functions (else the watch above sees
    nothing of them), and no step name, value name or metadata string is in their source."""
    from optcli import generated_code

    seen = []
    real = generated_code.function

    def recording(lines, namespace, name):
        seen.append("\n".join(lines))
        return real(lines, namespace, name)

    data = _hostile(seed_models()["arm"])
    with mock.patch.object(generated_code, "function", recording):
        p = optcli.load(data)
        feeds = {v.name: np.ones([d if isinstance(d, int) else 4 for d in v.shape], np.float32) for v in p.plan.inputs}
        for _ in range(2):  # (a plan with named dims runs its first call of a shape through the loop)
            p.run(feeds)
    assert seen, "the host plan did not run as a generated function"
    texts = [s.name for s in p.plan.steps] + [n for s in p.plan.steps for n in s.inputs + s.outputs if n]
    texts += [v for v in p.plan.metadata.values() if isinstance(v, str)]
    for source in seen:
        assert not [t for t in texts if len(t) >= 3 and t in source]


def test_the_watch_would_see_a_planted_pickle():
    data = _hostile(seed_models()["arm"])
    with watching_code_execution(data) as calls:
        pickle.loads(PAYLOAD)
    with pytest.raises(AssertionError, match="file content reached"):
        assert_no_code_from(calls)


@pytest.mark.parametrize("kernel", ["os.system.default", "onnx.Conv.__init__", "../../kernels/evil",
                                    "builtins.eval.default", ""])
@pytest.mark.parametrize("seed_name", ["arm", "opencl"])
def test_kernels_outside_the_library_are_refused(kernel, seed_name):
    seed = seed_models()[seed_name]
    body, blob = parts(seed)
    body["steps"][-1]["kernel"] = kernel
    data = rebuild(body, blob)
    with pytest.raises(NbFormatError), watching_code_execution(data) as calls:
        optcli.load(data)
    assert_no_code_from(calls)


def test_fallback_proto_with_a_function_is_data():
    """The reference fallback step's NodeProto is checked against its step; a NodeProto naming a
    local function (code would be its body: more graph data) is refused when it does not match."""
    seed = seed_models()["arm"]
    body, blob = parts(seed)
    step = next(s for s in body["steps"] if s.get("proto"))
    node = helper.make_node("Evil", list(step["inputs"]), list(step["outputs"]), domain="custom")
    step["proto"] = node.SerializeToString()
    data = rebuild(body, blob)
    with pytest.raises(NbFormatError, match="does not match"), watching_code_execution(data) as calls:
        optcli.load(data)
    assert_no_code_from(calls)


# ---------------------------------------------------------------------------------------- caches
class _Device:
    name, driver_version, version = "Test Device", "1.0", "OpenCL 3.0"
    platform = types.SimpleNamespace(version="OpenCL 3.0 test")


def test_cache_directories_are_owner_only(tmp_path):
    ProgramCache(tmp_path / "c")
    TuningCache(_Device(), root=tmp_path / "c")
    for sub in ("", "programs", "tuning"):
        assert stat.S_IMODE((tmp_path / "c" / sub).stat().st_mode) == 0o700, sub


def test_a_cache_directory_others_can_write_is_tightened(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    assert private_dir(d) == d
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def _within(seconds: float, fn):
    """``fn()`` in a daemon thread; fails (instead of hanging the suite) when it is still running."""
    import threading

    result: list = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"blocked for {seconds} s on a planted FIFO"
    return result[0]


def _read_within(seconds: float, path):
    """read_entry in a daemon thread: a read that blocks fails the test instead of hanging the suite."""
    return _within(seconds, lambda: read_entry(path))


def test_a_fifo_planted_under_an_entry_name_neither_hangs_nor_survives(tmp_path):
    """Issue 23: another user plants a FIFO where an entry will be read; the open must not block,
    and tightening a folder others could write removes it with the other planted entries."""
    entry = tmp_path / "programs" / "0123abcd.bin"
    entry.parent.mkdir()
    os.mkfifo(entry)
    assert _read_within(5.0, entry) is None
    planted = tmp_path / "shared"
    planted.mkdir()
    os.mkfifo(planted / "deadbeef.bin")
    (planted / "file.bin").write_bytes(b"x")
    (planted / "sub").mkdir()
    os.chmod(planted, 0o777)
    assert private_dir(planted) == planted
    assert sorted(p.name for p in planted.iterdir()) == ["sub"], "every planted entry but a folder is removed"


def test_a_fifo_planted_as_the_tuning_entry_neither_hangs_nor_is_read(tmp_path):
    """Issue 23, part 4a, through the tuning cache: its entry's name is predictable (the device's key)."""
    TuningCache(_Device(), root=tmp_path)
    path = TuningCache(_Device(), root=tmp_path).path
    os.mkfifo(path)
    cache = _within(5.0, lambda: TuningCache(_Device(), root=tmp_path))
    assert cache.entries == {} and cache.get("conv-key") is None


def test_a_fifo_planted_as_a_program_entry_neither_hangs_nor_is_read(tmp_path, monkeypatch):
    """Issue 23, part 4a, through the program cache (what ``optcli.load`` builds its GPU programs
    through): the build compiles from source instead of blocking on the planted entry."""
    built: list = []

    class Program:
        def __init__(self, context, *args):
            built.append(args)

        def build(self, options=""):
            return self

        def get_info(self, what):
            return [b""]  # no binary: nothing written back

    fake = types.SimpleNamespace(Program=Program, program_info=types.SimpleNamespace(BINARIES=0))
    monkeypatch.setitem(sys.modules, "pyopencl", fake)
    cache = ProgramCache(tmp_path)
    os.mkfifo(cache._path(_Device(), "kernel void k() {}", ""))
    prog, compiled = _within(5.0, lambda: cache.build(None, _Device(), "kernel void k() {}"))
    assert compiled == 1 and built == [("kernel void k() {}",)], "compiled from source, the FIFO not read"


def test_damaged_tuning_entry_is_dropped_and_retuned(tmp_path):
    cache = TuningCache(_Device(), root=tmp_path)
    cache.put("conv-key", Choice("onnx.Conv.direct", (8, 8, 1), 12.5))
    cache.save()
    again = TuningCache(_Device(), root=tmp_path)
    assert again.get("conv-key") == Choice("onnx.Conv.direct", (8, 8, 1), 12.5)
    damaged = bytearray(again.path.read_bytes())
    damaged[-3] ^= 0x20
    again.path.write_bytes(bytes(damaged))
    reloaded = TuningCache(_Device(), root=tmp_path)
    assert reloaded.get("conv-key") is None, "a damaged tuning entry must not be trusted"
    assert not reloaded.path.exists(), "a damaged entry is removed (then written again after tuning)"


def test_tuning_entry_of_the_wrong_shape_is_ignored(tmp_path):
    cache = TuningCache(_Device(), root=tmp_path)
    write_entry(cache.path, b'{"k1": {"kernel": "onnx.Conv.direct", "local_size": ["x"], "time_us": 1},'
                            b' "k2": {"kernel": "onnx.Conv.direct", "local_size": null, "time_us": "slow"},'
                            b' "k3": {"kernel": "onnx.Conv.direct", "local_size": [99999999], "time_us": 1}}')
    loaded = TuningCache(_Device(), root=tmp_path)
    assert [loaded.get(k) for k in ("k1", "k2", "k3")] == [None, None, None]


def test_damaged_binary_entry_reads_as_missing(tmp_path):
    entry = tmp_path / "e.bin"
    write_entry(entry, b"\x7fELF program binary")
    assert read_entry(entry) == b"\x7fELF program binary"
    data = bytearray(entry.read_bytes())
    data[-1] ^= 1
    entry.write_bytes(bytes(data))
    assert read_entry(entry) is None and not entry.exists()


def test_the_nb_attr_types_are_plain_data():
    """The body decoder keeps msgpack extension types out (no object hooks)."""
    seed = seed_models()["arm"]
    body, blob = parts(seed)
    import msgpack

    raw = bytearray(msgpack.packb(body, use_bin_type=True))
    key = msgpack.packb("name")
    at = raw.index(key) + len(key)
    # Replace the graph name's string with an ext type 1 holding a pickle.
    end = at + len(msgpack.packb(body["name"]))
    ext = msgpack.packb(msgpack.ExtType(1, PAYLOAD))
    raw[at:end] = ext
    with pytest.raises(NbFormatError, match="extension type|max_ext_len"):
        optcli.load(rebuild(None, blob, raw_body=bytes(raw)))


def test_inconsistent_recorded_shapes_are_refused_before_the_gpu(tmp_path, monkeypatch):
    """A crafted file whose shapes are each valid but disagree must not reach GPU kernels."""
    import hashlib

    import msgpack
    import numpy as np
    from onnx import TensorProto, helper

    import optcli
    from optcli.errors import NbFormatError
    from optcli.nb.layout import HEADER, HEADER_SIZE, MAGIC, align

    monkeypatch.setenv("OPTCLI_CACHE_DIR", str(tmp_path))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    data = optcli.optimize(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                           valid_targets="opencl,arm", disabled_passes={"keep_small_islands_on_host"}).data
    _, _, _, _, _, body_len, blob_off, blob_len = HEADER.unpack_from(data)
    body = msgpack.unpackb(data[HEADER_SIZE:HEADER_SIZE + body_len])
    for v in body["values"]:
        if v["name"].startswith("y@"):
            v["shape"] = [1, 4, 800, 800]  # a GPU buffer a hundred times larger than its producer fills
    packed = msgpack.packb(body, use_bin_type=True)
    off = align(HEADER_SIZE + len(packed))
    crafted = HEADER.pack(MAGIC, 1, 0, b"0.1.0", HEADER_SIZE, len(packed), off, blob_len) + packed + \
        b"\0" * (off - HEADER_SIZE - len(packed)) + data[blob_off:blob_off + blob_len]
    crafted += hashlib.sha256(crafted).digest()
    with pytest.raises(NbFormatError, match=r"recorded as \[1, 4, 800, 800\] but its step computes \[1, 4, 8, 8\]"):
        optcli.load(crafted)
    p = optcli.load(data)  # the honest file loads; nothing is remembered: every load derives again
    assert p.run({"x": np.zeros((1, 4, 8, 8), np.float32)})["y"].shape == (1, 4, 8, 8)
    assert not (tmp_path / "validated").exists()


def test_entries_found_in_a_directory_others_could_write_are_discarded(tmp_path):
    """Anyone could have planted them while the folder was open: tightening also empties it."""
    d = tmp_path / "shared"
    d.mkdir()
    write_entry(d / "planted.bin", b"a program binary from someone else")
    os.chmod(d, 0o777)
    assert private_dir(d) == d
    assert not (d / "planted.bin").exists()


def test_a_symlinked_cache_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.warns(UserWarning, match="symbolic link"):
        assert private_dir(link) is None
    with pytest.warns(UserWarning, match="symbolic link"):
        assert ProgramCache(link).dir is None


def test_entries_others_can_write_or_links_are_not_trusted(tmp_path):
    entry = tmp_path / "e.bin"
    write_entry(entry, b"payload")
    os.chmod(entry, 0o666)
    assert read_entry(entry) is None, "an entry others can write is not trusted"
    os.chmod(entry, 0o600)
    assert read_entry(entry) == b"payload"
    link = tmp_path / "l.bin"
    link.symlink_to(entry)
    assert read_entry(link) is None, "a link is not followed"


def test_entries_of_another_user_are_not_trusted(tmp_path, monkeypatch):
    entry = tmp_path / "e.bin"
    write_entry(entry, b"payload")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(entry).st_uid + 1)
    assert read_entry(entry) is None


def test_a_read_only_tuning_cache_warns_and_goes_on(tmp_path, monkeypatch):
    cache = TuningCache(_Device(), root=tmp_path)
    cache.put("k", Choice("onnx.Conv.direct", (8, 8, 1), 1.0))

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", read_only)
    with pytest.warns(UserWarning, match="cannot write the tuning cache"):
        cache.save()
    assert cache.get("k") == Choice("onnx.Conv.direct", (8, 8, 1), 1.0)
