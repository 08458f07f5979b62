"""``fsdp-readings exercise GUIDE``: a break-it patch of the guide's own check module, the question which claim
it breaks, then the guide's claims run with the patch to show which fail, and why."""

from __future__ import annotations

import argparse
import importlib
import inspect
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from checks.breakit.patches import SABOTAGE
from reader.claims.verdict import ClaimVerdict
from reader.format.errors import CommandProblem
from reader.study.answers import Check, EndOfInput, prompt, read_answers, stopped
from reader.study.runner import FAILED, claim_runner, one_guide, open_scores, pool_options
from reader.study.session import CLEAN
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings exercise 04-forward-prefetch                each puzzle: read the patch, name the claim it breaks
  fsdp-readings exercise 04-forward-prefetch two-ahead      one exercise
  fsdp-readings exercise 04-forward-prefetch --answers mine.toml   (exercise id = "claim id or letter")

the patched claim then runs on the rank pool and shows its failure; results are kept with the predict scores"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("exercises", nargs="*", metavar="EXERCISE", help="exercise ids (default: all)")
    parser.add_argument("--answers", type=Path, default=None, metavar="FILE", help="answers as TOML or JSON")
    pool_options(parser)


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    from checks.breakit.exercises import exercise_modules, exercises_of  # exercises_of imports torch

    session, guide = one_guide(args, console)
    modules = exercise_modules(claim.check.split(":")[0] for claim in guide.claims)
    available = [exercise for module in modules for exercise in exercises_of(module)]
    known = [e.id for e in available]
    unknown = [e for e in args.exercises if e not in known]
    if not available:
        raise CommandProblem(f"{guide.id} has no exercises", "`fsdp-readings list` counts each guide's exercises")
    if unknown:
        raise CommandProblem(f"{guide.id} has no exercise {', '.join(unknown)}",
                             f"name one of its exercises: {', '.join(known)}")  # fmt: skip
    chosen = [e for e in available if not args.exercises or e.id in args.exercises]
    claims = [c.id for c in guide.claims]
    checks = {e.id: _checker(claims) for e in chosen}
    answers = read_answers(args.answers, list(checks), "exercise", checks)
    scores = open_scores()
    surprises, done, solved, ended = 0, 0, 0, None
    try:
        with claim_runner(session, args, scores, console) as runner:
            for number, exercise in enumerate(chosen, start=1):
                console.print(_puzzle(exercise, claims, number, len(chosen)), soft_wrap=False)
                given = answers[exercise.id] if answers is not None else prompt(console, checks[exercise.id])
                guessed = _claim_named(given, claims)
                status = console.status("running the guide's claims with the patch…", spinner="dots")
                with runner.patched(exercise.patches), status:
                    quick = [claim for claim in guide.claims if "slow" not in claim.markers]
                    verdicts = {claim.id: runner.verdict(guide, claim) for claim in quick}
                failing = [cid for cid, v in verdicts.items() if v.failure]
                main = verdicts[exercise.claim]
                reason = main.outcome.reason if main.outcome is not None else None
                surprises += int(main.failure is None or reason != exercise.reason)
                solution = _solution(exercise, given, guessed, failing=failing, verdicts=verdicts)
                console.print(solution, soft_wrap=False)
                seen = f"failing: {', '.join(failing) or 'none'}"
                scores.record_exercise(guide.id, exercise.id, given, guessed in failing, seen)
                done += 1
                solved += guessed in failing
    except KeyboardInterrupt:
        ended = "interrupted"
    except EndOfInput:
        ended = "end of input"
    scores.save()
    right, tried = scores.score(guide.id, "exercises")
    console.print(f"this attempt: {solved}/{done}")
    console.print(f"exercises: {right}/{tried} on {guide.id}")
    console.print("[dim]the score counts first answers; a retake after a reveal is practice[/]")
    kept = f"{done} of {len(chosen)} exercises done; their results are kept"
    if ended is not None:
        return stopped(console, ended, kept)
    return FAILED if surprises else CLEAN


def _checker(claims: list[str]) -> Check:
    letters = ", ".join(chr(ord("a") + i) for i in range(len(claims)))

    def check(answer: str) -> str | None:
        return None if _claim_named(answer, claims) else f"one of the letters {letters}, or a claim id"

    return check


def _claim_named(given: str, claims: list[str]) -> str | None:
    """A claim id, or its letter in the listed choices."""
    text = given.strip().lower().rstrip(").")
    letters = {chr(ord("a") + i): claim for i, claim in enumerate(claims)}
    return letters.get(text, given.strip() if given.strip() in claims else None)


def _puzzle(exercise: Any, claims: list[str], number: int, total: int) -> Panel:
    parts: list[Any] = [Markdown(exercise.puzzle), Text("the patch:", style="bold")]
    parts += [patch_view(patch) for patch in exercise.patches]
    parts.append(Text("Which claim of this guide fails, and why?"))
    parts += [Text(f"  {chr(ord('a') + i)}) {claim}") for i, claim in enumerate(claims)]
    return Panel(Group(*parts), title=f"exercise {number}/{total} · {exercise.id}", title_align="left")


def _solution(
    exercise: Any, given: str, guessed: str | None, *, failing: list[str], verdicts: dict[str, ClaimVerdict]
) -> Table:
    """Right when the guessed claim is among those the patch makes fail. Why: the picked claim's failure (its
    reason and its check's whole message) when it failed, then the exercise's own claim's, if that is another."""
    table = Table(show_header=False, box=None, expand=True, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1, overflow="fold")
    mark = ("right", "green") if guessed in failing else ("not quite", "red")
    table.add_row("you", Text.assemble(given or "(no answer)", "  ", mark))
    table.add_row("failing", Text(", ".join(failing) or "none", style="cyan"))
    main = verdicts[exercise.claim]
    if main.failure is None:
        table.add_row("warning", Text(f"{exercise.claim} still passed: the exercise is stale", style="red"))
    explained = [c for c in dict.fromkeys([guessed, exercise.claim]) if c in failing]
    if guessed is not None and guessed not in failing:
        table.add_row("why", Text(f"{guessed} still holds under this patch", style="yellow"))
    for claim in explained:
        verdict = verdicts[claim]
        reason = verdict.outcome.reason if verdict.outcome is not None else None
        table.add_row("why", Text(f"{claim}: reason `{reason}`", style="cyan"))
        table.add_row("", Text(_message(verdict)))
    if main.failure is not None and main.outcome is not None and main.outcome.reason != exercise.reason:
        table.add_row("warning", Text(f"expected reason `{exercise.reason}` for {exercise.claim}", style="red"))
    return table


MESSAGE_LINES = 14  # of a check's message: enough for its comparison table, not a whole traceback


def _message(verdict: ClaimVerdict) -> str:
    """What the check said, whole (a Violation's message continues on the lines after its first), on the lowest
    rank that said it; else the verdict's own failure text."""
    said = next((r.message for r in verdict.outcome.failed if r.message), "") if verdict.outcome else ""
    lines = (said or verdict.failure or "").rstrip().splitlines()
    shown = lines[:MESSAGE_LINES]
    if len(lines) > MESSAGE_LINES:
        shown.append(f"... ({len(lines) - MESSAGE_LINES} more lines: fsdp-readings check shows them all)")
    return "\n".join(shown)


def patch_view(patch: Any) -> RenderableType:
    """What a break-it patch does to torch: the recipe's own code, or in words for the generic ones."""
    target = patch.target.replace(":", ".")
    factory = patch.factory.rpartition(":")[2]
    generic = {
        "noop": f"`{target}` is replaced by a function that does nothing",
        "returns": f"`{target}` returns {patch.params.get('value')!r} without running",
        "value": f"`{target}` is set to {patch.params.get('value')!r}",
    }
    if patch.factory.startswith(SABOTAGE) and factory in generic:
        return Text(generic[factory])
    recipe = patch.params["wrapper"] if factory == "wrapped_by" else patch.factory
    verb = "each call goes through" if factory == "wrapped_by" else "is replaced by what this builds"
    module, _, name = recipe.partition(":")
    try:
        code = inspect.getsource(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, OSError, TypeError):
        return Text(f"`{target}`: {verb} {recipe}")
    return Group(
        Text(f"`{target}`: {verb} `{name}` ({module}):"),
        Syntax(code.rstrip(), "python", theme="ansi_dark", background_color="default", word_wrap=True),
    )
