"""``fsdp-readings predict GUIDE``: the guide's predict questions, each answered, then revealed by a real run of
its claim, next to the learner's answer and the guide's."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from reader.format.errors import CommandProblem
from reader.format.guide import Guide
from reader.format.predict import (
    LISTS,
    NotObserved,
    PredictQuestion,
    agrees,
    invalid,
    observed,
    order_difference,
    parse_answer,
)
from reader.study.answers import Check, EndOfInput, prompt, read_answers, stopped
from reader.study.runner import FAILED, ClaimRunner, claim_runner, one_guide, open_scores, pool_options
from reader.study.session import CLEAN
from reader.views.path import print_read_next
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings predict 04-forward-prefetch                 asks each question, then runs its claim
  fsdp-readings predict 04-forward-prefetch --answers my-answers.toml
      (no terminal needed: question id = "answer", e.g.  reversed-order = "root -> blocks.0")
  fsdp-readings predict 04-forward-prefetch --no-run        reveal the guide's answers without running

scores are kept in the user data directory (platformdirs; $FSDP_READINGS_DATA_DIR overrides), never here"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
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


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    session, guide = one_guide(args, console)
    questions = guide.regions_of(PredictQuestion)
    if not questions:
        raise CommandProblem(f"{guide.id} has no predict questions", "`fsdp-readings path` lists the guides")
    checks = {q.id: _checker(q) for q in questions}
    answers = read_answers(args.answers, list(checks), "question", checks)
    scores = open_scores()
    reveals: list[Reveal] = []
    ended: str | None = None
    try:
        with claim_runner(session, args, scores, console) as runner:
            for number, question in enumerate(questions, start=1):
                console.print(_ask(question, number, len(questions)), soft_wrap=False)
                given = answers[question.id] if answers is not None else prompt(console, checks[question.id])
                with console.status(f"running claim {question.claim}…", spinner="dots"):
                    reveal = _reveal(question, given, None if args.no_run else runner, guide)
                console.print(_revealed(reveal), soft_wrap=False)
                scores.record(guide.id, question.id, given, reveal.correct, reveal.observed)
                reveals.append(reveal)
    except KeyboardInterrupt:
        ended = "interrupted"
    except EndOfInput:
        ended = "end of input"
    scores.save()
    right, scored = scores.score(guide.id)
    graded = [r for r in reveals if r.correct is not None]
    console.print(f"this attempt: {sum(bool(r.correct) for r in graded)}/{len(graded)}")
    console.print(f"score: {right}/{scored} on {guide.id}")
    console.print("[dim]the score counts first answers; a retake after a reveal is practice[/]")
    console.print(Text(f"saved to {scores.path}", style="dim", overflow="fold"), soft_wrap=False)
    kept = f"{len(reveals)} of {len(questions)} questions answered; their scores are kept"
    if ended is not None:
        return stopped(console, ended, kept)
    print_read_next(console, guide.id)
    return FAILED if any(r.failure for r in reveals) else CLEAN


def _checker(question: PredictQuestion) -> Check:
    return lambda answer: invalid(question, answer)


def _ask(question: PredictQuestion, number: int, total: int) -> Panel:
    parts: list[Any] = [Markdown(question.question)]
    parts += [Text(f"  {chr(ord('a') + i)}) {choice}") for i, choice in enumerate(question.choices)]
    hint = {
        "number": "a number (3528, 3,528 or 206352 bytes)",
        "order": "the items in order, separated by commas or spaces",
        "set": "the items in any order, separated by commas or spaces",
        "choice": "a letter or the choice",
    }
    parts.append(Text(f"answer with {hint.get(question.kind, 'a sentence')}", style="dim"))
    return Panel(Group(*parts), title=f"{number}/{total} · {question.id}", title_align="left")


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
        seen = observed(verdict.measured, path)
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
    guide_answer = ", ".join(question.answer) if question.kind in LISTS else str(question.answer)
    shown = ", ".join(map(str, reveal.observed)) if isinstance(reveal.observed, list) else str(reveal.observed)
    verdict = {True: ("right", "green"), False: ("not quite", "red"), None: ("compare", "yellow")}[reveal.correct]
    table = Table(show_header=False, box=None, expand=True, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1, overflow="fold")
    table.add_row("you", Text.assemble(reveal.given or "(no answer)", "  ", (verdict[0], verdict[1])))
    if question.kind in LISTS and reveal.correct is False:
        missing, extra = order_difference(question, parse_answer(question, reveal.given))
        if missing or extra:
            table.add_row("", Text(_difference(missing, extra), style="red"))
        elif question.kind == "order":
            table.add_row("", Text("the same items, in another order", style="red"))
    table.add_row("the guide", guide_answer)
    table.add_row("observed", Text(shown, style="cyan"))
    table.add_row("why", Markdown(question.explain))
    if reveal.failure:
        table.add_row("warning", Text(reveal.failure.splitlines()[0], style="red"))
    return table


def _difference(missing: list[str], extra: list[str]) -> str:
    parts = [f"missing: {', '.join(missing)}"] if missing else []
    parts += [f"not in the answer: {', '.join(extra)}"] if extra else []
    return "; ".join(parts)
