"""The private on-disk cache folder shared by the GPU backends: OpenCL program binaries
(``opencl/program_cache.py``), tuning results (``opencl/tuning.py``) and Metal binary archives
(``metal/device.py``).

All live in a per-user directory (``$OPTCLI_CACHE_DIR``, else ``$XDG_CACHE_HOME/optcli``, else
``~/.cache/optcli``), created owner-only (0700).  The caches trust nothing they did not write: a
symlinked or foreign directory is not used, one that others could write to is tightened and
emptied, and an entry is read only when it is a regular file of this user that others cannot
write.
Entries are keyed by everything that changes the result: the program source (which holds the
defines), build options, device name, driver and platform version, and the optcli version.
Each entry carries a SHA-256 of its payload and one that does not match is rebuilt, never
trusted.  Writes go to a temporary file and are renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import warnings
from pathlib import Path

_MAGIC = b"OPTCLIBIN1"


def cache_root() -> Path:
    env = os.environ.get("OPTCLI_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "optcli"


_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _mine(info: os.stat_result) -> bool:
    return not hasattr(os, "getuid") or info.st_uid == os.getuid()


def private_dir(path: Path) -> Path | None:
    """Create ``path`` owner-only; None (with a warning) when it is unsafe to use.

    Refused: a symbolic link (it could point anywhere, e.g. into another user's folder), a
    directory of another user.  A directory others could write to is tightened to 0700, and
    the entries already in it are discarded: anyone could have put them there.
    """
    if path.is_symlink():
        warnings.warn(f"optcli: cache directory {path} is a symbolic link; caching disabled", stacklevel=3)
        return None
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(path)
    except OSError as exc:
        warnings.warn(f"optcli: cache directory {path} is not usable ({exc.strerror}); caching disabled",
                      stacklevel=3)
        return None
    if not stat.S_ISDIR(info.st_mode) or not _mine(info):
        warnings.warn(f"optcli: cache directory {path} is not a directory of this user; caching disabled",
                      stacklevel=3)
        return None
    if info.st_mode & _OTHERS_WRITE:
        try:
            os.chmod(path, 0o700)
        except OSError:
            warnings.warn(f"optcli: cache directory {path} is writable by others; caching disabled", stacklevel=3)
            return None
        _discard_entries(path)
    return path


def _discard_entries(path: Path) -> None:
    """Remove every entry but the directories below (each tightened when used): files, links, and
    anything else another user could have planted (a FIFO on which an open would block, a socket)."""
    for entry in path.iterdir():
        try:
            if not stat.S_ISDIR(os.lstat(entry).st_mode):
                entry.unlink()
        except OSError:
            pass  # not ours to remove: read_entry refuses it anyway


def write_entry(path: Path, payload: bytes) -> bool:
    """Write atomically; False (nothing written) when the folder is read-only or full."""
    data = _MAGIC + hashlib.sha256(payload).digest() + payload
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def read_entry(path: Path) -> bytes | None:
    """The payload, or None when missing, damaged, or not trustworthy.

    Trusted only: a regular file (not a link), owned by this user, not writable by others,
    whose SHA-256 matches.  A damaged entry of ours is removed.
    """
    try:
        # lstat first: opening a FIFO planted under an entry's (predictable) name would block for ever.
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        # Non-blocking and not through a link all the same: the entry can be swapped after the lstat.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or not _mine(info) or info.st_mode & _OTHERS_WRITE:
            return None
        data = f.read()
    head = len(_MAGIC) + 32
    intact = len(data) >= head and data.startswith(_MAGIC)
    if not intact or hashlib.sha256(data[head:]).digest() != data[len(_MAGIC):head]:
        try:
            path.unlink()
        except OSError:
            pass
        return None
    return data[head:]
