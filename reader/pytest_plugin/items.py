"""The pytest nodes of a guide: its file, one item per anchor (the drift gate), one per claim (the check).

Items carry their specs (``item.guide``, ``item.anchor`` / ``item.claim``) and, after running, what they found
(``AnchorItem.drift``, ``AnchorItem.approved``, ``ClaimItem.verdict``): the plugin's report hook reads them off
the item. Ids come from anchor names and claim ids, never from line numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.status import Status
from reader.claims.text import claim_header
from reader.claims.verdict import ClaimVerdict, decide, describe_xfail
from reader.format.errors import GuideError
from reader.format.guide import AnchorSpec, ClaimSpec, Guide
from reader.format.parse import load_guide, looks_like_guide
from reader.format.predict import NotObserved, PredictQuestion, agrees, observed
from reader.gate.approval import NotApprovable
from reader.gate.drift import Drift
from reader.gate.lock import LockError
from reader.gate.workspace import Workspace
from reader.pytest_plugin import approving as approvals
from reader.pytest_plugin.failures import AnchorDrifted, ClaimFailed, DriftRepr, ItemProblem, malformed_lock
from reader.pytest_plugin.session import session_of
from reader.source.torch_source import SourceError

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr


PREVIEW_SKIP = "--torch-source previews anchors only; claims run against the installed torch"


def is_guide_file(path: Path, session: pytest.Session) -> bool:
    """A guide under the readings directory, or one named on the command line."""
    if path.suffix != ".md" or not looks_like_guide(path):
        return False
    readings_dir = session_of(session.config).options.readings_dir
    inside = readings_dir == path.resolve().parent or readings_dir in path.resolve().parents
    return inside or session.isinitpath(path)


class GuideFile(pytest.File):
    """A broken guide is a collection error naming file, line and fix (recorded, so the others still run)."""

    def collect(self) -> Iterator[pytest.Item]:
        reader = session_of(self.config)
        try:
            guide = load_guide(self.path, reader.resources.checks)
            reader.findings.guides.add(guide)
        except GuideError as exc:
            rendered = exc.render(reader.display(self.path))
            reader.findings.broken[self.nodeid] = rendered
            raise self.CollectError(rendered) from None
        for anchor in guide.anchors:
            yield AnchorItem.from_parent(self, name=f"anchor[{anchor.name}]", guide=guide, anchor=anchor)
        for claim in guide.claims:
            yield ClaimItem.from_parent(self, name=f"claim[{claim.id}]", guide=guide, claim=claim)
        for question in guide.regions_of(PredictQuestion):
            yield PredictItem.from_parent(self, name=f"predict[{question.id}]", guide=guide, question=question)


class GuideItem(pytest.Item):
    """An item of a guide; failures point at its line in the guide (like pytest's doctest items)."""

    guide: Guide
    line: int

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line - 1, self.name

    def where(self) -> str:
        return f"{session_of(self.config).display(self.path)}:{self.line}"

    def _workspace_or_fail(self) -> Workspace:
        try:
            workspace = session_of(self.config).resources.workspace()
        except SourceError as exc:
            raise ItemProblem(f"{self.where()}: cannot read torch's source: {exc}") from None
        if not self.guide.applies_to(workspace.torch_version):
            version = workspace.torch_version
            pytest.skip(f"{self.guide.id} applies to torch {self.guide.torch}; this torch is {version}")
        return workspace

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ItemProblem):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


class AnchorItem(GuideItem):
    """Passes while the anchor's live source is the approved one (or only moved or cosmetically changed)."""

    def __init__(self, *, guide: Guide, anchor: AnchorSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.anchor = anchor
        self.line = anchor.line
        self.drift: Drift | None = None  # set by runtest
        self.approved = False  # --approve recorded the anchor's current source

    def runtest(self) -> None:
        reader = session_of(self.config)
        workspace = self._workspace_or_fail()
        try:
            workspace.lock  # noqa: B018 - load (and validate) the lock before comparing with it
        except LockError as exc:
            reader.findings.lock_error = exc
            raise ItemProblem(malformed_lock(reader.display(exc.path), exc)) from None
        if not self.anchor.applies_to(workspace.torch_version):
            pytest.skip(f"anchor `{self.anchor.name}` reads torch {self.anchor.torch}; this torch is "
                        f"{workspace.torch_version}")  # fmt: skip
        if self.guide.id in reader.findings.approving:
            self._approve(workspace)
            return
        drift = workspace.drift(self.guide, self.anchor)
        self.drift = drift
        self.user_properties.append(("drift", drift.kind.value))
        if not drift.ok:
            raise AnchorDrifted(drift, approving=False)

    def _approve(self, workspace: Workspace) -> None:
        """Passes if the guide was approved whole; else a drifted anchor fails with why (an unchanged one passes:
        its claims' own items already report what failed)."""
        decided = approvals.decide(session_of(self.config), self.guide)
        if isinstance(decided, NotApprovable):
            drift = workspace.drift(self.guide, self.anchor)
            self.drift = drift
            if not drift.ok:
                raise AnchorDrifted(drift, approving=True, refused=tuple(decided.reasons))
            return
        approval = next(a for a in decided.anchors if a.drift.anchor.name == self.anchor.name)
        self.drift = approval.drift
        self.approved = True
        self.user_properties.append(("approved", approval.drift.kind.value))

    def repr_failure(  # type: ignore[override]
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr | DriftRepr:
        if isinstance(excinfo.value, AnchorDrifted):
            display = session_of(self.config).display(self.path)
            drifted = excinfo.value
            return DriftRepr(
                self.where(), display, self.guide.id, self.anchor, drifted.drift, drifted.approving, drifted.refused
            )
        return super().repr_failure(excinfo, style=style)


def claim_verdict(item: GuideItem, claim: ClaimSpec | None = None) -> ClaimVerdict:
    """The verdict on ``claim`` (the item's own by default), decided once per session and remembered: a predict
    question reads the run of its claim instead of running it again."""
    claim = claim if claim is not None else item.claim  # type: ignore[attr-defined]
    reader = session_of(item.config)
    key = (item.guide.id, claim.id)
    if key not in reader.findings.verdicts:
        workspace = item._workspace_or_fail()

        def send(request: CheckRequest) -> CheckRun:  # the runner is found only once a claim is sent
            return reader.resources.runner().run(request)

        reader.findings.verdicts[key] = decide(workspace, item.guide, claim, send, display=reader.display)
    return reader.findings.verdicts[key]


class ExpectedClaimFailure(ItemProblem):
    """An xfail claim whose check failed for the reason it names: pytest reports the item as xfailed."""


def _mark_like(item: GuideItem, claim: ClaimSpec) -> None:
    """An item that runs ``claim`` carries its markers: ``world_size(n)`` and the claim's own (``slow``, ``gpu``)."""
    item.add_marker(pytest.mark.world_size(claim.world_size))
    for marker in claim.markers:
        item.add_marker(getattr(pytest.mark, marker))


def _mark_expected_failure(item: GuideItem, claim: ClaimSpec) -> None:
    """pytest's own xfail, for its reporting (``x``, ``XPASS``). Only `ExpectedClaimFailure` counts as the
    expected failure; strictness is the verdict's (`reader.claims.verdict`), which fails a strict unexpected pass with
    a report of its own, so the marker itself is never strict."""
    if claim.xfail is not None:
        reason = describe_xfail(claim.xfail)
        item.add_marker(pytest.mark.xfail(raises=ExpectedClaimFailure, strict=False, reason=reason))


class ClaimItem(GuideItem):
    """Runs the claim's check on the rank pool; passes only if it passed and some anchored torch code ran."""

    runs_on_ranks = True  # the ranks plugin starts the zygote once collection finds one (checks.ranks.zygote)

    def __init__(self, *, guide: Guide, claim: ClaimSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.claim = claim
        self.line = claim.line
        # Its verdict once `runtest` reached one; the report hook gives one to an item pytest ended before that.
        self.verdict: ClaimVerdict | None = None
        _mark_like(self, claim)
        _mark_expected_failure(self, claim)

    def runtest(self) -> None:
        if session_of(self.config).resources.preview is not None:
            pytest.skip(PREVIEW_SKIP)
        verdict = self.verdict = claim_verdict(self)
        if verdict.skipped:
            pytest.skip(verdict.skipped)
        if verdict.outcome is not None:
            self.user_properties.append(("executed", sorted(verdict.outcome.executed or ())))
        if verdict.failure:
            raise ClaimFailed(verdict.failure)
        if verdict.status is Status.XFAILED:
            raise ExpectedClaimFailure(f"{self.where()}: fails as expected: {verdict.expected}")

    def _header(self, verb: str) -> str:
        return claim_header(self.where(), self.claim, verb)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ClaimFailed):
            return str(excinfo.value)
        header = self._header("raised while running its check")
        return header + "\n" + str(super().repr_failure(excinfo, style=style))


class PredictItem(GuideItem):
    """A predict question: its claim must pass, and where the question says where to look (``observe``), the
    guide's answer must be what the run returned on rank 0."""

    def __init__(self, *, guide: Guide, question: PredictQuestion, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.question = question
        self.claim = guide.claim(question.claim)
        self.line = question.start
        _mark_like(self, self.claim)

    def runtest(self) -> None:
        if session_of(self.config).resources.preview is not None:
            pytest.skip(PREVIEW_SKIP)
        verdict = claim_verdict(self, self.claim)
        if verdict.skipped:
            pytest.skip(verdict.skipped)
        head = f"{self.where()}: predict `{self.question.id}`"
        if verdict.status is Status.FAILED or verdict.outcome is None:
            raise ClaimFailed(f"{head}: its claim `{self.claim.id}` did not pass\n{verdict.failure}")
        if self.question.observe is None:
            return
        try:
            seen = observed(verdict.measured, self.question.observe)
        except NotObserved as exc:
            raise ClaimFailed(f"{head}: the run of `{self.claim.id}` returned nothing at {exc}") from None
        self.user_properties.append(("observed", seen))
        if not agrees(self.question, seen):
            raise ClaimFailed(
                f"{head}: the guide answers {self.question.answer!r}; the run of `{self.claim.id}` observed "
                f"{seen!r} at `{self.question.observe}`"
            )
