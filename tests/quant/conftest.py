"""The native library fixture of tests/native (a skip, or a failure under OPTCLI_REQUIRE_NATIVE=1, where the
library was not built), for the integer kernels' tests here."""

from tests.native.conftest import native_lib  # noqa: F401
