"""Errors a user can hit.

Every error that bad input can cause is an ``OptError`` subclass whose message says what was
wrong, where (file, node name, op type) and what to do.  The CLI maps them to exit code 2 and
prints the message as one line; anything else is an internal error (exit code 1).
"""

from __future__ import annotations


class OptError(Exception):
    """Base class of every error caused by the user's input or environment.

    Its message is one line whatever it quotes: names from a file (an attribute name, a node name)
    may hold line breaks, which are shown escaped, so the CLI's "one clear line" holds."""

    exit_code = 2

    def __str__(self) -> str:
        text = super().__str__()
        if "\n" in text or "\r" in text:
            text = text.replace("\r", "\\r").replace("\n", "\\n")
        return text


class ModelError(OptError):
    """The input model is unreadable, invalid or unsupported."""


class UsageError(OptError):
    """A flag or argument has a bad value."""


class NbFormatError(OptError):
    """A `.nb` file is malformed, truncated, corrupted or of an unsupported version."""


class OutputError(OptError):
    """An output file cannot be written (read-only folder, full disk, another user's file)."""


class InputError(OptError):
    """Inputs given to ``Predictor.run`` do not match the model's inputs."""


class TargetError(OptError):
    """A target is unknown or cannot be used on this machine."""


class DeviceError(TargetError):
    """The GPU failed while running (device lost, out of resources) and the call cannot be
    finished on the CPU instead (``require_gpu=True``, or inputs/outputs living on the device)."""


class Cancelled(OptError):
    """A run stopped on request: ``Predictor.cancel()`` from another thread.  The CLI exits 130, as
    for Ctrl-C."""

    exit_code = 130


class RunLimitError(OptError):
    """A run went past a limit set to keep a file from running forever: its deadline
    (``run(timeout_s=)``, ``optcli run --timeout``) or the iterations allowed to a ``Loop``
    or ``Scan`` (``OPTCLI_MAX_LOOP_ITERATIONS``)."""


class InternalError(Exception):
    """A bug in optcli, not in the user's input: the CLI says "internal error ... please report"
    and exits 1.  Deliberately not an ``OptError``: code that catches bad input must not hide it."""

    exit_code = 1


class KernelError(InternalError):
    """A kernel raised on inputs that passed every check (names, dtypes, shapes): our bug."""


def where(node_name: str | None = None, op_type: str | None = None, file: str | None = None) -> str:
    """Format the 'where' part of a message: ``file, node 'conv1' (Conv)``."""
    parts = []
    if file:
        parts.append(str(file))
    if node_name is not None or op_type is not None:
        label = f"node '{node_name}'" if node_name else "unnamed node"
        parts.append(f"{label} ({op_type})" if op_type else label)
    return ", ".join(parts)
