"""How the study commands run claims: one pool manager per command, and the claims and rank they ask for.

Claims run exactly as ``pytest readings/`` runs them: the one verdict (`reader.claims.verdict.decide`: the same
request, the same judgement), on a `checks.ranks.manager.PoolManager` of this process, started on first use.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.pictures import Pictures
from reader.claims.progress import Progress, ProgressError
from reader.claims.records import record_verdicts
from reader.claims.verdict import ClaimVerdict, decide, gpu_skip
from reader.format.errors import CommandProblem
from reader.format.guide import ClaimSpec, Guide
from reader.study.session import DRIFT, Session, display, open_session

FAILED = DRIFT  # exit 1: a claim failed (README: 0 clean, 1 failed, 2 broken input)


class ClaimRunner:
    """Runs claims of one session on its own pool manager (started on first use, closed on exit)."""

    def __init__(
        self, session: Session, backend: str, timeout: float, *, manager: Any = None, patches: tuple[Any, ...] = ()
    ) -> None:
        self.session = session
        self.backend = backend
        self.timeout = timeout
        self.patches = patches  # break-it patches (exercises, and tests that the reveal comes from the run)
        self._manager = manager  # a caller's PoolManager is used, and left open
        self._owns_manager = manager is None
        self._verdicts: dict[tuple[str, str], ClaimVerdict] = {}

    def verdict(self, guide: Guide, claim: ClaimSpec, overrides: dict[str, Any] | None = None) -> ClaimVerdict:
        """The claim's verdict, run once; with ``overrides`` (some of its kwargs replaced) a run of its own, kept
        apart: it is not the claim's result."""
        if overrides:
            return decide(
                self.session.workspace, guide, claim, self._send, display=display, patches=self.patches,
                overrides=overrides,
            )  # fmt: skip
        key = (guide.id, claim.id)
        if key not in self._verdicts:
            self._verdicts[key] = self._run(guide, claim)
        return self._verdicts[key]

    def _run(self, guide: Guide, claim: ClaimSpec) -> ClaimVerdict:
        return decide(self.session.workspace, guide, claim, self._send, display=display, patches=self.patches)

    def _send(self, request: CheckRequest) -> CheckRun:
        if self._manager is None:
            from checks.ranks.manager import PoolManager  # starts no process until a check runs

            self._manager = PoolManager(backend=self.backend, timeout=self.timeout)
        return self._manager.run(request)

    @contextmanager
    def patched(self, patches: tuple[Any, ...]) -> Iterator[ClaimRunner]:
        """Runs with ``patches`` applied; their verdicts are kept apart from unpatched ones and forgotten after."""
        kept, self._verdicts, self.patches = self._verdicts, {}, patches
        try:
            yield self
        finally:
            self._verdicts, self.patches = kept, ()

    def verdicts(self) -> dict[tuple[str, str], ClaimVerdict]:
        """Every verdict this runner reached, by (guide id, claim id)."""
        return dict(self._verdicts)

    def close(self) -> None:
        if self._manager is not None and self._owns_manager:
            self._manager.close()


@contextmanager
def claim_runner(
    session: Session, args: argparse.Namespace, scores: Progress | None = None, console: Console | None = None
) -> Iterator[ClaimRunner]:
    """``args.manager`` / ``args.patches`` (set by callers in-process, not by the command line) reach the runner.
    On the way out, however it ends (Ctrl-C included), the pool is closed and the claims that finished are
    recorded (`remember`)."""
    runner = ClaimRunner(
        session,
        args.backend,
        args.timeout,
        manager=getattr(args, "manager", None),
        patches=tuple(getattr(args, "patches", ())),
    )
    try:
        yield runner
    finally:
        runner.close()
        remember(runner, scores, console)
        session.workspace.source.close()


def remember(runner: ClaimRunner, scores: Progress | None = None, console: Console | None = None) -> None:
    """Record the result of every claim ``runner`` ran unpatched, with the torch it ran on, for ``list``: into
    ``scores`` (saved by its owner), or into the progress file, saved here. A runner made with break-it patches
    records nothing: those are not the claims' results."""
    if runner.patches:
        return
    owned = scores is None
    try:
        scores = scores if scores is not None else Progress()
    except ProgressError as exc:
        if console is not None:
            console.print(f"[yellow]{exc}[/]")
        return
    torch = runner.session.workspace.torch_version
    drawn = Pictures()
    guides = {g.id: g for g in runner.session.guides}
    ran = [(gid, guides[gid].claim(cid), verdict) for (gid, cid), verdict in runner.verdicts().items()]
    recorded = record_verdicts(ran, torch, scores, drawn)
    if owned and runner.verdicts():
        scores.save()
    if recorded:
        with contextlib.suppress(OSError):  # the pictures are the site's cache: a run never fails over them
            drawn.save()


def pool_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="default: auto")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per claim before its ranks are stopped")


def one_guide(args: argparse.Namespace, console: Console) -> tuple[Session, Guide]:
    """The session of the one guide ``args.guide`` names, on the installed torch, and that guide."""
    args.guide_ids, args.torch_source = [args.guide], None
    session = open_session(args, console)
    return session, session.guides[0]


def open_scores() -> Progress:
    """The learner's progress file, where predict and exercise keep their scores; `CommandProblem` when it is
    unreadable (nothing is overwritten)."""
    try:
        return Progress()
    except ProgressError as exc:
        raise CommandProblem(str(exc).split("; ")[0], "move it away to start afresh") from None


@dataclass(frozen=True)
class RankReading:
    """What one rank's check returned in a run of one claim: for views that draw it (``memory``, ``layout``)."""

    guide: Guide
    verdict: ClaimVerdict
    value: Any


def refuse_view(guide: Guide, claim_id: str, view: str) -> None:
    """`CommandProblem` (with the claims of the guide whose runs it can draw) when ``claim_id`` does not declare
    ``view``: said at once, before anything runs."""
    claim = guide.claim(claim_id)
    if view in claim.views or gpu_skip(claim) is not None:  # a GPU claim is skipped here, as pytest skips it
        return
    able = [c.id for c in guide.claims if view in c.views]
    where = f"pick from the claims of {guide.id} it can draw: {', '.join(able)}" if able else (
        f"no claim of {guide.id} has one: try another guide")  # fmt: skip
    raise CommandProblem(f"{claim_id} has no {view} to draw (its run records none)", where)


def run_for_rank(args: argparse.Namespace, console: Console, view: str) -> RankReading | None:
    """Run ``args.claim`` of ``args.guide`` on the pool and take ``args.rank``'s return value (or, if it failed,
    its `Violation`'s details); None when the claim is skipped here, as pytest skips it (said here: nothing to
    draw, nothing failed). `CommandProblem` when the guide, the claim or the rank is unknown (exit 2) or the claim
    did not run (exit 1)."""
    session, guide = one_guide(args, console)
    pick_claims(guide, [args.claim])
    refuse_view(guide, args.claim, view)
    with claim_runner(session, args) as runner, console.status(f"running claim {args.claim}…", spinner="dots"):
        verdict = runner.verdict(guide, guide.claim(args.claim))
    outcome = verdict.outcome
    if verdict.skipped:
        console.print(f"[yellow]{args.claim} skipped[/]: {verdict.skipped}", highlight=False)
        return None
    if outcome is None or not outcome.results:
        said = f"{args.claim} did not run\n{verdict.failure or ''}".rstrip()
        raise CommandProblem(said, "fix what stopped it (above), then run the view again", code=FAILED)
    # A rank whose check found its claim false returns nothing; what it found is in its `Violation`'s details.
    by_rank = {r.rank: r.value if r.ok else (r.details or {}) for r in outcome.results}
    if args.rank not in by_rank:
        ranks = ", ".join(map(str, sorted(by_rank)))
        raise CommandProblem(f"no rank {args.rank} (ranks: {ranks})", f"give --rank one of {ranks}")
    return RankReading(guide, verdict, by_rank[args.rank])


def pick_claims(guide: Guide, wanted: Sequence[str]) -> list[ClaimSpec]:
    """The claims of ``guide`` that ``wanted`` names (all when it names none); `CommandProblem` for one it has
    not."""
    known = [c.id for c in guide.claims]
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise CommandProblem(f"{guide.id} has no claim {', '.join(unknown)}", f"name one of its claims: "
                             f"{', '.join(known)}")  # fmt: skip
    return [c for c in guide.claims if not wanted or c.id in wanted]
