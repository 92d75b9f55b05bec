"""The OpenCL program-binary cache (warm start): compiled programs per (source, build options, device,
driver, platform version, optcli version), kept in the private, integrity-checked cache folder of
``runtime/gpu_common/disk_cache.py``."""

from __future__ import annotations

import hashlib
from pathlib import Path

from optcli._version import __version__
from optcli.runtime.gpu_common.disk_cache import cache_root, private_dir, read_entry, write_entry


def device_key(device) -> str:
    return "|".join([device.name.strip(), device.driver_version.strip(), device.platform.version.strip(),
                     device.version.strip(), __version__])


class ProgramCache:
    """Compiled program binaries per (source, options, device, driver, tool version)."""

    def __init__(self, root: Path | None):
        self.dir = private_dir(root / "programs") if root is not None and private_dir(root) else None
        self.hits = 0
        self.misses = 0

    @classmethod
    def default(cls) -> ProgramCache:
        return cls(cache_root())

    def _path(self, device, text: str, options: str) -> Path | None:
        if self.dir is None:
            return None
        key = hashlib.sha256("\0".join([text, options, device_key(device)]).encode()).hexdigest()
        return self.dir / f"{key}.bin"

    def build(self, context, device, text: str, options: str = ""):
        """(built program, 1 if compiled from source else 0)."""
        import pyopencl as cl

        path = self._path(device, text, options)
        if path is not None:
            binary = read_entry(path)
            if binary is not None:
                try:
                    prog = cl.Program(context, [device], [binary]).build(options=options)
                    self.hits += 1
                    return prog, 0
                except Exception:
                    path.unlink(missing_ok=True)  # stale for this driver: rebuild below
        self.misses += 1
        prog = cl.Program(context, text).build(options=options)
        if path is not None:
            try:
                binary = prog.get_info(cl.program_info.BINARIES)[0]
                if binary:
                    write_entry(path, bytes(binary))
            except Exception:  # some drivers give no binaries: then there is simply no warm start
                pass
        return prog, 1
