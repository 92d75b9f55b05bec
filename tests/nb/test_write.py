"""Writing outputs: atomic, every failure an OutputError naming the path (exit 2), and the
leftovers of killed runs removed on the next write to the folder."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from optcli.cli import opt_main
from optcli.errors import OptError, OutputError
from optcli.nb import writer
from tests.helpers import run_cli, single_node_model


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_full_disk_is_an_output_error_and_leaves_nothing(tmp_path, monkeypatch):
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OutputError, match="cannot write .*m.nb: No space left on device") as exc:
        writer.write_atomic(b"data", tmp_path / "m.nb")
    assert isinstance(exc.value, OptError) and exc.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_folder_that_is_a_file_is_an_output_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="cannot write"):
        writer.write_atomic(b"data", tmp_path / "file" / "m.nb")


def test_stale_temporaries_of_dead_runs_are_removed(tmp_path):
    dead = tmp_path / f".m.nb.{_dead_pid()}.abcd.tmp"
    mine = tmp_path / f".m.nb.{os.getpid()}.efgh.tmp"  # a write in progress in this process
    other = tmp_path / "notes.tmp"  # not ours
    for f in (dead, mine, other):
        f.write_bytes(b"partial")
    writer.write_atomic(b"data", tmp_path / "m.nb")
    assert not dead.exists() and mine.exists() and other.exists()
    assert (tmp_path / "m.nb").read_bytes() == b"data"


def test_opt_reports_an_unwritable_output_with_exit_2(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(single_node_model("Relu", {"x": np.zeros((2, 3), np.float32)}).SerializeToString())
    (tmp_path / "blocker").write_text("a file where a folder should be")
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={model}", f"--optimize_out={tmp_path}/blocker/m"], capsys)
    assert code == 2 and "cannot write" in err and "internal error" not in err, err
