"""The session summary pytest prints under "reading guides" fits its terminal: at 60, 80 and 100 columns no
header is cut ("drift…", "skipp…") and every guide id is printed whole."""

from __future__ import annotations

import pytest
from rich.console import Console

from reader.gate.report import AnchorRow, ClaimRow, SessionReport, summary
from tests.study.test_study_fixes import GUIDES, fits

HEADS = ("anchors", "drifted", "claims", "failed", "skipped")


def _report() -> SessionReport:
    report = SessionReport("2.13.0+cpu", "abcdef123456", "installed at /x/site-packages", "readings/anchors.lock")
    for guide in GUIDES:
        row = report.guide(guide.id, f"readings/{guide.id}.md", guide.title)
        row.anchors += [AnchorRow(a.name, a.symbol, "passed") for a in guide.anchors]
        row.claims += [ClaimRow(c.id, c.statement, "passed") for c in guide.claims]
    return report


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_summary_fits_with_every_header_and_guide_id_whole(width: int) -> None:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    console.print(summary(_report()))
    out = console.export_text()
    fits(out.replace("installed at /x/site-packages", ""), width, *(g.id for g in GUIDES))
    assert all(head in out for head in HEADS)
    if width >= 80:  # a table: its header row holds every head, in order
        header = next(line for line in out.splitlines() if line.split()[:1] == ["guide"])
        assert header.split() == ["guide", *HEADS]
