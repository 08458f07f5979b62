"""The drift report a CI job keeps and posts on a torch-upgrade PR, written next to each other:

- ``x.json``: the session as data (`SessionReport.to_json`);
- ``x.md``: the full report, for the job's artifacts: what to re-read (a checklist by guide, then each drifted
  anchor by class with its diff, each symbol's diff once), what changed in behaviour (failed claims, pointing at
  the guide's expect rows that are now false), and every guide's counts;
- ``summary.md``: the PR comment, under `PR_LIMIT` bytes whatever the upgrade: the headline, the checklist, the
  failed claims, then as many diffs as fit; the rest is in ``x.md``;
- ``summary.json``: the outcome and exit code for bots (`reader.gate.outcome`).
"""

from __future__ import annotations

import json
from pathlib import Path

from reader.claims.status import Status
from reader.gate.drift import EXPLAIN, DriftKind
from reader.gate.outcome import SUMMARY_JSON, SUMMARY_MD, Outcome, summary_data, write_summary
from reader.gate.report import (
    AnchorRow,
    ClaimRow,
    GuideReport,
    SessionReport,
    approve_commands,
    expected_failures,
    moved_lines,
    passing_notes,
    reread_lines,
    spans,
)

# The order a reviewer meets drift in: what stops a guide from being read at all first, then changed code.
_SEVERITY = [
    DriftKind.REMOVED,
    DriftKind.PATTERN_LOST,
    DriftKind.SIGNATURE,
    DriftKind.CODE,
    DriftKind.ANNOTATIONS,
    DriftKind.UNAPPROVED,
]
# A PR comment holds 65,536 characters; the summary stays under this many bytes (a byte is at most a character),
# leaving room for the workflow's marker and link.
PR_LIMIT = 60_000


_TITLES = {
    Outcome.CLEAN: "clean",
    Outcome.REREAD: "re-read only",
    Outcome.BEHAVIOUR: "behaviour changed",
    Outcome.BROKEN: "broken input",
}


def title(report: SessionReport) -> str:
    said = _TITLES[Outcome(report.outcome)] if report.outcome else "not judged"
    if report.outcome == Outcome.REREAD and report.claims_not_run is not None:
        said = "re-read (claims did not run)"  # "only" would say every claim held
    return f"## fsdp-readings: {said} · torch {report.torch_version or '?'}"


def headline(report: SessionReport) -> str:
    drifted = report.drifted
    kinds = [k.value for k in _SEVERITY if any(a.kind == k.value for a in drifted)]
    by_kind = ", ".join(f"{sum(1 for a in drifted if a.kind == k)} {k}" for k in kinds)
    guides = sum(1 for g in report.guides if any(a.outcome is Status.FAILED for a in g.anchors))
    claims = [c for g in report.guides for c in g.claims]
    held = sum(g.claims_held for g in report.guides)
    failed = sum(1 for c in claims if c.outcome is Status.FAILED)
    skipped = sum(1 for c in claims if c.outcome is Status.SKIPPED)
    anchors = sum(len(g.anchors) for g in report.guides)
    first = (
        f"**{len(drifted)} of {anchors} anchors to re-read** in {guides} guide{'s' * (guides != 1)}: {by_kind}."
        if drifted
        else f"All {anchors} anchors read as approved."
    )
    if report.claims_not_run is not None:
        second = f"Claims did not run: {report.claims_not_run}."
    elif not claims:
        second = "No claim was selected in this session."
    else:
        said = f"**{failed} claim{'s' * (failed != 1)} failed**; " if failed else "No claim failed; "
        second = f"{said}{held} of {len(claims)} hold, {skipped} skipped."
    others = len(report.other_failures)
    third = f" **{others} other test{'s' * (others != 1)} failed.**" if others else ""
    return f"{first} {second}{third}"


def _head(report: SessionReport) -> list[str]:
    git = f" (git `{report.torch_git[:12]}`)" if report.torch_git else ""
    return [title(report), "", f"torch **{report.torch_version or '?'}**{git} — {report.source}", "", headline(report)]


def _drifted(report: SessionReport) -> list[GuideReport]:
    return [g for g in report.guides if any(a.outcome is Status.FAILED for a in g.anchors)]


def _failed(report: SessionReport) -> list[tuple[GuideReport, ClaimRow]]:
    return [(g, c) for g in report.guides for c in g.claims if c.outcome is Status.FAILED]


def checklist(report: SessionReport) -> list[str]:
    """One box per guide to re-read: its drifted anchors with their class, and the guide lines to read."""
    out = []
    for g in _drifted(report):
        rows = [a for a in g.anchors if a.outcome is Status.FAILED]
        names = ", ".join(f"`{a.name}` ({a.label})" for a in rows)
        lines = reread_lines(rows)
        where = f" — {g.path} {'line' if lines.isdigit() else 'lines'} {lines}" if lines else ""
        out.append(f"- [ ] `{g.id}`: {names}{where}")
    return out


def _claim_at(g: GuideReport, c: ClaimRow) -> str:
    return f"{g.path}:{c.at}"


def _now_false(g: GuideReport, c: ClaimRow) -> list[str]:
    """The expect rows a failed claim's check names: the guide's own lines that this torch makes false."""
    if c.expect is None:
        return []
    if not c.expect.rows:
        return [f"  - checked against expect block `{c.expect.block}` at {g.path}:{c.expect.line}"]
    return [f"  - now false, {g.path}:{row.line} (expect `{c.expect.block}`): `{row.text}`" for row in c.expect.rows]


def failed_claims(report: SessionReport) -> list[str]:
    """A failed claim per item: where to fix the guide (its false expect row, else its claim), why, what it saw."""
    out = []
    for g, c in _failed(report):
        why = "blocked: its anchors no longer resolve" if c.blocked else f"`{c.reason or 'error'}`"
        out.append(f"- `{g.id}` / `{c.id}` — {why}, {_claim_at(g, c)}: {_md(c.message)}")
        out += _now_false(g, c)
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- the full report ----------------------------------------------------------------------------------------


def to_markdown(report: SessionReport) -> str:
    """The full report, for the job's artifacts (the PR gets `to_summary_markdown`)."""
    out = _head(report)
    drifted, failed = _drifted(report), _failed(report)
    if drifted:
        out += ["", "### What to re-read", "", *checklist(report)]
    if failed:
        out += ["", "### Claims that failed (behaviour changed, or a check too close to the old code)", ""]
        out += ["| guide | claim | line | reason | first line |", "|---|---|---|---|---|"]
        for g, c in failed:
            out.append(f"| `{g.id}` | `{c.id}` | {_claim_at(g, c)} | `{c.reason or 'error'}` | {_md(c.message)} |")
        rows = [line for g, c in failed for line in _named_rows(g, c)]
        if rows:
            out += ["", "The guide's expect rows these failures make false:", "", *rows]
    if report.other_failures:
        out += ["", "### Other failed tests", "", *[f"- {_md(line)}" for line in report.other_failures]]
    out += ["", "<details><summary>Every guide</summary>", ""]
    out += ["| guide | anchors ok | drifted | claims ok | failed | skipped |", "|---|---|---|---|---|---|"]
    for g in report.guides:
        ok = sum(1 for a in g.anchors if a.outcome in (Status.PASSED, Status.APPROVED))
        out.append(
            f"| `{g.id}` | {ok} | {g.count(g.anchors, 'failed')} | {g.claims_held} "
            f"| {g.count(g.claims, 'failed')} | {g.count(g.claims, 'skipped')} |"
        )
    out += ["", "</details>"]
    if xfails := expected_failures(report):
        out += ["", "Expected failures (known torch bugs; counted as claims ok):", ""]
        out += [f"- {line}" for line in xfails]
    diffs = DiffsShown()
    for g in drifted:
        out += _guide_section(g, diffs)
    out += _notes(report)
    if report.refused:
        out += ["", "### Not approved (nothing of these guides was recorded)", ""]
        out += [f"- {_md(line)}" for line in report.refused]
    if report.broken:
        out += ["", "### Broken input", "", "```", *report.broken, "```"]
    return "\n".join(out) + "\n"


def _named_rows(g: GuideReport, c: ClaimRow) -> list[str]:
    if c.expect is None:
        return []
    return [f"- `{g.id}` / `{c.id}`:", *_now_false(g, c)]


def _notes(report: SessionReport) -> list[str]:
    """Passing anchors with a note: cosmetic ones one by one, moves collapsed into a line per guide."""
    cosmetic, moved = passing_notes(report)
    if not cosmetic and not moved:
        return []
    out = ["", "### Passing, with notes", ""]
    out += [f"- `{g.id}/{a.name}`: {a.drift.note()}" for g, a in cosmetic if a.drift]
    if moved:
        out += ["", f"<details><summary>{len(moved)} moved (the approved code, at other lines)</summary>", ""]
        out += [f"- {line}" for line in moved_lines(moved)]
        out += ["", "</details>"]
    return out


class DiffsShown:
    """Each diff once: two guides that read the same symbol, with the same change, share one diff."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], str] = {}  # (symbol, diff) → the ``guide/anchor`` that showed it

    def seen(self, guide: GuideReport, row: AnchorRow) -> str | None:
        """Where this diff was shown already (``guide/anchor``), else None, and it is recorded as shown here."""
        assert row.drift is not None
        key = (row.symbol, row.drift.diff)
        if key in self.first:
            return self.first[key]
        self.first[key] = f"{guide.id}/{row.name}"
        return None


def _guide_section(g: GuideReport, diffs: DiffsShown) -> list[str]:
    out = ["", f"### `{g.id}`", ""]
    commands = " or ".join(f"`{c}`" for c in approve_commands(g.id, g.path))
    out.append(f"Re-read the guide against the new source, then: {commands}")
    rows = [a for a in g.anchors if a.outcome is Status.FAILED and a.drift is not None]
    for kind in _SEVERITY:
        of_kind = [a for a in rows if a.kind == kind.value]
        if not of_kind:
            continue
        out += ["", f"#### {kind.value} ({len(of_kind)}): {EXPLAIN[kind]}"]
        for a in of_kind:
            out += _anchor_section(g, a, diffs)
    for c in (c for c in g.claims if c.outcome is Status.FAILED):
        out += ["", f"**claim `{c.id}` failed** ({_claim_at(g, c)}, reason `{c.reason or 'error'}`): {c.message}"]
    return out


def _anchor_section(g: GuideReport, a: AnchorRow, diffs: DiffsShown) -> list[str]:
    d = a.drift
    assert d is not None
    out = ["", f"- **`{a.name}`** · `{a.symbol}` — {d.summary}"]
    if a.also is not None:
        out.append(f"  - approval is blocked until its lost notes are repinned; the {a.also} too")
    if d.approved is not None and d.current is not None:
        out.append(
            f"  - approved `{d.approved.file}:{d.approved.lines[0]}-{d.approved.lines[1]}` "
            f"(torch {', '.join(d.approved.approved_on)}) → now `{d.current.relpath}:{d.current.start}-{d.current.end}`"
        )
    quoted = [f"quoted at {g.path}:{spans(list(a.quoted_at))}"] if a.quoted_at else []
    quoted += [f"notes at lines {spans(list(a.notes_at))}"] if a.notes_at else []
    quoted += [f"evidence for claims {', '.join(f'`{c}`' for c in a.claims)}"] if a.claims else []
    if quoted:
        out.append(f"  - the guide: {'; '.join(quoted)}")
    out += [f"  - {p}" for p in d.problems]
    out += [f"  - hint: {h}" for h in (d.error.hints if d.error else [])]
    if d.diff:
        shown = diffs.seen(g, a)
        out += [f"  - the diff: the same as `{shown}`'s, above"] if shown else _diff(d.diff)
    return out


def _diff(diff: str) -> list[str]:
    out = ["", "  <details><summary>approved → current</summary>", "", "  ```diff"]
    out += [f"  {line}" if line else "" for line in diff.rstrip("\n").split("\n")]
    return [*out, "  ```", "", "  </details>"]


# --- the PR comment -----------------------------------------------------------------------------------------


def to_summary_markdown(report: SessionReport, full_report: str, limit: int = PR_LIMIT) -> str:
    """The PR comment: headline, the re-read checklist with guide lines, the failed claims with the expect rows
    now false, broken input; then each symbol's diff once, collapsed, while they fit under ``limit`` bytes.
    What does not fit is named, and is in ``full_report``."""
    footer = [
        "",
        f"The full report (every guide, every diff, the passing notes) is `{full_report}`, kept with the job's "
        "artifacts.",
    ]
    sections: list[tuple[str, list[str]]] = [
        ("What to re-read", checklist(report)),
        ("Claims that failed", failed_claims(report)),
        ("Other failed tests", [f"- {_md(line)}" for line in report.other_failures]),
        ("Not approved", [f"- {_md(line)}" for line in report.refused]),
        ("Broken input", [f"- {_md(problem.splitlines()[0])}" for problem in report.broken]),
    ]
    out = _head(report)
    cosmetic, moved = passing_notes(report)
    if cosmetic or moved:
        out += ["", f"{len(cosmetic) + len(moved)} anchors pass with notes ({len(moved)} moved, {len(cosmetic)} "
                "cosmetic): listed in the full report."]  # fmt: skip
    budget = limit - _size(footer) - _size(out)
    for heading, lines in sections:
        if lines:
            kept = _fit(["", f"### {heading}", ""], lines, budget)
            out += kept
            budget -= _size(kept)
    out += _diffs_that_fit(report, budget)
    return "\n".join(out + footer) + "\n"


def _size(lines: list[str]) -> int:
    return sum(len(line.encode("utf-8")) + 1 for line in lines)


def _fit(head: list[str], lines: list[str], budget: int) -> list[str]:
    """``head`` and as many of ``lines`` as fit in ``budget`` bytes, then a line saying how many did not."""
    kept = list(head)
    for n, line in enumerate(lines):
        rest = len(lines) - n
        if _size([*kept, line]) + _size([f"- … and {rest} more: see the full report"]) > budget:
            return [*kept, f"- … and {rest} more: see the full report"]
        kept.append(line)
    return kept


def _diffs_that_fit(report: SessionReport, budget: int) -> list[str]:
    """Each drifted symbol's diff once, in checklist order, collapsed; those that would not fit are named."""
    shown, left_out = DiffsShown(), []
    out = ["", "### Diffs (approved → current, each symbol once)"]
    if _size(out) >= budget:
        return []
    used = _size(out)
    for g in _drifted(report):
        for a in g.anchors:
            if a.outcome is not Status.FAILED or a.drift is None or not a.drift.diff or shown.seen(g, a):
                continue
            block = ["", f"- `{g.id}/{a.name}` · `{a.symbol}` ({a.label})", *_diff(a.drift.diff)]
            reserve = _size([f"Not shown here (too long for a PR comment): {len(left_out) + 1} diffs"]) + 400
            if used + _size(block) + reserve > budget:
                left_out.append(f"`{g.id}/{a.name}`")
                continue
            out += block
            used += _size(block)
    if len(out) == 2 and not left_out:
        return []
    if left_out:
        note = f"Not shown here (too long for a PR comment): the diffs of {', '.join(left_out)}."
        if used + _size(["", note]) > budget:
            note = f"Not shown here (too long for a PR comment): {len(left_out)} diffs."
        out += ["", note]
    return out


def write_drift_report(path: Path, report: SessionReport) -> tuple[Path, Path]:
    """Write ``x.json`` and ``x.md`` (the full report), and beside them ``summary.md`` (the PR comment) and
    ``summary.json`` (the outcome); returns the first two paths."""
    json_path = path.with_suffix(".json") if path.suffix == ".md" else path
    md_path = path if path.suffix == ".md" else path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    md_path.write_text(to_markdown(report), encoding="utf-8")
    summary_md = json_path.parent / SUMMARY_MD
    summary_md.write_text(to_summary_markdown(report, md_path.name), encoding="utf-8")
    files = {"report": json_path.name, "markdown": md_path.name, "summary": summary_md.name}
    write_summary(json_path.parent, summary_data(report, files))
    return json_path, md_path


def reserved_name(path: Path) -> str | None:
    """Why ``--drift-report PATH`` cannot be used: its files would overwrite the summary's, written beside them."""
    if path.stem != Path(SUMMARY_JSON).stem:
        return None
    return (
        f"--drift-report {path}: {SUMMARY_JSON} and {SUMMARY_MD} are the gate's summary, written next to the "
        "report; name the report after its torch, e.g. --drift-report gate/torch-2.15.0.json"
    )
