"""The tool's version: one constant on the ground floor, so the file format, the caches and the
CLI can name it without importing the package face (``optcli/__init__.py``)."""

__version__ = "0.1.0"
