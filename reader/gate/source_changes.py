"""A source approved on a later release, stored as its changes to the source before it.

The lock keeps an anchor's oldest approved source whole and each later one as the lines that differ, so the
lock's diff for an approval is the torch change itself. The changes are unified-diff hunks without context, in
torch's own line numbers (``@@ -1620,2 +1650,3 @@``, then ``-`` and ``+`` lines), so a reviewer can look them
up; `apply` checks every ``-`` line against the source it edits, so a hand-edited hunk cannot rebuild
something else silently.
"""

from __future__ import annotations

import difflib
import re

_HUNK = re.compile(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@$")


class ChangeError(ValueError):
    """Changes that do not apply to the source they name."""


def changes(old: str, old_first: int, new: str, new_first: int) -> list[str]:
    """``old`` (whose first line is torch line ``old_first``) → ``new``, as hunks without context."""
    before, after = _lines(old), _lines(new)
    found: list[str] = []
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        # Unified-diff convention: an empty range names the line before it.
        old_start = old_first + i1 - (1 if i1 == i2 else 0)
        new_start = new_first + j1 - (1 if j1 == j2 else 0)
        found.append(f"@@ -{old_start},{i2 - i1} +{new_start},{j2 - j1} @@")
        found += [f"-{line}" for line in before[i1:i2]] + [f"+{line}" for line in after[j1:j2]]
    return found


def apply(old: str, old_first: int, hunks: list[str]) -> str:
    """The source ``hunks`` make of ``old``. Raises `ChangeError` naming the first hunk that does not fit."""
    lines = _lines(old)
    rebuilt: list[str] = []
    cursor = 0  # index into ``lines`` of the first line not yet copied
    index = 0
    while index < len(hunks):
        header = _HUNK.match(hunks[index])
        if header is None:
            raise ChangeError(f"`{hunks[index]}` is not a hunk header such as `@@ -12,2 +12,3 @@`")
        old_start, old_count, _, new_count = (int(g) for g in header.groups())
        removed = hunks[index + 1 : index + 1 + old_count]
        added = hunks[index + 1 + old_count : index + 1 + old_count + new_count]
        at = old_start - old_first + (1 if old_count == 0 else 0)
        if (
            at < cursor
            or at + old_count > len(lines)
            or len(removed) != old_count
            or len(added) != new_count
            or any(not r.startswith("-") for r in removed)
            or any(not a.startswith("+") for a in added)
            or [r[1:] for r in removed] != lines[at : at + old_count]
        ):
            raise ChangeError(f"hunk `{hunks[index]}` does not apply to the source before it")
        rebuilt += lines[cursor:at] + [a[1:] for a in added]
        cursor = at + old_count
        index += 1 + old_count + new_count
    rebuilt += lines[cursor:]
    return "\n".join(rebuilt) + "\n"


def _lines(text: str) -> list[str]:
    # Split on newlines only: torch's source may hold form feeds, which `splitlines` would also split on.
    return text.removesuffix("\n").split("\n")
