"""Self-study commands: ``fsdp-readings check`` runs a guide's claims on the rank pool; ``fsdp-readings predict``
asks the guide's predict questions, runs the claim behind each, and shows what the installed torch did next to
the learner's answer and the guide's.

Claims run exactly as ``pytest readings/`` runs them: the same request (`reader.evidence.traced_request`), the
same verdict (`reader.verdict.judge`), on a `checks.ranks.manager.PoolManager` of this process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from reader.cli_session import BROKEN, CLEAN, DRIFT, Session, display, open_session
from reader.evidence import UnresolvedAnchors, traced_request
from reader.failures import blocked_claim
from reader.guide import ClaimSpec, Guide
from reader.predict import NotObserved, PredictQuestion, agrees, observed, parse_answer
from reader.progress import Progress as Scores
from reader.progress import ProgressError
from reader.properties import run_claim
from reader.verdict import ClaimVerdict, judge, observed_run, version_skip, with_example

FAILED = DRIFT  # exit 1: a claim failed (README: 0 clean, 1 failed, 2 broken input)

CHECK_EXAMPLES = """examples:
  fsdp-readings check 04-forward-prefetch                   every claim of guide 04, on the rank pool
  fsdp-readings check 04-forward-prefetch stale-order-after-change
  fsdp-readings check 03-unshard-reshard --backend gloo --timeout 120

exit status: 0 every claim passed, 1 a claim failed, 2 broken input (unknown guide or claim)"""

PREDICT_EXAMPLES = """examples:
  fsdp-readings predict 04-forward-prefetch                 asks each question, then runs its claim
  fsdp-readings predict 04-forward-prefetch --answers my-answers.toml
      (no terminal needed: question id = "answer", e.g.  reversed-order = "root -> blocks.0")
  fsdp-readings predict 04-forward-prefetch --no-run        reveal the guide's answers without running

scores are kept in the user data directory (platformdirs; $FSDP_READINGS_DATA_DIR overrides), never here"""


# --- running claims -------------------------------------------------------------------------------------------


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

    def verdict(self, guide: Guide, claim: ClaimSpec) -> ClaimVerdict:
        key = (guide.id, claim.id)
        if key not in self._verdicts:
            self._verdicts[key] = self._run(guide, claim)
        return self._verdicts[key]

    def _run(self, guide: Guide, claim: ClaimSpec) -> ClaimVerdict:
        where = f"{display(guide.path)}:{claim.line}"
        skip = version_skip(claim, self.session.workspace.torch_version)
        if skip is not None:
            return ClaimVerdict(None, skipped=skip)
        try:
            request, resolutions = traced_request(self.session.workspace, guide, claim, patches=self.patches)
        except UnresolvedAnchors as exc:
            return ClaimVerdict(None, blocked_claim(where, display(guide.path), guide, claim, exc.failed))
        if self._manager is None:
            from checks.ranks.manager import PoolManager  # starts no process until a check runs

            self._manager = PoolManager(backend=self.backend, timeout=self.timeout)
        run = run_claim(claim, request, self._manager.run)
        return with_example(judge(run.outcome, where, guide, claim, resolutions), run)

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
def claim_runner(session: Session, args: argparse.Namespace) -> Iterator[ClaimRunner]:
    """``args.manager`` / ``args.patches`` (set by callers in-process, not by the command line) reach the runner."""
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
        session.workspace.source.close()


def pool_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="default: auto")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per claim before its ranks are stopped")


def one_guide(args: argparse.Namespace, console: Console) -> tuple[Session, Guide] | int:
    args.guide_ids, args.torch_source = [args.guide], None
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    return session, session.guides[0]


# --- check ------------------------------------------------------------------------------------------------------


def configure_check(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = CHECK_EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("claims", nargs="*", metavar="CLAIM", help="claim ids (default: every claim but slow ones)")
    parser.add_argument("--slow", action="store_true", help="with no CLAIM, also run claims marked slow")
    pool_options(parser)


def run_check(args: argparse.Namespace, console: Console) -> int:
    opened = one_guide(args, console)
    if isinstance(opened, int):
        return opened
    session, guide = opened
    claims = pick_claims(guide, args.claims, console)
    if claims is None:
        return BROKEN
    if not args.claims and not args.slow:  # a claim named on the command line runs, slow or not
        slow = [c.id for c in claims if "slow" in c.markers]
        claims = [c for c in claims if "slow" not in c.markers]
        if slow:
            console.print(f"[dim]not running {len(slow)} slow claim(s) ({', '.join(slow)}): --slow runs them[/]")
    rows: list[tuple[ClaimSpec, ClaimVerdict, float]] = []
    with claim_runner(session, args) as runner, _progress(console) as progress:
        task = progress.add_task(guide.id, total=len(claims))
        for claim in claims:
            progress.update(task, description=claim.id)
            started = time.monotonic()
            rows.append((claim, runner.verdict(guide, claim), time.monotonic() - started))
            progress.advance(task)
    console.print(_results(guide, rows), soft_wrap=False)
    _remember_claims(guide, rows, console)
    for claim, verdict, _ in rows:
        if verdict.failure:
            console.print(Panel(Text(verdict.failure), title=f"{claim.id} failed", border_style="red"), soft_wrap=False)
    counts = Counter(v.status.value for _, v, _ in rows)
    shown = [s for s in ("passed", "xfailed", "xpassed", "skipped", "failed") if counts[s] or s in ("passed", "failed")]
    console.print(", ".join(f"{counts[s]} {s}" for s in shown))
    return FAILED if counts["failed"] else CLEAN


def _remember_claims(guide: Guide, rows: list[tuple[ClaimSpec, ClaimVerdict, float]], console: Console) -> None:
    """The last result of each claim, for ``fsdp-readings list``."""
    try:
        scores = Scores()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        return
    for claim, verdict, _ in rows:
        scores.record_claim(guide.id, claim.id, _result(verdict))
    scores.save()


def _result(verdict: ClaimVerdict) -> str:
    return verdict.status.value


@dataclass(frozen=True)
class RankReading:
    """What one rank's check returned in a run of one claim: for views that draw it (``memory``, ``layout``)."""

    guide: Guide
    verdict: ClaimVerdict
    value: Any


def run_for_rank(args: argparse.Namespace, console: Console) -> RankReading | int:
    """Run ``args.claim`` of ``args.guide`` on the pool and take ``args.rank``'s return value (or, if it failed,
    its `Violation`'s details); an exit code (with the reason printed) when the guide or claim is unknown, the claim
    did not run, or there is no such rank."""
    opened = one_guide(args, console)
    if isinstance(opened, int):
        return opened
    session, guide = opened
    if pick_claims(guide, [args.claim], console) is None:
        return BROKEN
    with claim_runner(session, args) as runner, console.status(f"running claim {args.claim}…", spinner="dots"):
        verdict = runner.verdict(guide, guide.claim(args.claim))
    outcome = verdict.outcome
    if outcome is None or not outcome.results:
        console.print(f"[red]{args.claim} did not run[/]\n{verdict.failure or verdict.skipped or ''}")
        return FAILED
    # A rank whose check found its claim false returns nothing; what it found is in its `Violation`'s details.
    by_rank = {r.rank: r.value if r.ok else (r.details or {}) for r in outcome.results}
    if args.rank not in by_rank:
        console.print(f"[red]no rank {args.rank}[/] (ranks: {', '.join(map(str, sorted(by_rank)))})")
        return BROKEN
    return RankReading(guide, verdict, by_rank[args.rank])


def pick_claims(guide: Guide, wanted: Sequence[str], console: Console) -> list[ClaimSpec] | None:
    known = [c.id for c in guide.claims]
    unknown = [c for c in wanted if c not in known]
    if unknown:
        console.print(f"[red]{guide.id} has no claim {', '.join(unknown)}[/] (claims: {', '.join(known)})")
        return None
    return [c for c in guide.claims if not wanted or c.id in wanted]


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        yield progress


RESULT_STYLES = {"skipped": "yellow", "failed": "red", "passed": "green", "xfailed": "cyan", "xpassed": "yellow"}


def _results(guide: Guide, rows: list[tuple[ClaimSpec, ClaimVerdict, float]]) -> Table:
    table = Table(title=f"claims of {guide.id}", title_justify="left", expand=True)
    table.add_column("claim", ratio=3, overflow="fold")
    table.add_column("ranks", justify="right")
    table.add_column("result")
    table.add_column("s", justify="right")
    for claim, verdict, seconds in rows:
        result = _result(verdict)
        style = RESULT_STYLES[result]
        shown = Text(result.upper() if result == "failed" else result, style=style)
        table.add_row(claim.id, str(claim.world_size), shown, f"{seconds:.1f}")
    return table


# --- predict ----------------------------------------------------------------------------------------------------


def configure_predict(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = PREDICT_EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("--answers", type=Path, default=None, metavar="FILE", help="answers as TOML or JSON")
    parser.add_argument("--no-run", action="store_true", help="reveal the guide's answers without running claims")
    pool_options(parser)


@dataclass(frozen=True)
class Reveal:
    question: PredictQuestion
    given: str
    correct: bool | None  # None: a text answer, for the learner to compare
    observed: Any  # what the run showed: the value at `observe`, else the claim's verdict
    failure: str | None


def run_predict(args: argparse.Namespace, console: Console) -> int:
    opened = one_guide(args, console)
    if isinstance(opened, int):
        return opened
    session, guide = opened
    questions = guide.regions_of(PredictQuestion)
    if not questions:
        console.print(f"[red]{guide.id} has no predict questions[/]")
        return BROKEN
    answers = read_answers(args.answers, [q.id for q in questions], "question", console) if args.answers else None
    if args.answers and answers is None:
        return BROKEN
    try:
        scores = Scores()
    except ProgressError as exc:
        console.print(f"[red]{exc}[/]")
        return BROKEN
    reveals: list[Reveal] = []
    with claim_runner(session, args) as runner:
        for number, question in enumerate(questions, start=1):
            console.print(_ask(question, number, len(questions)), soft_wrap=False)
            given = answers[question.id] if answers is not None else _prompt(console)
            with console.status(f"running claim {question.claim}…", spinner="dots"):
                reveal = _reveal(question, given, None if args.no_run else runner, guide)
            console.print(_revealed(reveal), soft_wrap=False)
            scores.record(guide.id, question.id, given, reveal.correct, reveal.observed)
            reveals.append(reveal)
        for (guide_id, claim_id), verdict in runner.verdicts().items():  # unpatched runs: what `list` shows
            scores.record_claim(guide_id, claim_id, _result(verdict))
    scores.save()
    right, scored = scores.score(guide.id)
    console.print(f"score: {right}/{scored} on {guide.id}")
    console.print(Text(f"saved to {scores.path}", style="dim", overflow="fold"), soft_wrap=False)
    return FAILED if any(r.failure for r in reveals) else CLEAN


def read_answers(path: Path, ids: list[str], kind: str, console: Console) -> dict[str, str] | None:
    """An answers file (TOML, or JSON by suffix) mapping each of ``ids`` (``kind``: "question", "exercise") to
    an answer; a list becomes a comma-separated order. Says what is wrong and returns None otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        console.print(f'[red]{path}: cannot read answers ({exc})[/] (write TOML: {kind}-id = "answer")')
        return None
    unknown, missing = sorted(set(data) - set(ids)), [i for i in ids if i not in data]
    if unknown or missing:
        what = f"unknown {kind}(s) {', '.join(unknown)}" if unknown else f"no answer for {', '.join(missing)}"
        console.print(f"[red]{path}: {what}[/] ({kind}s: {', '.join(ids)})")
        return None
    return {key: ", ".join(map(str, value)) if isinstance(value, list) else str(value) for key, value in data.items()}


def _ask(question: PredictQuestion, number: int, total: int) -> Panel:
    parts: list[Any] = [Markdown(question.question)]
    parts += [Text(f"  {chr(ord('a') + i)}) {choice}") for i, choice in enumerate(question.choices)]
    hint = {"number": "a number", "order": "items separated by commas", "choice": "a letter or the choice"}
    parts.append(Text(f"answer with {hint.get(question.kind, 'a sentence')}", style="dim"))
    return Panel(Group(*parts), title=f"{number}/{total} · {question.id}", title_align="left")


def _prompt(console: Console, read: Callable[[], str] = sys.stdin.readline) -> str:
    console.print("your answer: ", end="")
    answer = read().strip()
    if not sys.stdin.isatty():  # typed input echoes its own newline; piped input does not
        console.print(answer, highlight=False, markup=False)
    return answer


def _reveal(question: PredictQuestion, given: str, runner: ClaimRunner | None, guide: Guide) -> Reveal:
    parsed = parse_answer(question, given)
    correct = None if question.kind == "text" else agrees(question, parsed)
    if runner is None:
        return Reveal(question, given, correct, "not run (--no-run)", None)
    verdict = runner.verdict(guide, guide.claim(question.claim))
    if verdict.skipped:
        return Reveal(question, given, correct, f"not run here: {verdict.skipped}", None)
    if verdict.failure or verdict.outcome is None:
        return Reveal(question, given, correct, f"claim {question.claim} FAILED", verdict.failure)
    path = question.observe or question.show
    if path is None:
        return Reveal(question, given, correct, f"claim {question.claim} passed", None)
    try:
        seen = observed(observed_run(verdict), path)
    except NotObserved as exc:
        return Reveal(question, given, correct, f"nothing at {exc}", f"the run returned nothing at {exc}")
    # The run, not the guide, is the truth: score against what torch did when it disagrees with the guide.
    if question.observe is not None and not agrees(question, seen):
        failure = f"the guide answers {question.answer!r}, but this torch gave {seen!r}"
        return Reveal(question, given, _same(question, parsed, seen), seen, failure)
    return Reveal(question, given, correct, seen, None)


def _same(question: PredictQuestion, parsed: Any, seen: Any) -> bool:
    return agrees(replace(question, answer=seen), parsed)


def _revealed(reveal: Reveal) -> Table:
    question = reveal.question
    guide_answer = ", ".join(question.answer) if question.kind == "order" else str(question.answer)
    shown = ", ".join(map(str, reveal.observed)) if isinstance(reveal.observed, list) else str(reveal.observed)
    verdict = {True: ("right", "green"), False: ("not quite", "red"), None: ("compare", "yellow")}[reveal.correct]
    table = Table(show_header=False, box=None, expand=True, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1, overflow="fold")
    table.add_row("you", Text.assemble(reveal.given or "(no answer)", "  ", (verdict[0], verdict[1])))
    table.add_row("the guide", guide_answer)
    table.add_row("observed", Text(shown, style="cyan"))
    table.add_row("why", Markdown(question.explain))
    if reveal.failure:
        table.add_row("warning", Text(reveal.failure.splitlines()[0], style="red"))
    return table


# --- exercise ---------------------------------------------------------------------------------------------------

EXERCISE_EXAMPLES = """examples:
  fsdp-readings exercise 04-forward-prefetch                each puzzle: read the patch, name the claim it breaks
  fsdp-readings exercise 04-forward-prefetch two-ahead      one exercise
  fsdp-readings exercise 04-forward-prefetch --answers mine.toml   (exercise id = "claim id or letter")

the patched claim then runs on the rank pool and shows its failure; results are kept with the predict scores"""


def configure_exercise(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXERCISE_EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("exercises", nargs="*", metavar="EXERCISE", help="exercise ids (default: all)")
    parser.add_argument("--answers", type=Path, default=None, metavar="FILE", help="answers as TOML or JSON")
    pool_options(parser)


def run_exercise(args: argparse.Namespace, console: Console) -> int:
    from checks.breakit.exercises import exercises_of  # imports the guide's check module (and torch)

    opened = one_guide(args, console)
    if isinstance(opened, int):
        return opened
    session, guide = opened
    modules = sorted({claim.check.split(":")[0] for claim in guide.claims})
    available = [exercise for module in modules for exercise in exercises_of(module)]
    known = [e.id for e in available]
    unknown = [e for e in args.exercises if e not in known]
    if not available or unknown:
        what = f"no exercise {', '.join(unknown)}" if unknown else "no exercises"
        console.print(f"[red]{guide.id} has {what}[/] (exercises: {', '.join(known) or 'none'})")
        return BROKEN
    chosen = [e for e in available if not args.exercises or e.id in args.exercises]
    answers = read_answers(args.answers, [e.id for e in chosen], "exercise", console) if args.answers else None
    if args.answers and answers is None:
        return BROKEN
    try:
        scores = Scores()
    except ProgressError as exc:
        console.print(f"[red]{exc}[/]")
        return BROKEN
    claims = [c.id for c in guide.claims]
    surprises = 0
    with claim_runner(session, args) as runner:
        for number, exercise in enumerate(chosen, start=1):
            console.print(_puzzle(exercise, claims, number, len(chosen)), soft_wrap=False)
            given = answers[exercise.id] if answers is not None else _prompt(console)
            guessed = _claim_named(given, claims)
            status = console.status("running the guide's claims with the patch…", spinner="dots")
            with runner.patched(exercise.patches), status:
                quick = [claim for claim in guide.claims if "slow" not in claim.markers]
                verdicts = {claim.id: runner.verdict(guide, claim) for claim in quick}
            failing = [cid for cid, v in verdicts.items() if v.failure]
            main = verdicts[exercise.claim]
            reason = main.outcome.reason if main.outcome is not None else None
            surprises += int(main.failure is None or reason != exercise.reason)
            solution = _solution(exercise, given, guessed, failing=failing, main=main, reason=reason)
            console.print(solution, soft_wrap=False)
            seen = f"failing: {', '.join(failing) or 'none'}"
            scores.record_exercise(guide.id, exercise.id, given, guessed in failing, seen)
    scores.save()
    right, tried = scores.score(guide.id, "exercises")
    console.print(f"exercises: {right}/{tried} on {guide.id}")
    return FAILED if surprises else CLEAN


def _claim_named(given: str, claims: list[str]) -> str | None:
    """A claim id, or its letter in the listed choices."""
    text = given.strip().lower().rstrip(").")
    letters = {chr(ord("a") + i): claim for i, claim in enumerate(claims)}
    return letters.get(text, given.strip() if given.strip() in claims else None)


def _puzzle(exercise: Any, claims: list[str], number: int, total: int) -> Panel:
    targets = ", ".join(dict.fromkeys(p.target.replace(":", ".") for p in exercise.patches))
    parts: list[Any] = [
        Markdown(exercise.puzzle),
        Text.assemble(("patched: ", "dim"), (targets, "dim"), overflow="fold"),
        Text("Which claim of this guide fails, and why?"),
    ]
    parts += [Text(f"  {chr(ord('a') + i)}) {claim}") for i, claim in enumerate(claims)]
    return Panel(Group(*parts), title=f"exercise {number}/{total} · {exercise.id}", title_align="left")


def _solution(
    exercise: Any, given: str, guessed: str | None, *, failing: list[str], main: ClaimVerdict, reason: str | None
) -> Table:
    """Right when the guessed claim is among those the patch makes fail; the exercise's own claim shows why."""
    table = Table(show_header=False, box=None, expand=True, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1, overflow="fold")
    mark = ("right", "green") if guessed in failing else ("not quite", "red")
    table.add_row("you", Text.assemble(given or "(no answer)", "  ", mark))
    table.add_row("failing", Text(", ".join(failing) or "none", style="cyan"))
    if main.failure is None:
        table.add_row("warning", Text(f"{exercise.claim} still passed: the exercise is stale", style="red"))
        return table
    first = next((r.message for r in main.outcome.failed if r.message), "") if main.outcome else ""
    table.add_row("why", Text(f"{exercise.claim}: reason `{reason}`", style="cyan"))
    table.add_row("message", Text(first.splitlines()[0] if first else main.failure.splitlines()[0]))
    if reason != exercise.reason:
        table.add_row("warning", Text(f"expected reason `{exercise.reason}`", style="red"))
    return table
