"""The drift report's Markdown: a PR comment that fits whatever the upgrade, each symbol's diff once, moved anchors
collapsed, anchors whose lost notes block approval labelled so, and the terminal notes wrapped to the width."""

from __future__ import annotations

import pytest
from rich.console import Console

from reader.format.guide import AnchorSpec
from reader.gate.drift import Drift, DriftKind
from reader.gate.drift_report import PR_LIMIT, to_markdown, to_summary_markdown
from reader.gate.outcome import Outcome, exit_code, outcome_of, summary_data, worst
from reader.gate.report import AnchorRow, ClaimRow, SessionReport, summary
from tests.study.test_study_fixes import fits


def drifted(name: str, symbol: str, kind: DriftKind, diff: str = "", problems: tuple[str, ...] = ()) -> AnchorRow:
    anchor = AnchorSpec(name, symbol, None, 8)
    drift = Drift("g", anchor, kind, kind.value, diff=diff, problems=list(problems))
    failed = not kind.ok or bool(problems)
    return AnchorRow(name, symbol, "failed" if failed else "passed", drift, quoted_at=(40,), notes_at=(41, 43))


def big_diff(seed: str, lines: int = 60) -> str:
    body = "".join(
        f"-    old_{seed}_{i} = compute({i})\n+    new_{seed}_{i} = compute({i}, fast=True)\n" for i in range(lines)
    )
    return f"--- approved x.py:1-{lines}\n+++ current  x.py:1-{lines}\n@@ -1,{lines} +1,{lines} @@\n{body}"


def report_of(guides: dict[str, list[AnchorRow]], claims: int = 3) -> SessionReport:
    report = SessionReport("2.15.0+cpu", None, "installed at /x/site-packages", "readings/anchors.lock")
    for gid, rows in guides.items():
        row = report.guide(gid, f"readings/{gid}.md", gid)
        row.anchors += rows
        row.claims += [ClaimRow(f"c{i}", "holds", "passed", line=10 + i) for i in range(claims)]
    report.outcome = outcome_of(report).value
    report.exit_code = exit_code(Outcome(report.outcome))
    return report


def test_the_pr_summary_stays_under_the_limit_and_names_the_diffs_it_leaves_out():
    guides = {
        f"{n:02d}-guide": [drifted(f"a{k}", f"torch.m{n}:f{k}", DriftKind.CODE, big_diff(f"{n}{k}")) for k in range(3)]
        for n in range(40)
    }
    report = report_of(guides)
    full = to_markdown(report)
    assert len(full.encode()) > 5 * PR_LIMIT  # every diff is in the full report
    pr = to_summary_markdown(report, "torch-2.15.0.md")
    assert len(pr.encode()) <= PR_LIMIT
    assert all(f"- [ ] `{gid}`: " in pr for gid in guides)  # the whole checklist comes first
    assert "Not shown here (too long for a PR comment): " in pr
    assert pr.rstrip().endswith("is `torch-2.15.0.md`, kept with the job's artifacts.")


def test_a_checklist_longer_than_a_comment_is_cut_with_a_count():
    guides = {f"{n:04d}-guide-with-a-long-name": [drifted("a", f"torch.m:f{n}", DriftKind.CODE)] for n in range(2000)}
    pr = to_summary_markdown(report_of(guides), "torch.md")
    assert len(pr.encode()) <= PR_LIMIT
    assert "- … and " in pr and " more: see the full report" in pr


def test_each_symbols_diff_is_shown_once_when_two_guides_read_it():
    same = big_diff("shared", lines=5)
    report = report_of(
        {
            "03-unshard": [drifted("use-sharded", "torch.f:H._use_sharded", DriftKind.CODE, same)],
            "12-flat": [drifted("use-sharded", "torch.f:H._use_sharded", DriftKind.CODE, same)],
        }
    )
    full = to_markdown(report)
    assert full.count("```diff") == 1
    assert "  - the diff: the same as `03-unshard/use-sharded`'s, above" in full
    assert to_summary_markdown(report, "x.md").count("```diff") == 1


def test_moved_anchors_are_collapsed_into_a_line_per_guide():
    moved = [drifted(f"m{i}", f"torch.m:f{i}", DriftKind.MOVED) for i in range(12)]
    report = report_of({"19-ddp": moved, "20-wrap": [drifted("w", "torch.w:w", DriftKind.COSMETIC)]})
    full = to_markdown(report)
    assert "<details><summary>12 moved (the approved code, at other lines)</summary>" in full
    assert f"- 19-ddp: 12 moved ({', '.join(f'm{i}' for i in range(12))})" in full
    assert "- `20-wrap/w`: cosmetic" in full  # cosmetic ones stay one by one: their text changed
    pr = to_summary_markdown(report, "x.md")
    assert "13 anchors pass with notes (12 moved, 1 cosmetic): listed in the full report." in pr
    assert "m11" not in pr


def test_lost_notes_block_approval_so_the_anchor_is_pattern_lost_whatever_else_changed():
    lost = (
        "readings/g.md:41: note pattern `x = 1` matches nowhere",
        "readings/g.md:43: note pattern `y` matches nowhere",
    )
    row = drifted("post-backward", "torch.f:G.post_backward", DriftKind.CODE, "diff", lost)
    assert (row.kind, row.also, row.label) == (
        "pattern lost",
        "code changed",
        "pattern lost: 2 notes, and code changed",
    )
    plain = drifted("unshard", "torch.f:G.unshard", DriftKind.CODE, "diff")
    assert (plain.kind, plain.also, plain.label) == ("code changed", None, "code changed")
    report = report_of({"18-fsdp2": [row, plain]})
    full = to_markdown(report)
    assert "**2 of 2 anchors to re-read** in 1 guide: 1 pattern lost, 1 code changed." in full
    assert "`post-backward` (pattern lost: 2 notes, and code changed), `unshard` (code changed) — " in full
    assert "— readings/18-fsdp2.md lines 40-43" in full
    single = report_of({"04-prefetch": [AnchorRow("doc", "torch.m:D", "failed", row.drift, quoted_at=(238,))]})
    assert "(pattern lost: 2 notes, and code changed) — readings/04-prefetch.md line 238" in to_markdown(single)
    assert full.index("#### pattern lost (1)") < full.index("#### code changed (1)")
    data = summary_data(report)
    assert data["anchors"]["by_class"] == {"pattern lost": 1, "code changed": 1}
    assert data["reread"][0]["anchors"][0] == {"name": "post-backward", "class": "pattern lost",
                                               "also": "code changed", "notes_lost": 2}  # fmt: skip


def test_outcomes_order_codes_and_fail_on():
    assert [o.code for o in Outcome] == [0, 6, 1, 2]
    assert worst([Outcome.REREAD, Outcome.CLEAN, Outcome.BEHAVIOUR]) is Outcome.BEHAVIOUR
    assert exit_code(Outcome.REREAD, "behaviour-changed") == 0 and exit_code(Outcome.BEHAVIOUR, "broken") == 0
    assert exit_code(Outcome.BROKEN, "broken") == 2 and exit_code(Outcome.REREAD) == 6


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_terminal_notes_wrap_at_words_to_the_width(width: int):
    moved = [drifted(f"moved-anchor-{i}", f"torch.m:f{i}", DriftKind.MOVED) for i in range(15)]
    report = report_of({"19-ddp-buckets": moved})
    report.claims_not_run = "--torch-source previews the source only; install torch 2.15.0 and run them there"
    console = Console(record=True, width=width, color_system=None, force_terminal=False, soft_wrap=True)
    console.print(summary(report))
    out = console.export_text().replace("installed at /x/site-packages", "")
    fits(out, width, "19-ddp-buckets", *(a.name for a in moved))
    assert "claims did not run: --torch-source" in out and "outcome: clean (exit 0)" in out
