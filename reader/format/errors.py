"""Broken input: a problem in a guide, pinned to a line of the guide and paired with the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Set
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a guide (or the lock): where, what, and how to fix it."""

    path: Path
    line: int  # 1-based line in the file the person edits (the .md, or the lock)
    message: str
    fix: str

    def render(self, display_path: str | None = None) -> str:
        where = display_path if display_path is not None else str(self.path)
        return f"{where}:{self.line}: {self.message}\n    fix: {self.fix}"


class GuideError(Exception):
    """A guide that cannot be collected. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        assert problems, "a GuideError needs at least one problem"
        self.problems = sorted(problems, key=lambda p: p.line)
        super().__init__(self.render())

    @classmethod
    def at(cls, path: Path, line: int, message: str, fix: str) -> GuideError:
        return cls([Problem(path, line, message, fix)])

    def render(self, display_path: str | None = None) -> str:
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in {display_path or self.problems[0].path}"
        return "\n".join([head, *(p.render(display_path) for p in self.problems)])


class Problems:
    """The problems found in one file so far: parsing goes on after the first, so the author sees them all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: list[Problem] = []

    def add(self, line: int, message: str, fix: str) -> None:
        self.found.append(Problem(self.path, line, message, fix))

    def __bool__(self) -> bool:
        return bool(self.found)


def did_you_mean(name: str, names: Iterable[str]) -> str | None:
    """``did you mean `x`?`` for the closest of ``names``, or None when none is close."""
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f"did you mean `{close[0]}`?" if close else None


def anchor_fix(name: str, names: Set[str]) -> str:
    """The fix for a reference to ``name``, which is not one of the guide's anchor ``names``."""
    close = did_you_mean(name, names)
    if close:
        return close
    return f"use one of this guide's anchors: {', '.join(sorted(names))}" if names else "declare it under [[anchors]]"


class CommandProblem(Exception):
    """Broken input to an ``fsdp-readings`` command (an unknown guide, claim or rank; an unreadable answers file):
    raised where it is found, printed once by the app (``reader.commands.app``) in the words a guide's problems
    use, what is wrong and then ``fix:``, and the command exits with ``code`` (2, broken input, unless said).

    ``message``'s first line says what is wrong; any further lines are its details (a guide's own problems, the
    guides to choose from), printed as they are."""

    def __init__(self, message: str, fix: str = "", *, code: int = 2) -> None:
        self.message = message
        self.fix = fix
        self.code = code
        super().__init__(self.render())

    def render(self) -> str:
        return f"{self.message}\n    fix: {self.fix}" if self.fix else self.message
