"""Documents generated from the code stay in step with it."""

from __future__ import annotations

from pathlib import Path

from optcli.tables import coverage_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_targets_doc_coverage_table_is_current():
    doc = (ROOT / "docs" / "targets.md").read_text()
    assert coverage_markdown() in doc, "docs/targets.md is stale: regenerate its table with python -m optcli.tables"
