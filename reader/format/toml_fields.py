"""Typed reads of TOML tables whose problems are pinned to lines of the file.

``tomllib`` reports no positions for values, so `TomlLines` finds the lines of tables and keys by scanning the
raw TOML text, and `Fields` turns a key path such as ``("claims", 1, "check")`` into the line a problem
names. The guide's schema (which keys, which rules) lives in ``reader.format.front_matter``.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from typing import Any

from reader.format.errors import Problems

Where = tuple[Any, ...] | int  # a key path into the TOML data, or a line number


class TomlLines:
    """Lines of tables and keys in raw TOML text (tomllib reports none)."""

    AOT = re.compile(r"^\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]")
    TABLE = re.compile(r"^\[\s*([A-Za-z0-9_.-]+)\s*\]")
    KEY = re.compile(r"^([A-Za-z0-9_-]+|\"[^\"]*\")\s*(?:\.[^=]*)?=")

    def __init__(self, lines: list[str], first_line: int) -> None:
        self.first_line = first_line
        self.top: dict[str, int] = {}
        self.tables: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        current: tuple[str, int] | None = None
        in_string: str | None = None
        for offset, raw in enumerate(lines):
            number = first_line + offset
            text = raw.strip()
            if in_string is not None:
                if raw.count(in_string) % 2 == 1:
                    in_string = None
                continue
            if match := self.AOT.match(text):
                name = match.group(1)
                counts[name] = counts.get(name, -1) + 1
                current = (name, counts[name])
                self.tables[current] = number
                continue
            if match := self.TABLE.match(text):
                parent, _, sub = match.group(1).rpartition(".")
                if parent in counts:  # [claims.kwargs] belongs to the last [[claims]]
                    self.keys.setdefault((parent, counts[parent], sub), number)
                else:
                    self.top.setdefault(match.group(1), number)
                current = ("", -1)  # keys of a sub-table are not keys of the enclosing table
                continue
            if match := self.KEY.match(text):
                key = match.group(1).strip('"')
                if current is None:
                    self.top.setdefault(key, number)
                else:
                    self.keys.setdefault((*current, key), number)
                rest = text[match.end() :]
                for delim in ('"""', "'''"):
                    if rest.count(delim) % 2 == 1:
                        in_string = delim

    def line(self, *path: Any) -> int:
        if len(path) == 1:
            return self.top.get(path[0], self.first_line)
        table_line = self.tables.get((path[0], path[1])) or self.top.get(path[0], self.first_line)
        if len(path) == 2:
            return table_line
        return self.keys.get((path[0], path[1], path[2]), table_line)


class Fields:
    """Reads values out of parsed TOML and records what is wrong with them at the line they came from."""

    def __init__(self, problems: Problems, lines: TomlLines) -> None:
        self.problems = problems
        self.lines = lines

    def line(self, *path: Any) -> int:
        return self.lines.line(*path)

    def add(self, where: Where, message: str, fix: str) -> None:
        self.problems.add(where if isinstance(where, int) else self.lines.line(*where), message, fix)

    def string(
        self,
        table: dict[str, Any],
        key: str,
        at: tuple[Any, ...],
        example: str,
        rule: tuple[re.Pattern[str], str] | None = None,
    ) -> str | None:
        """``table[key]`` if it is a non-empty string (matching ``rule``), else None with a problem recorded."""
        value = table.get(key)
        if value is None:
            self.add(
                at or (key,),
                f"missing `{key}`" + (f" in {at[0]} #{at[1] + 1}" if at else ""),
                f"add `{example}`",
            )
            return None
        if not isinstance(value, str) or not value.strip():
            self.add((*at, key), f"`{key}` must be a non-empty string, not {type_name(value)}", f"write `{example}`")
            return None
        if rule is not None and not rule[0].match(value):
            self.add((*at, key), f'`{key} = "{value}"` is not a valid {key}: {rule[1]}', f"write `{example}`")
            return None
        return value

    def unknown_keys(self, table: dict[str, Any], allowed: tuple[str, ...], at: tuple[Any, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                fix = f"did you mean `{close[0]}`?" if close else f"{where} takes: {', '.join(allowed)}"
                self.add((*at, key), f"unknown key `{key}` in {where}", fix)


def is_table_list(raw: Any) -> bool:
    return isinstance(raw, list) and all(isinstance(item, dict) for item in raw)


def type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def toml_error_line(exc: tomllib.TOMLDecodeError) -> int:
    line = getattr(exc, "lineno", None)  # Python 3.14+
    if isinstance(line, int):
        return line
    match = re.search(r"at line (\d+)", str(exc))
    return int(match.group(1)) if match else 1


def toml_error_message(exc: tomllib.TOMLDecodeError) -> str:
    return getattr(exc, "msg", None) or re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
