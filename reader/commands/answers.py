"""A learner's answers, typed at a prompt or read from a file (``predict`` and ``exercise``)."""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from rich.console import Console


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


def prompt(console: Console, read: Callable[[], str] = sys.stdin.readline) -> str:
    console.print("your answer: ", end="")
    answer = read().strip()
    if not sys.stdin.isatty():  # typed input echoes its own newline; piped input does not
        console.print(answer, highlight=False, markup=False)
    return answer
