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

INTERRUPTED = 130  # the shell's exit status for a command stopped by Ctrl-C (128 + SIGINT)
Check = Callable[[str], str | None]  # an answer → why it does not fit, or None


class EndOfInput(EOFError):
    """Standard input ended before every question had its answer."""


def read_answers(
    path: Path, ids: list[str], kind: str, console: Console, checks: dict[str, Check] | None = None
) -> dict[str, str] | None:
    """An answers file (TOML, or JSON by suffix) mapping each of ``ids`` (``kind``: "question", "exercise") to
    an answer; a list becomes a comma-separated order. ``checks`` (by id) refuse answers that do not fit. Says what
    is wrong and returns None otherwise."""
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
    answers = {
        key: ", ".join(map(str, value)) if isinstance(value, list) else str(value) for key, value in data.items()
    }
    for key, check in (checks or {}).items():
        why = check(answers[key])
        if why is not None:
            console.print(f"[red]{path}: {kind} `{key}`: {answers[key]!r} does not fit[/]: {why}", highlight=False)
            return None
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
