"""Broken input to a command is raised where it is found (`CommandProblem`: message, fix, exit code) and printed
once, by the command's guarded entry point: what is wrong, its details, then ``fix:``, as a guide's problems
read."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from reader.commands.app import COMMANDS, build_parser, main, make_console
from reader.format.errors import CommandProblem
from reader.gate.outcome import Outcome
from reader.views.problem import guarded

READINGS = Path(__file__).resolve().parents[2] / "readings"


def _printed(run: object, width: int = 80) -> tuple[int, str]:
    console = make_console(record=True, width=width, force_terminal=False, color_system=None)
    code = guarded(run)(argparse.Namespace(), console)  # type: ignore[arg-type]
    return code, console.export_text()


def test_a_problem_is_printed_once_with_its_details_and_fix_and_exits_with_its_code() -> None:
    def refuses(args: argparse.Namespace, console: Console) -> int:
        raise CommandProblem("04 has no claim nope\n  claims: a, b", "name one of its claims: a, b")

    code, out = _printed(refuses)
    assert code == Outcome.BROKEN.code == CommandProblem("x").code  # broken input, as every front end says it
    assert out.splitlines() == ["04 has no claim nope", "  claims: a, b", "    fix: name one of its claims: a, b"]

    def fails(args: argparse.Namespace, console: Console) -> int:
        raise CommandProblem("c did not run", code=Outcome.BEHAVIOUR.code)

    assert _printed(fails) == (1, "c did not run\n")


def test_a_long_fix_is_wrapped_under_its_problem_without_breaking_a_word() -> None:
    ids = ", ".join(f"{n:02d}-a-guide-id" for n in range(12))

    def unknown(args: argparse.Namespace, console: Console) -> int:
        raise CommandProblem("unknown guide id: 99", f"name one of the guides: {ids}")

    _, out = _printed(unknown, width=60)
    lines = out.splitlines()
    assert all(len(line) <= 60 and line.startswith("    ") for line in lines[1:]) and len(lines) > 2
    assert " ".join(" ".join(lines[1:]).split()) == f"fix: name one of the guides: {ids}"


def test_a_real_command_says_its_problem_once() -> None:
    console = make_console(record=True, width=200, force_terminal=False, color_system=None)
    code = main(["--readings", str(READINGS), "check", "04-forward-prefetch", "no-such-claim"], console)
    out = console.export_text()
    assert code == 2 and out.count("has no claim no-such-claim") == 1, out
    assert "    fix: name one of its claims: " in out and "follows-iteration-1-order" in out


def test_every_command_that_can_raise_a_problem_is_guarded() -> None:
    # upgrade-gate lives in the gate room, below the views: it raises no CommandProblem, and says its own.
    unguarded = [c.name for c in COMMANDS if not getattr(c.run, "guarded", False) and c.name != "upgrade-gate"]
    assert unguarded == []
    assert getattr(build_parser().parse_args([]).run, "guarded", False)  # no command: the path
