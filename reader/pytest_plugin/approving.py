"""``--approve`` in pytest: which guides are approved, and the decision, reached from this session's claims.

Approval depends on the guide's claim verdicts of the same session, so the plan is made once collection is done:

- `plan` picks the guides (``--approve=<id>``; a bare ``--approve`` takes the one guide whose anchors drift, and
  refuses with their list when there are several), lets their slow claims run, and moves their anchor items
  after their claim and predict items.
- `decide` is asked by the first anchor item of such a guide: every claim's verdict in this session (a
  deselected one did not run) goes to ``Workspace.approve_guide``, which records the whole guide or nothing.
"""

from __future__ import annotations

import pytest

from reader.format.guide import Guide
from reader.gate.approval import NotApprovable
from reader.gate.drift import DriftKind
from reader.gate.lock import LockError
from reader.gate.workspace import GuideApproval
from reader.pytest_plugin.session import ReaderSession
from reader.source.torch_source import SourceError

BARE = "*"


def plan(
    reader: ReaderSession, items: list[pytest.Item], guide_item: type[pytest.Item], anchor_item: type[pytest.Item]
) -> frozenset[str]:
    """The ids of the guides this session approves (recorded in ``reader.findings.approving``), with the anchor
    items of each moved after its claims. ``guide_item`` and ``anchor_item`` are the item classes (the items module
    imports this one, for `decide`)."""
    asked = reader.options.approve_ids
    if asked is None:
        return frozenset()
    guides = {item.guide.id: item.guide for item in items if isinstance(item, guide_item)}
    chosen = frozenset(asked & guides.keys())
    if BARE in asked:
        chosen = chosen | _bare(reader, list(guides.values()))
    reader.findings.approving = chosen
    # Anchor items last within their guide, so that the decision can read every claim's outcome.
    anchors = [i for i in items if isinstance(i, anchor_item) and i.guide.id in chosen]
    moved = set(anchors)
    rest = [i for i in items if i not in moved]
    for anchor in anchors:
        after = max((n for n, i in enumerate(rest) if isinstance(i, guide_item) and i.guide.id == anchor.guide.id),
                    default=len(rest) - 1)  # fmt: skip
        rest.insert(after + 1, anchor)
    items[:] = rest
    return chosen


def _bare(reader: ReaderSession, guides: list[Guide]) -> frozenset[str]:
    """A bare ``--approve``: the guide whose anchors drift, if there is one; several are listed and refused."""
    try:
        workspace = reader.resources.workspace()
        pending = {g.id: workspace.pending(g) for g in guides if g.applies_to(workspace.torch_version)}
    except (SourceError, LockError):
        return frozenset()  # the anchor items report it
    pending = {gid: drifts for gid, drifts in pending.items() if drifts}
    if len(pending) <= 1:
        return frozenset(pending)
    listed = "\n".join(
        f"    {gid}: {', '.join(f'{d.anchor.name} ({d.kind.value})' for d in drifts)}"
        for gid, drifts in sorted(pending.items())
    )
    reader.findings.broken["--approve"] = (
        f"--approve: {len(pending)} guides to approve on torch {workspace.torch_version}; approve each after "
        f"re-reading it, by id (--approve=<guide-id>):\n{listed}"
    )
    return frozenset()


def decide(reader: ReaderSession, guide: Guide) -> GuideApproval | NotApprovable:
    """Approve ``guide`` from this session's claim verdicts (once; later anchor items read the decision)."""
    findings = reader.findings
    if guide.id not in findings.approvals:
        results = {cid: verdict for (gid, cid), verdict in findings.verdicts.items() if gid == guide.id}
        workspace = reader.resources.workspace()
        try:
            decided: GuideApproval | NotApprovable = workspace.approve_guide(guide, results, force=reader.options.force)
        except NotApprovable as exc:
            decided = exc
        findings.approvals[guide.id] = decided
        if isinstance(decided, NotApprovable):
            findings.report.refused += [f"{guide.id}: {reason}" for reason in decided.reasons]
        else:
            findings.report.approved += [
                f"{guide.id}/{a.drift.anchor.name} (was: {a.drift.kind.value})"
                for a in decided.anchors
                if a.drift.kind is not DriftKind.UNCHANGED  # an unchanged entry is not touched: nothing to list
            ]
            findings.report.approved.append(f"{guide.id} on torch {decided.release}: {_claims(decided)}")
    return findings.approvals[guide.id]


def _claims(approved: GuideApproval) -> str:
    record = approved.record
    said = [f"{record.held} claims held"]
    if record.skipped:
        said.append(f"{len(record.skipped)} skipped ({', '.join(record.skipped)})")
    if record.failed or record.not_run:
        said.append(f"forced over {', '.join((*record.failed, *record.not_run))}: {record.forced}")
    return "; ".join(said)
