"""The one place optcli turns text into code: Python functions it writes itself, from its own
identifiers and numbers, to run a plan's steps (``runtime/host/program.py``) or a Loop's body
(``ops/control_flow.py``) without the cost of a loop over step records.

A loaded file never supplies any of that text: the generators name values and steps by numbers
(``v3``, ``f12``), and everything from the file (kernels, weights, names, messages) reaches the
function as the objects in its namespace.  ``function`` holds them to that: a source with a quote,
a backslash or a comment sign (any string literal at all) is refused, so no name or string of a
file can be inside it, whatever a generator's bug.  docs/security.md says why this is the only
``compile``/``exec`` in the package, and tests/reliability/test_no_code_from_files.py watches it.
"""

from __future__ import annotations

import re
from typing import Any

_ALLOWED = re.compile(r"[A-Za-z0-9_ \n\[\](),.:=<>{}+\-*]*")


class GeneratedCodeError(RuntimeError):
    """A generator wrote source outside the grammar: a bug in optcli, refused before it runs."""


def function(lines: list[str], namespace: dict[str, Any], name: str) -> Any:
    """The function ``name`` that ``lines`` (Python source, one statement per line) define, with
    ``namespace`` as its globals.  Refused (``GeneratedCodeError``) unless the source holds only
    identifiers, numbers, whitespace and the punctuation of calls, subscripts and comparisons."""
    source = "\n".join(lines)
    if not _ALLOWED.fullmatch(source):
        bad = sorted(set(re.sub(r"[A-Za-z0-9_ \n\[\](),.:=<>{}+\-*]", "", source)))
        raise GeneratedCodeError(f"generated source holds characters outside its grammar ({''.join(bad)!r}): "
                                 "a bug in optcli")
    space = dict(namespace)
    exec(compile(source, f"<optcli generated {name}>", "exec"), space)  # noqa: S102 - checked above
    return space[name]
