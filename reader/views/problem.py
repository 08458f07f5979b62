"""A command's broken input, as the terminal shows it: `print_problem` prints a `CommandProblem` (what is wrong,
its details, then ``fix:``, as a guide's problems read), and `guarded` makes a command's entry point print the
problem it raises, once, and exit with its code. Every command's entry point is guarded (the app's test holds
them to it), so a problem is raised where it is found and worded in one place."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from reader.format.errors import CommandProblem
from reader.views.fit import indented

Run = Callable[[argparse.Namespace, Console], int]


def print_problem(console: Console, problem: CommandProblem) -> None:
    """The first line of the problem in red, its details as they are, then its fix wrapped under it. Printed as
    text: a message quotes guides and answers, never markup."""
    what, *details = problem.message.split("\n")
    console.print(Text(what, style="red"))
    for line in details:
        console.print(Text(line))
    if problem.fix:
        console.print(indented(f"fix: {problem.fix}", console.width, indent="    "))


def guarded(run: Run) -> Run:
    """``run``, with the `CommandProblem` it raises printed (`print_problem`) and its code returned."""

    @functools.wraps(run)
    def run_guarded(args: argparse.Namespace, console: Console) -> int:
        try:
            return run(args, console)
        except CommandProblem as problem:
            print_problem(console, problem)
            return problem.code

    run_guarded.guarded = True  # type: ignore[attr-defined]
    return run_guarded
