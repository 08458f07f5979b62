"""A learner's answers, typed at a prompt or read from a file (``predict`` and ``exercise``).

At a prompt, an answer that does not fit the question (a word for a number, a letter that is not a choice) is
refused with the reason and asked again; keys typed before the prompt appeared (while a claim ran) are thrown
away, so they never become the next answer. In a file, such an answer is broken input, named with its id.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rich.console import Console

from reader.format.errors import CommandProblem

INTERRUPTED = 130  # the shell's exit status for a command stopped by Ctrl-C (128 + SIGINT)
Check = Callable[[str], str | None]  # an answer → why it does not fit, or None


class EndOfInput(EOFError):
    """Standard input ended before every question had its answer."""


def read_answers(path: Path | None, ids: list[str], kind: str, checks: dict[str, Check]) -> dict[str, str] | None:
    """The answers in ``path`` (None: none given, they are asked at the prompt), a file (TOML, or JSON by
    suffix) mapping each of ``ids`` (``kind``: "question", "exercise") to an answer; a list becomes a
    comma-separated order. ``checks`` (by id) refuse answers that do not fit. `CommandProblem` says what is
    wrong."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise CommandProblem(f"{path}: cannot read answers ({exc})", f'write TOML: {kind}-id = "answer"') from None
    unknown, missing = sorted(set(data) - set(ids)), [i for i in ids if i not in data]
    if unknown or missing:
        what = f"unknown {kind}(s) {', '.join(unknown)}" if unknown else f"no answer for {', '.join(missing)}"
        raise CommandProblem(f"{path}: {what}", f"answer each of the {kind}s: {', '.join(ids)}")
    answers = {
        key: ", ".join(map(str, value)) if isinstance(value, list) else str(value) for key, value in data.items()
    }
    for key, check in checks.items():
        why = check(answers[key])
        if why is not None:
            raise CommandProblem(f"{path}: {kind} `{key}`: {answers[key]!r} does not fit: {why}",
                                 f"write an answer that fits for `{key}` in {path}")  # fmt: skip
    return answers


def flush_typeahead(stream: TextIO) -> None:
    """Throw away what was typed into a terminal before now (nothing to do for a pipe or a file)."""
    if not stream.isatty():
        return
    with contextlib.suppress(ImportError, OSError, ValueError):
        import termios

        termios.tcflush(stream.fileno(), termios.TCIFLUSH)


def prompt(console: Console, check: Check | None = None, stream: TextIO | None = None) -> str:
    """One answer from standard input: asked again while ``check`` refuses it; `EndOfInput` when input ends."""
    stream = stream if stream is not None else sys.stdin
    while True:
        flush_typeahead(stream)
        console.print("your answer: ", end="")
        line = stream.readline()
        if not line:
            console.print()
            raise EndOfInput
        answer = line.strip()
        if not stream.isatty():  # typed input echoes its own newline; piped input does not
            console.print(answer, highlight=False, markup=False)
        why = check(answer) if check is not None else None
        if why is None:
            return answer
        console.print(f"[yellow]{why}[/]; try again", highlight=False)


def interrupted(console: Console, kept: str) -> int:
    """What Ctrl-C prints (one line, no traceback) and the exit status it gives."""
    console.print(f"\n[yellow]interrupted[/]: {kept}", highlight=False)
    return INTERRUPTED


def stopped(console: Console, ended: str, kept: str) -> int:
    """How questions or exercises that did not all get an answer end: Ctrl-C exits 130 (`interrupted`); input
    that ended first is broken input, a `CommandProblem`. ``kept`` says what was kept of those answered."""
    if ended == "interrupted":
        return interrupted(console, kept)
    raise CommandProblem(f"{ended}: {kept}", "give every answer at the prompt, or all of them in --answers FILE")
