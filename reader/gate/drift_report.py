"""The drift report a CI job posts on a torch-upgrade PR: ``x.json`` (`SessionReport.to_json`) and ``x.md``.

The Markdown answers a reviewer's two questions in order: what to re-read (anchors by guide, then by drift class,
each with its diff and the guide lines that quote it), and what changed in behaviour (the claims that failed,
with the reason their check gave).
"""

from __future__ import annotations

import json
from pathlib import Path

from reader.gate.drift import EXPLAIN, DriftKind
from reader.gate.report import AnchorRow, GuideReport, SessionReport, approve_commands, expected_failures

# The order a reviewer meets drift in: what stops a guide from being read at all first, then changed code.
_SEVERITY = [
    DriftKind.REMOVED,
    DriftKind.PATTERN_LOST,
    DriftKind.SIGNATURE,
    DriftKind.CODE,
    DriftKind.ANNOTATIONS,
    DriftKind.UNAPPROVED,
]


def to_markdown(report: SessionReport) -> str:
    """The comment a CI job posts on a torch-upgrade PR. It answers a reviewer's two questions in order: what to
    re-read (anchors by guide, then by drift class, each with its diff and the guide lines that quote it), and
    what changed in behaviour (claims that failed, with the reason their check gave)."""
    status = {0: "clean", 1: "drift or failed claims", 2: "broken input"}.get(report.exit_code or 0, "error")
    git = f" (git `{report.torch_git[:12]}`)" if report.torch_git else ""
    out = [f"## fsdp-readings: {status}", "", f"torch **{report.torch_version or '?'}**{git} — {report.source}", ""]
    out += _headline(report)
    drifted = [g for g in report.guides if any(a.outcome == "failed" for a in g.anchors)]
    failed = [(g, c) for g in report.guides for c in g.claims if c.outcome == "failed"]
    if drifted:
        out += ["", "### What to re-read", ""]
        for g in drifted:
            rows = [a for a in g.anchors if a.outcome == "failed"]
            names = ", ".join(f"`{a.name}` ({a.kind})" for a in rows)
            lines = sorted({n for a in rows for n in (*a.quoted_at, *a.notes_at)})
            where = f" — {g.path} lines {_spans(lines, gap=_READ_TOGETHER)}" if lines else ""
            out.append(f"- [ ] `{g.id}`: {names}{where}")
    if failed:
        out += ["", "### Claims that failed (behaviour changed, or a check too close to the old code)", ""]
        out += ["| guide | claim | line | reason | first line |", "|---|---|---|---|---|"]
        for g, c in failed:
            first = c.message.replace("|", "\\|")
            out.append(f"| `{g.id}` | `{c.id}` | {g.path}:{c.line} | `{c.reason or 'error'}` | {first} |")
    out += ["", "<details><summary>Every guide</summary>", ""]
    out += [
        "| guide | anchors ok | drifted | claims ok | failed | skipped |",
        "|---|---|---|---|---|---|",
    ]
    for g in report.guides:
        ok = sum(1 for a in g.anchors if a.outcome in ("passed", "approved"))
        out.append(
            f"| `{g.id}` | {ok} | {g.count(g.anchors, 'failed')} | {g.claims_held} "
            f"| {g.count(g.claims, 'failed')} | {g.count(g.claims, 'skipped')} |"
        )
    out += ["", "</details>"]
    if xfails := expected_failures(report):
        out += ["", "Expected failures (known torch bugs; counted as claims ok):", ""]
        out += [f"- {line}" for line in xfails]
    for g in drifted:
        out += _guide_section(g)
    notes = [
        (g, a)
        for g in report.guides
        for a in g.anchors
        if a.outcome == "passed" and a.drift is not None and a.drift.kind in (DriftKind.MOVED, DriftKind.COSMETIC)
    ]
    if notes:
        out += ["", "### Passing, with notes", ""] + [
            f"- `{g.id}/{a.name}`: {a.drift.note()}" for g, a in notes if a.drift
        ]
    if report.broken:
        out += ["", "### Broken input", "", "```", *report.broken, "```"]
    return "\n".join(out) + "\n"


def _headline(report: SessionReport) -> list[str]:
    drifted = report.drifted
    kinds = [k for k in _SEVERITY if any(a.drift is not None and a.drift.kind is k for a in drifted)]
    by_kind = ", ".join(f"{sum(1 for a in drifted if a.drift and a.drift.kind is k)} {k.value}" for k in kinds)
    guides = sum(1 for g in report.guides if any(a.outcome == "failed" for a in g.anchors))
    claims = [c for g in report.guides for c in g.claims]
    held = sum(g.claims_held for g in report.guides)
    failed = sum(1 for c in claims if c.outcome == "failed")
    skipped = sum(1 for c in claims if c.outcome == "skipped")
    anchors = sum(len(g.anchors) for g in report.guides)
    first = (
        f"**{len(drifted)} of {anchors} anchors to re-read** in {guides} guide{'s' * (guides != 1)}: {by_kind}."
        if drifted
        else f"All {anchors} anchors read as approved."
    )
    second = f"**{failed} claim{'s' * (failed != 1)} failed**; " if failed else "No claim failed; "
    return [f"{first} {second}{held} of {len(claims)} hold, {skipped} skipped."]


def _guide_section(g: GuideReport) -> list[str]:
    out = ["", f"### `{g.id}`", ""]
    commands = " or ".join(f"`{c}`" for c in approve_commands(g.id, g.path))
    out.append(f"Re-read the guide against the new source, then: {commands}")
    rows = [a for a in g.anchors if a.outcome == "failed" and a.drift is not None]
    for kind in _SEVERITY:
        of_kind = [a for a in rows if a.drift is not None and a.drift.kind is kind]
        if not of_kind:
            continue
        out += ["", f"#### {kind.value} ({len(of_kind)}): {EXPLAIN[kind]}"]
        for a in of_kind:
            out += _anchor_section(g, a)
    for c in (c for c in g.claims if c.outcome == "failed"):
        out += ["", f"**claim `{c.id}` failed** ({g.path}:{c.line}, reason `{c.reason or 'error'}`): {c.message}"]
    return out


def _anchor_section(g: GuideReport, a: AnchorRow) -> list[str]:
    d = a.drift
    assert d is not None
    out = ["", f"- **`{a.name}`** · `{a.symbol}` — {d.summary}"]
    if d.approved is not None and d.current is not None:
        out.append(
            f"  - approved `{d.approved.file}:{d.approved.lines[0]}-{d.approved.lines[1]}` "
            f"(torch {', '.join(d.approved.approved_on)}) → now `{d.current.relpath}:{d.current.start}-{d.current.end}`"
        )
    quoted = [f"quoted at {g.path}:{_spans(list(a.quoted_at))}"] if a.quoted_at else []
    quoted += [f"notes at lines {_spans(list(a.notes_at))}"] if a.notes_at else []
    quoted += [f"evidence for claims {', '.join(f'`{c}`' for c in a.claims)}"] if a.claims else []
    if quoted:
        out.append(f"  - the guide: {'; '.join(quoted)}")
    out += [f"  - {p}" for p in d.problems]
    out += [f"  - hint: {h}" for h in (d.error.hints if d.error else [])]
    if d.diff:
        out += ["", "  <details><summary>approved → current</summary>", "", "  ```diff"]
        out += [f"  {line}" if line else "" for line in d.diff.rstrip("\n").split("\n")]
        out += ["  ```", "", "  </details>"]
    return out


_READ_TOGETHER = 6  # a source block and its notes, or two blocks a few lines apart, are one passage to re-read


def _spans(lines: list[int], gap: int = 1) -> str:
    """1, 2, 3, 7 → "1-3, 7"; lines at most ``gap`` apart join one span."""
    spans: list[list[int]] = []
    for line in sorted(set(lines)):
        if spans and line <= spans[-1][1] + gap:
            spans[-1][1] = line
        else:
            spans.append([line, line])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def write_drift_report(path: Path, report: SessionReport) -> tuple[Path, Path]:
    """Write the JSON report and its Markdown sibling (``x.json`` + ``x.md``); returns both paths."""
    json_path = path.with_suffix(".json") if path.suffix == ".md" else path
    md_path = path if path.suffix == ".md" else path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    md_path.write_text(to_markdown(report), encoding="utf-8")
    return json_path, md_path
