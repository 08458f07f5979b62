"""Parse a guide file: TOML front matter between ``+++`` lines, then the Markdown body split into regions.

Every problem is collected (not just the first) and pinned to a line of the ``.md`` file. ``tomllib`` reports
no positions for values, so lines of tables and keys are found by scanning the raw front-matter text.

Body regions come from small parsers, sybil-style: today one parser finds ```` ```source <anchor> ```` fences
(via markdown-it, so fences in lists and blockquotes count and fences in code spans do not) and their ``note``
lines; everything between them is prose.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from reader.checkref import CHECK_RE, CheckFinder
from reader.errors import GuideError, Problem
from reader.guide import (
    AnchorSpec,
    ClaimSpec,
    ExpectBlock,
    Guide,
    Note,
    Prose,
    Region,
    SourceBlock,
    block_reference,
)
from reader.patterns import PatternError, pattern_tokens

FENCE = "+++"
GUIDE_FILE_RE = re.compile(r"^\d+-[\w.-]+\.md$")  # NN-slug.md: must be a guide, so no front matter is an error
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
CLAIM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MARKER_RE = re.compile(r"^[A-Za-z_]\w*$")
SYMBOL_RE = re.compile(r"^torch(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.([A-Za-z_]\w*|<locals>))*$")

TOP_KEYS = ("id", "title", "order", "torch", "anchors", "claims")
ANCHOR_KEYS = ("name", "symbol", "pattern")
CLAIM_KEYS = ("id", "statement", "check", "kwargs", "world_size", "markers", "evidence", "timeout")


def has_front_matter(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.readline().strip() == FENCE.encode()
    except OSError:
        return False


def looks_like_guide(path: Path) -> bool:
    """Guides are files with front matter, plus any ``NN-slug.md`` (which then must have it). A README is
    not."""
    return path.suffix == ".md" and (has_front_matter(path) or bool(GUIDE_FILE_RE.match(path.name)))


def load_guide(path: Path, checks: CheckFinder | None = None) -> Guide:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GuideError.at(path, 1, f"not UTF-8: {exc}", "save the guide as UTF-8") from exc
    return parse_guide(text, path, checks)


def parse_guide(text: str, path: Path, checks: CheckFinder | None = None) -> Guide:
    lines = text.split("\n")
    if lines[0].strip() != FENCE:
        raise GuideError.at(
            path, 1, "no TOML front matter",
            "start the file with a line `+++`, the TOML front matter (id, title, order, torch, [[anchors]], "
            "[[claims]]), and another line `+++`",
        )  # fmt: skip
    close = next((i for i in range(1, len(lines)) if lines[i].strip() == FENCE), None)
    if close is None:
        raise GuideError.at(
            path, 1, "the front matter opened on line 1 is never closed",
            "add a line `+++` after the last front-matter line",
        )  # fmt: skip
    front = lines[1:close]
    try:
        data = tomllib.loads("\n".join(front))
    except tomllib.TOMLDecodeError as exc:
        raise GuideError.at(
            path, 1 + _toml_error_line(exc), f"malformed TOML front matter: {_toml_msg(exc)}",
            "fix the TOML near this line: strings need quotes, tables are written [[anchors]] and [[claims]], "
            "each key appears once per table",
        ) from exc  # fmt: skip
    report = _Report(path, _Locator(front, first_line=2))
    front_matter = _FrontMatter(report, checks)
    guide = front_matter.build(data, path)
    # Check directives against every declared anchor name, valid or not: one bad symbol must not cascade.
    regions = list(_body_regions(lines[close + 1 :], close + 2, report, front_matter.declared))
    _check_block_references(guide, regions, report)
    if report.problems:
        raise GuideError(report.problems)
    return replace(guide, regions=tuple(regions))


# --- front matter -------------------------------------------------------------------------------------------


class _Report:
    def __init__(self, path: Path, locator: _Locator) -> None:
        self.path = path
        self.locator = locator
        self.problems: list[Problem] = []

    def add(self, where: tuple[Any, ...] | int, message: str, fix: str) -> None:
        line = where if isinstance(where, int) else self.locator.line(*where)
        self.problems.append(Problem(self.path, line, message, fix))


class _FrontMatter:
    def __init__(self, report: _Report, checks: CheckFinder | None) -> None:
        self.report = report
        self.checks = checks
        self.declared: set[str] = set()

    def build(self, data: dict[str, Any], path: Path) -> Guide:
        r = self.report
        self._unknown_keys(data, TOP_KEYS, (), "front matter")
        gid = self._str(data, "id", (), f'id = "{path.stem}"', (ID_RE, "lowercase letters, digits, `-`, `.`, `_`"))
        title = self._str(data, "title", (), 'title = "What this guide reads"')
        order = data.get("order")
        if order is None:
            r.add(("order",), "missing `order`", "add `order = <n>`, the guide's place in the reading sequence")
        elif type(order) is not int:
            r.add(("order",), f"`order` must be an integer, not {_type(order)}", "write `order = 4`")
        spec_text = self._str(data, "torch", (), 'torch = ">=2.13"')
        spec = SpecifierSet()
        if spec_text is not None:
            try:
                spec = SpecifierSet(spec_text)
            except InvalidSpecifier:
                r.add(
                    ("torch",),
                    f'`torch = "{spec_text}"` is not a PEP 440 version specifier',
                    'write a specifier such as `torch = ">=2.13"` or `torch = ">=2.13,<2.16"`',
                )
        anchors = self._anchors(data.get("anchors", []))
        claims = self._claims(data.get("claims", []), anchors)
        return Guide(
            path=path,
            id=gid or "",
            title=title or "",
            order=order if type(order) is int else 0,
            torch=spec,
            anchors=tuple(anchors),
            claims=tuple(claims),
            id_line=r.locator.line("id"),
        )

    def _anchors(self, raw: Any) -> list[AnchorSpec]:
        r = self.report
        if not _is_table_list(raw):
            r.add(
                ("anchors",),
                "`anchors` must be an array of tables",
                "write each anchor as\n"
                '        [[anchors]]\n        name = "short-name"\n'
                '        symbol = "torch.module.path:Qual.name"',
            )
            return []
        found: list[AnchorSpec] = []
        seen: dict[str, int] = {}
        self.declared = {t["name"] for t in raw if isinstance(t.get("name"), str)}
        for i, table in enumerate(raw):
            at = ("anchors", i)
            self._unknown_keys(table, ANCHOR_KEYS, at, "[[anchors]]")
            name = self._str(
                table,
                "name",
                at,
                'name = "prefetch"',
                (NAME_RE, "a letter or `_`, then letters, digits, `_`, `-`, `.`"),
            )
            symbol = self._str(table, "symbol", at, 'symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"')
            if symbol is not None and not SYMBOL_RE.match(symbol):
                self.report.add((*at, "symbol"), f"unknown anchor syntax `{symbol}`", _symbol_fix(symbol))
                symbol = None
            pattern = table.get("pattern")
            if pattern is not None:
                if not isinstance(pattern, str) or not pattern.strip():
                    r.add(
                        (*at, "pattern"),
                        "`pattern` must be a non-empty string of code",
                        "write the exact code of one statement inside the anchor, or remove `pattern`",
                    )
                    pattern = None
                else:
                    pattern = self._pattern(pattern, (*at, "pattern"))
            if name is not None and name in seen:
                r.add(
                    (*at, "name"),
                    f"duplicate anchor name `{name}` (first on line {seen[name]})",
                    "give every anchor of a guide its own name",
                )
            elif name is not None and symbol is not None:
                seen[name] = r.locator.line(*at, "name")
                found.append(AnchorSpec(name, symbol, pattern, r.locator.line(*at)))
        return found

    def _claims(self, raw: Any, anchors: list[AnchorSpec]) -> list[ClaimSpec]:
        r = self.report
        if not _is_table_list(raw):
            r.add(
                ("claims",),
                "`claims` must be an array of tables",
                "write each claim as\n        [[claims]]\n"
                '        id = "short-id"\n        statement = "One sentence."\n'
                '        check = "checks.module:fn"\n        world_size = 2',
            )
            return []
        names = self.declared
        valid = {a.name for a in anchors}
        found: list[ClaimSpec] = []
        seen: dict[str, int] = {}
        for i, table in enumerate(raw):
            at = ("claims", i)
            self._unknown_keys(table, CLAIM_KEYS, at, "[[claims]]")
            cid = self._str(
                table,
                "id",
                at,
                'id = "backward-pre-order"',
                (CLAIM_ID_RE, "letters, digits, `-`, `_`, `.`; stable: item ids and reports use it"),
            )
            statement = self._str(table, "statement", at, 'statement = "One sentence the check proves."')
            check = self._str(table, "check", at, 'check = "checks.prefetch:backward_pre_order"')
            if check is not None and not CHECK_RE.match(check):
                r.add(
                    (*at, "check"),
                    f'`check = "{check}"` is not `module:function`',
                    'write it as `check = "checks.prefetch:backward_pre_order"`',
                )
                check = None
            elif check is not None and self.checks is not None:
                missing = self.checks.problem(check)
                if missing:
                    r.add((*at, "check"), *missing)
                    check = None
            kwargs = table.get("kwargs", {})
            if not isinstance(kwargs, dict):
                r.add((*at, "kwargs"), "`kwargs` must be a table", 'write `kwargs = { mode = "BACKWARD_PRE" }`')
                kwargs = {}
            world_size = table.get("world_size")
            if world_size is None:
                r.add(at, "missing `world_size`", "add `world_size = 2` (the number of ranks the check runs on)")
            elif type(world_size) is not int or world_size < 1:
                r.add(
                    (*at, "world_size"),
                    f"`world_size` must be a positive integer, not {world_size!r}",
                    "write `world_size = 2`",
                )
                world_size = None
            markers = self._markers(table.get("markers", []), (*at, "markers"))
            evidence = tuple(
                n for n in self._evidence(table.get("evidence", []), (*at, "evidence"), names) if n in valid
            )
            timeout = table.get("timeout")
            if timeout is not None and (type(timeout) not in (int, float) or timeout <= 0):
                r.add(
                    (*at, "timeout"),
                    f"`timeout` must be a positive number of seconds, not {timeout!r}",
                    "write `timeout = 120`, or remove it to use the pool's default",
                )
                timeout = None
            if cid is not None and cid in seen:
                r.add(
                    (*at, "id"),
                    f"duplicate claim id `{cid}` (first on line {seen[cid]})",
                    "give every claim of a guide its own id",
                )
            elif None not in (cid, statement, check, world_size):
                assert cid is not None and statement is not None and check is not None and world_size is not None
                seen[cid] = r.locator.line(*at, "id")
                found.append(
                    ClaimSpec(
                        cid,
                        statement,
                        check,
                        kwargs,
                        world_size,
                        markers,
                        evidence,
                        float(timeout) if timeout is not None else None,
                        r.locator.line(*at),
                    )
                )
        return found

    def _markers(self, raw: Any, at: tuple[Any, ...]) -> tuple[str, ...]:
        if not isinstance(raw, list) or not all(isinstance(m, str) and MARKER_RE.match(m) for m in raw):
            self.report.add(
                at,
                "`markers` must be a list of marker names",
                'write `markers = ["slow"]` or `markers = ["gpu", "slow"]`',
            )
            return ()
        if "world_size" in raw:
            self.report.add(
                at,
                "`world_size` is not set through `markers`",
                "remove it from `markers`; `world_size = n` adds the world_size(n) marker",
            )
            return ()
        return tuple(raw)

    def _evidence(self, raw: Any, at: tuple[Any, ...], names: set[str]) -> tuple[str, ...]:
        if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
            self.report.add(at, "`evidence` must be a list of anchor names", 'write `evidence = ["prefetch"]`')
            return ()
        unknown = [n for n in raw if n not in names]
        for name in unknown:
            self.report.add(
                at, f"`evidence` names `{name}`, which is not an anchor of this guide", _name_fix(name, names)
            )
        return tuple(raw)

    def _pattern(self, pattern: str, at: tuple[Any, ...] | int) -> str | None:
        try:
            pattern_tokens(pattern)
        except PatternError as exc:
            self.report.add(
                at,
                f"pattern `{pattern}` is not Python code: {exc}",
                "copy the code exactly from torch's source (comments are ignored)",
            )
            return None
        return pattern

    def _str(
        self,
        table: dict[str, Any],
        key: str,
        at: tuple[Any, ...],
        example: str,
        rule: tuple[re.Pattern[str], str] | None = None,
    ) -> str | None:
        value = table.get(key)
        if value is None:
            self.report.add(
                at or (key,),
                f"missing `{key}`" + (f" in {at[0]} #{at[1] + 1}" if at else ""),
                f"add `{example}`",
            )
            return None
        if not isinstance(value, str) or not value.strip():
            self.report.add((*at, key), f"`{key}` must be a non-empty string, not {_type(value)}", f"write `{example}`")
            return None
        if rule is not None and not rule[0].match(value):
            self.report.add((*at, key), f'`{key} = "{value}"` is not a valid {key}: {rule[1]}', f"write `{example}`")
            return None
        return value

    def _unknown_keys(self, table: dict[str, Any], allowed: tuple[str, ...], at: tuple[Any, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                fix = f"did you mean `{close[0]}`?" if close else f"{where} takes: {', '.join(allowed)}"
                self.report.add((*at, key), f"unknown key `{key}` in {where}", fix)


class _Locator:
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


# --- body ---------------------------------------------------------------------------------------------------

BodyParser = Callable[[list[str], int, _Report, set[str]], Iterable[SourceBlock | ExpectBlock]]


def _fences(lines: list[str], first_line: int, kind: str) -> Iterator[tuple[list[str], str, int, int]]:
    """(info words, content, first line, last line) of every fence whose info string starts with ``kind``."""
    for token in MarkdownIt("commonmark").parse("\n".join(lines)):
        if token.type != "fence" or not token.map:
            continue
        words = token.info.split()
        if words and words[0] == kind:
            yield words, token.content, first_line + token.map[0], first_line + token.map[1] - 1


def _source_blocks(lines: list[str], first_line: int, report: _Report, anchors: set[str]) -> Iterable[SourceBlock]:
    """```` ```source <anchor> ```` fences. The fence holds only notes; the code is read live from torch."""
    for words, content, start, end in _fences(lines, first_line, "source"):
        if len(words) != 2:
            report.add(
                start,
                f"a source block names one anchor, got `{' '.join(words)}`",
                "write the opening fence as ```source <anchor-name>",
            )
            continue
        name = words[1]
        if name not in anchors:
            report.add(
                start,
                f"source block names `{name}`, which is not an anchor of this guide",
                _name_fix(name, anchors),
            )
        notes = tuple(_notes(content, start + 1, report))
        yield SourceBlock(name, notes, start, end)


def _expect_blocks(lines: list[str], first_line: int, report: _Report, anchors: set[str]) -> Iterable[ExpectBlock]:
    """```` ```expect <name> ```` fences: one expected item per non-blank line, handed to claims that ask."""
    seen: dict[str, int] = {}
    for words, content, start, end in _fences(lines, first_line, "expect"):
        if len(words) != 2:
            report.add(start, f"an expect block has one name, got `{' '.join(words)}`", "write ```expect <name>")
            continue
        name = words[1]
        if name in seen:
            report.add(start, f"duplicate expect block `{name}` (first on line {seen[name]})", "rename one of them")
            continue
        seen[name] = start
        items = tuple(line.strip() for line in content.split("\n") if line.strip())
        if not items:
            report.add(start, f"expect block `{name}` is empty", "write one expected item per line")
        yield ExpectBlock(name, items, start, end)


def _check_block_references(guide: Guide, regions: list[Region], report: _Report) -> None:
    names = {r.name for r in regions if isinstance(r, ExpectBlock)}
    for claim in guide.claims:
        for key, value in claim.kwargs.items():
            name = block_reference(value)
            if name is not None and name not in names:
                report.add(
                    claim.line,
                    f"claim `{claim.id}` takes `{key}` from expect block `{name}`, which this guide does not have",
                    _block_fix(name, names),
                )


BODY_PARSERS: tuple[BodyParser, ...] = (_source_blocks, _expect_blocks)


def _notes(content: str, first_line: int, report: _Report) -> Iterable[Note]:
    pending: Note | None = None
    for offset, raw in enumerate(content.split("\n")[:-1] if content.endswith("\n") else content.split("\n")):
        number = first_line + offset
        if not raw.strip():
            if pending:
                yield pending
            pending = None
            continue
        if raw[0] in " \t" and pending is not None:  # an indented line continues the note above
            pending = Note(pending.pattern, f"{pending.text} {raw.strip()}", pending.line)
            continue
        if pending:
            yield pending
            pending = None
        note = _note(raw, number, report)
        if note is not None:
            pending = note
    if pending:
        yield pending


def _note(raw: str, number: int, report: _Report) -> Note | None:
    fix = 'write `note "<code pattern>": <text>`; the anchor\'s code is quoted live, so the block holds only notes'
    if not re.match(r"^note\s", raw):
        report.add(number, f"unknown line in a source block: `{raw.strip()}`", fix)
        return None
    rest = raw[4:].lstrip()
    try:
        token = next(tokenize.generate_tokens(io.StringIO(rest).readline))
    except (tokenize.TokenError, SyntaxError, StopIteration):
        token = None
    if token is None or token.type != tokenize.STRING:
        report.add(number, "a note needs its code pattern as a quoted string", fix)
        return None
    try:
        pattern = ast.literal_eval(token.string)
    except (ValueError, SyntaxError):
        pattern = None
    if not isinstance(pattern, str):
        report.add(number, f"the note pattern {token.string} is not a plain string", fix)
        return None
    after = rest[token.end[1] :].lstrip()
    if not after.startswith(":") or not after[1:].strip():
        report.add(number, 'a note is `note "<code pattern>": <text>`: missing `:` or text after the pattern', fix)
        return None
    try:
        pattern_tokens(pattern)
    except PatternError as exc:
        report.add(
            number,
            f"note pattern `{pattern}` is not Python code: {exc}",
            "copy the code exactly from torch's source",
        )
        return None
    return Note(pattern, after[1:].strip(), number)


def _body_regions(lines: list[str], first_line: int, report: _Report, anchors: set[str]) -> Iterable[Region]:
    blocks = sorted(
        (b for parser in BODY_PARSERS for b in parser(lines, first_line, report, anchors)),
        key=lambda b: b.start,
    )
    cursor = first_line
    for block in [*blocks, None]:
        stop = block.start if block is not None else first_line + len(lines)
        text = "\n".join(lines[cursor - first_line : stop - first_line])
        if text.strip():
            yield Prose(cursor, stop - 1, text)
        if block is not None:
            yield block
            cursor = block.end + 1


# --- messages -----------------------------------------------------------------------------------------------


def _symbol_fix(symbol: str) -> str:
    if ":" not in symbol and "." in symbol:
        module, _, name = symbol.rpartition(".")
        return f"separate module and name with `:`, e.g. `{module}:{name}` (for a method: `module:Class.method`)"
    if not symbol.startswith("torch"):
        return (
            "anchors read torch's own source: the symbol must start with `torch.`, e.g. "
            "`torch.distributed.fsdp._flat_param:FlatParamHandle.unshard`"
        )
    return "write `package.module:Name`, `package.module:Class.method` or `package.module:outer.<locals>.inner`"


def _block_fix(name: str, names: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1)
    if close:
        return f"did you mean `{close[0]}`?"
    return f"add a fence ```expect {name} to the prose, one expected item per line"


def _name_fix(name: str, names: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1)
    if close:
        return f"did you mean `{close[0]}`?"
    return f"use one of this guide's anchors: {', '.join(sorted(names))}" if names else "declare it under [[anchors]]"


def _is_table_list(raw: Any) -> bool:
    return isinstance(raw, list) and all(isinstance(item, dict) for item in raw)


def _type(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _toml_error_line(exc: tomllib.TOMLDecodeError) -> int:
    line = getattr(exc, "lineno", None)  # Python 3.14+
    if isinstance(line, int):
        return line
    match = re.search(r"at line (\d+)", str(exc))
    return int(match.group(1)) if match else 1


def _toml_msg(exc: tomllib.TOMLDecodeError) -> str:
    return getattr(exc, "msg", None) or re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
