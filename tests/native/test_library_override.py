"""``OPTCLI_NATIVE_LIBRARY``, the testing hook that loads another build of the library (the sanitized
one of tools/sanitize_native.py): it is loaded and checked like the packaged one, a path that is not
there is never silently replaced by the packaged library, and ``OPTCLI_NATIVE=0`` still wins.  Each
case loads in a child process: a library loaded here, even one refused, would stay in this process,
where threadpoolctl (matching the ``_optcli_native`` prefix) would find it."""

from __future__ import annotations

import _ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from optcli.native import library

ROOT = Path(__file__).resolve().parents[2]
CHILD = "import json; from optcli import native; print(json.dumps([native.available(), native.status()]))"


def _status_in_child(**env: str) -> tuple[bool, str]:
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert res.returncode == 0, res.stderr
    available, status = json.loads(res.stdout.strip().splitlines()[-1])
    return available, status


def test_the_named_library_is_loaded_instead(native_lib, tmp_path):
    copy = tmp_path / "_optcli_native_copy.so"
    shutil.copy(library.library_path(), copy)
    available, status = _status_in_child(OPTCLI_NATIVE_LIBRARY=str(copy))
    assert available and status.startswith(f"native host kernels: loaded {copy}"), status


def test_optcli_native_0_wins(tmp_path):
    available, status = _status_in_child(OPTCLI_NATIVE="0", OPTCLI_NATIVE_LIBRARY=str(tmp_path / "x.so"))
    assert not available and "disabled by OPTCLI_NATIVE=0" in status


def test_a_missing_file_is_not_replaced_by_the_packaged_library(tmp_path):
    available, status = _status_in_child(OPTCLI_NATIVE_LIBRARY=str(tmp_path / "_optcli_native_gone.so"))
    assert not available and "does not exist" in status


def test_it_is_checked_like_the_packaged_one(tmp_path):
    """A library without the ABI's symbols (here Python's own _ctypes) is refused; so is a file whose
    name threadpoolctl would not match."""
    impostor = tmp_path / "_optcli_native_impostor.so"
    shutil.copy(_ctypes.__file__, impostor)
    available, status = _status_in_child(OPTCLI_NATIVE_LIBRARY=str(impostor))
    assert not available and "failed to load" in status and "optcli_native_abi" in status
    available, status = _status_in_child(OPTCLI_NATIVE_LIBRARY=str(shutil.copy(impostor, tmp_path / "other.so")))
    assert not available and "must start with _optcli_native" in status
