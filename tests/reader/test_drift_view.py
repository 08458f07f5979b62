"""One drift, rendered the three ways a reviewer meets it: pytest's failure of the anchor item, the terminal report of
``fsdp-readings drift`` / ``approve``, and the site's drifted quote. They say the same lines (`DriftView.lines`):
the heading with the lost-notes label, the locations, the problems, the diff, and the approve commands."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from reader.format.guide import AnchorSpec
from reader.gate.drift import Drift, DriftKind
from reader.gate.lock_entries import ApprovedSource
from reader.gate.report import AnchorRow, GuideReport
from reader.pytest_plugin.failures import DriftRepr
from reader.site.pages import ENV, _drift_lines
from reader.views.drift import DriftView, drift_panel

GUIDE_ID, PATH = "04-forward-prefetch", "readings/04-forward-prefetch.md"
ANCHOR = AnchorSpec("prefetch", "torch.distributed.fsdp._runtime_utils:_prefetch_handle", None, 8)
DIFF = "--- approved x.py:17-29\n+++ current  x.py:17-29\n@@ -26 +26 @@\n-    a = True\n+    a = b is not None\n"


def drift(kind: DriftKind, problems: tuple[str, ...] = ()) -> Drift:
    approved = ApprovedSource("torch/distributed/fsdp/_runtime_utils.py", (17, 29), "    a = True\n", ("2.13.0",))
    return Drift(GUIDE_ID, ANCHOR, kind, "the code changed", approved=approved, diff=DIFF, problems=list(problems))


def pytest_lines(found: Drift) -> list[str]:
    return str(DriftRepr(f"{PATH}:8", PATH, GUIDE_ID, ANCHOR, found, approving=False)).split("\n")


def terminal_lines(found: Drift) -> list[str]:
    console = Console(record=True, width=200, color_system=None)
    row = AnchorRow(ANCHOR.name, ANCHOR.symbol, "failed", found, line=ANCHOR.line)
    console.print(drift_panel(GuideReport(GUIDE_ID, PATH, "Forward prefetch"), row))
    lines = [line.rstrip() for line in console.export_text().split("\n")]
    return lines[1:-2]  # the rule naming the guide and the anchor above, a blank line below


class _Drift(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inside, self.text = False, ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.inside = self.inside or (tag == "pre" and ("class", "drift") in attrs)

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "pre"

    def handle_data(self, data: str) -> None:
        self.text += data if self.inside else ""


def site_lines(found: Drift) -> list[str]:
    guide = SimpleNamespace(path=Path(PATH), id=GUIDE_ID, anchor=lambda name: ANCHOR)
    quoted = SimpleNamespace(name=ANCHOR.name, drift=found)
    lines = _drift_lines(guide, quoted)  # type: ignore[arg-type]
    view = {"name": "prefetch", "location": "x.py:17-29", "qualname": "_prefetch_handle", "status": "x", "ok": False}
    page = _Drift()
    page.feed(ENV.get_template("quote.html").render(quote=view, segments=[], lost=[], drift=lines))
    return page.text.rstrip("\n").split("\n")


@pytest.mark.parametrize(
    ("kind", "problems", "heading", "fix"),
    [
        (DriftKind.CODE, (), "drifted: code changed",
         "  re-read the guide against the new source, then approve it:"),
        (DriftKind.CODE, (f"{PATH}:19: note pattern `a = True` matches nowhere",),
         "drifted: pattern lost: 1 note, and code changed",
         f"  fix the anchor at {PATH}:8 (or the notes above), re-read the guide, then approve:"),
        (DriftKind.REMOVED, (), "drifted: removed",
         f"  fix the anchor at {PATH}:8 (or the notes above), re-read the guide, then approve:"),
    ],
)  # fmt: skip
def test_one_drift_reads_the_same_in_pytest_the_terminal_report_and_the_site(
    kind: DriftKind, problems: tuple[str, ...], heading: str, fix: str
) -> None:
    found = drift(kind, problems)
    said = pytest_lines(found)
    assert said == terminal_lines(found) == site_lines(found)
    assert said[0] == f"{PATH}:8: anchor `prefetch` ({ANCHOR.symbol}) {heading}"
    assert said[-3:] == [fix, f"    pytest {PATH} --approve={GUIDE_ID}", f"    fsdp-readings approve {GUIDE_ID}"]
    assert "-    a = True" in said and all(p in " ".join(said) for p in problems)
    assert said == str(DriftView(f"{PATH}:8", GUIDE_ID, PATH, "prefetch", ANCHOR.symbol, found)).split("\n")
