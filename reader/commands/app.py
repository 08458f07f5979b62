"""``fsdp-readings``: the reading guides from the terminal.

Each subcommand is a ``Command`` (name, help, how to configure its parser, how to run it) in ``COMMANDS``;
adding one (list, show, check, predict, timeline) means writing its two functions and appending it there. Exit
codes: 0 clean, 2 broken input; each command's help gives the rest (``drift``: 6 drift; ``approve``: 1 refused).
A command that finds broken input raises `CommandProblem` where it finds it; its entry point is `guarded`
(``reader.views.problem``), which prints it, once, and exits with its code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from reader.commands import estimate, guides, inspect, path, search, site
from reader.gate import upgrade_gate
from reader.study import check, exercise, layout, memory, predict, timeline


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], int]


COMMANDS: list[Command] = [
    Command("path", "where to start, and the tracks of guides in reading order", path.configure_path, path.run_path),
    Command("list", "the guides, in reading order", guides.configure_list, guides.run_list),
    Command(
        "show",
        "a guide with its torch source quoted live and its notes pinned to the lines",
        guides.configure_show,
        guides.run_show,
    ),
    Command(
        "drift",
        "compare the guides' anchors with the approved source (exit 0 clean, 6 drift, 2 broken)",
        guides.configure_drift,
        guides.run_drift,
    ),
    Command(
        "approve",
        "record the anchors' current torch source as approved, after you re-read the guides",
        guides.configure_approve,
        guides.run_approve,
    ),
    Command("check", "run a guide's claims on the rank pool", check.configure, check.run),
    Command(
        "predict", "answer a guide's predict questions, each revealed by a real run", predict.configure, predict.run
    ),
    Command(
        "exercise", "name the claim a break-it patch makes fail, then watch it fail", exercise.configure, exercise.run
    ),
    Command("memory", "bytes held per category over a step, from a real run", memory.configure, memory.run),
    Command("layout", "a real flat parameter across ranks, as a claim's run read it", layout.configure, layout.run),
    Command(
        "estimate",
        "memory, communication and cost per strategy, and the budget guard",
        estimate.configure,
        estimate.run,
    ),
    Command(
        "inspect",
        "your own model: units, layout, memory, bytes, prefetch and gradients, measured beside the models' prediction",
        inspect.configure,
        inspect.run,
    ),
    Command(
        "upgrade-gate",
        "install other torch releases in venvs of their own and run the guides there, for real; reports per release",
        upgrade_gate.configure,
        upgrade_gate.run,
    ),
    Command(
        "search",
        "the guides, claims, notes, symbols and terms that mention every word given",
        search.configure,
        search.run,
    ),
    Command(
        "site",
        "the guides as a static site: annotated source side by side, each claim's last result (open OUT/index.html)",
        site.configure,
        site.run,
    ),
    Command("glossary", "the words the guides use, defined", path.configure_glossary, path.run_glossary),
    Command(
        "timeline",
        "a claim's FSDP events and collectives in issue order, each with the torch line that issued it",
        timeline.configure,
        timeline.run,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsdp-readings", description="Reading guides over PyTorch FSDP's source.")
    readings_option(parser, default=None)
    parser.set_defaults(run=path.run_path)  # no command: the reading path, where to start
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        readings_option(sub, default=argparse.SUPPRESS)  # also after the command: `show 06 --readings DIR`
        sub.set_defaults(run=command.run)
    return parser


def readings_option(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--readings",
        type=Path,
        default=default,
        metavar="DIR",
        help="directory holding the guides and anchors.lock (default: ./readings, else the checkout's own "
        "beside this install)",
    )


def make_console(**options: Any) -> Console:
    """The console every command prints to (``options`` override, e.g. a file and a width in tests).
    soft_wrap: long paths and commands are printed whole, for copy-paste and CI logs; ``show`` prints its
    guide word-wrapped regardless (`reader.views.guide.print_guide`). Not a terminal (piped, redirected): no
    colour and no escape codes, at the width in ``$COLUMNS`` or 80."""
    return Console(**{"highlight": False, "soft_wrap": True, **options})


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args, console if console is not None else make_console()))


if __name__ == "__main__":
    sys.exit(main())
