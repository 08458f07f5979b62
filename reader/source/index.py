"""A module's symbol table from libcst, cached by the file's content hash.

The index maps qualified names (``FlatParamHandle.unshard``,
``_register_pre_backward_hooks.<locals>._register_hook``, module/class-level assignments, import bindings) to
line spans. Spans include decorators and the comment block directly above a definition (a person reads those
with the code), and stop at the last non-blank line.

Why libcst and not ``ast``: libcst keeps comments attached to the statements they describe, so a span can
include them exactly. Its position metadata is slow on a file the size of ``_flat_param.py``, so spans are
computed from code-generation line counts instead, which is faster and still exact.

Parsing is the expensive step, so indexes are cached by SHA-256 of the file's bytes: in memory for this
process and as JSON on disk (``$FSDP_READINGS_CACHE`` or the user cache dir) so the next process reads an
unchanged file's index instead of parsing it again. The same torch file inside a wheel and in site-packages
hits the same entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from reader.source.files import write_atomic
from reader.source.fingerprint import ALGORITHM, Fingerprints, fingerprint
from reader.source.torch_source import decode_source

INDEX_FORMAT = 1
_LIBCST_VERSION = getattr(cst, "__version__", None) or "unknown"


@dataclass(frozen=True)
class Definition:
    """One binding of a qualified name in a module."""

    qualname: str
    kind: str  # "function" | "class" | "assignment" | "import"
    start: int  # first line, including the attached comment block (1-based)
    first: int  # first line of the statement itself (first decorator, or the def/class/assignment line)
    end: int  # last non-blank line
    target: str | None = None  # imports: "module:name" the binding comes from


@dataclass(frozen=True)
class ModuleIndex:
    definitions: dict[str, tuple[Definition, ...]]

    def get(self, qualname: str) -> tuple[Definition, ...]:
        return self.definitions.get(qualname, ())

    def names(self, *, kinds: Sequence[str] = ("function", "class", "assignment")) -> list[str]:
        return [q for q, defs in self.definitions.items() if any(d.kind in kinds for d in defs)]

    def to_json(self) -> dict[str, object]:
        return {
            "format": INDEX_FORMAT,
            "definitions": {
                q: [[d.kind, d.start, d.first, d.end, d.target] for d in defs] for q, defs in self.definitions.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ModuleIndex:
        if data.get("format") != INDEX_FORMAT:
            raise ValueError("index format mismatch")
        raw = data["definitions"]
        assert isinstance(raw, dict)
        return cls(
            {
                q: tuple(Definition(q, kind, start, first, end, target) for kind, start, first, end, target in defs)
                for q, defs in raw.items()
            }
        )


class ParseFailure(ValueError):
    """The file does not parse."""


def build_index(text: str) -> ModuleIndex:
    """Index ``text`` (already decoded, universal newlines)."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise ParseFailure(f"does not parse: {exc.message} (line {exc.raw_line})") from exc
    builder = _Builder(module, text.split("\n"))
    builder.walk(module.body, 1 + len(module.header), prefix="", scope="module")
    # Blocks are walked last-to-first (see walk_blocks); definitions are kept in source order.
    return ModuleIndex({q: tuple(sorted(defs, key=lambda d: d.first)) for q, defs in builder.found.items()})


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- span computation ---------------------------------------------------------------------------------------

_COMPOUND_WITH_BLOCKS = (cst.If, cst.Try, cst.TryStar, cst.With, cst.For, cst.While)


class _Builder:
    def __init__(self, module: cst.Module, lines: list[str]) -> None:
        self.module = module
        self.lines = lines
        self.found: dict[str, list[Definition]] = {}

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def add(self, definition: Definition) -> None:
        self.found.setdefault(definition.qualname, []).append(definition)

    def trim_end(self, first: int, end: int) -> int:
        while end > first and not self.lines[end - 1].strip():
            end -= 1
        return end

    def walk(self, body: Sequence[cst.CSTNode], line: int, prefix: str, scope: str) -> None:
        """Index statements of one block; ``line`` is the first line of ``body[0]`` (its leading lines
        included)."""
        for stmt in body:
            code = self.code(stmt)
            height = code.count("\n")
            leading = getattr(stmt, "leading_lines", ())
            first = line + len(leading)
            end = self.trim_end(first, line + height - 1)
            start = first - _attached_comments(leading)
            if isinstance(stmt, cst.FunctionDef):
                self.add(Definition(prefix + stmt.name.value, "function", start, first, end))
                if code.count("def ") + code.count("class ") > 1:  # descend only where a nested definition can hide
                    self.walk_blocks(stmt, line + height - 1, f"{prefix}{stmt.name.value}.<locals>.", "function")
            elif isinstance(stmt, cst.ClassDef):
                self.add(Definition(prefix + stmt.name.value, "class", start, first, end))
                self.walk_blocks(stmt, line + height - 1, f"{prefix}{stmt.name.value}.", "class")
            elif isinstance(stmt, cst.SimpleStatementLine):
                if scope != "function":
                    for small in stmt.body:
                        for name, kind, target in _bindings(small):
                            self.add(Definition(prefix + name, kind, start, first, end, target))
            elif isinstance(stmt, _COMPOUND_WITH_BLOCKS) and (
                "def " in code or "class " in code or scope != "function"
            ):
                # Definitions under if/try/with at module or class level are still module/class bindings.
                self.walk_blocks(stmt, line + height - 1, prefix, scope)
            line += height

    def walk_blocks(self, node: cst.CSTNode, end: int, prefix: str, scope: str) -> None:
        """Walk the indented blocks of a compound statement whose code ends on line ``end``.

        The blocks sit at the end of the statement's code, in source order, so each one's first line is found
        by subtracting line counts from the end backwards. An IndentedBlock's code starts with the rest of the
        ``...:`` header line, so its statements begin one line below that.
        """
        for part in reversed(_trailing_parts(node)):
            height = self.code(part).count("\n")
            part_first = end - height + 1
            if isinstance(part, cst.IndentedBlock):
                self.walk(part.body, part_first + 1, prefix, scope)
            elif isinstance(part, cst.SimpleStatementSuite):
                pass  # `if x: y = 1` on one line: nothing worth indexing
            else:  # Else / ExceptHandler / Finally / `elif` If: own leading lines, a header, then a block
                self.walk_blocks(part, end, prefix, scope)
            end = part_first - 1


def _trailing_parts(node: cst.CSTNode) -> list[cst.CSTNode]:
    parts: list[cst.CSTNode | None]
    if isinstance(node, cst.If):
        parts = [node.body, node.orelse]
    elif isinstance(node, (cst.Try, cst.TryStar)):
        parts = [node.body, *node.handlers, node.orelse, node.finalbody]
    elif isinstance(node, (cst.For, cst.While)):
        parts = [node.body, node.orelse]
    elif isinstance(
        node,
        (
            cst.FunctionDef,
            cst.ClassDef,
            cst.With,
            cst.Else,
            cst.Finally,
            cst.ExceptHandler,
            cst.ExceptStarHandler,
        ),
    ):
        parts = [node.body]
    else:
        parts = []
    return [p for p in parts if p is not None]


def _attached_comments(leading: Sequence[cst.EmptyLine]) -> int:
    """How many comment lines sit directly above the statement (no blank line between)."""
    count = 0
    for empty in reversed(leading):
        if empty.comment is None:
            break
        count += 1
    return count


def _bindings(small: cst.BaseSmallStatement) -> Iterator[tuple[str, str, str | None]]:
    if isinstance(small, cst.Assign):
        for target in small.targets:
            for name in _target_names(target.target):
                yield name, "assignment", None
    elif isinstance(small, cst.AnnAssign):
        yield from ((name, "assignment", None) for name in _target_names(small.target))
    elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
        dots = "." * len(small.relative)
        module = dots + (_dotted(small.module) if small.module else "")
        for alias in small.names:
            name = _dotted(alias.name)
            bound = _dotted(alias.asname.name) if alias.asname else name
            yield bound, "import", f"{module}:{name}"
    elif isinstance(small, cst.Import):
        for alias in small.names:
            name = _dotted(alias.name)
            bound = _dotted(alias.asname.name) if alias.asname else name.split(".")[0]
            yield bound, "import", name


def _target_names(node: cst.BaseExpression) -> Iterator[str]:
    if isinstance(node, cst.Name):
        yield node.value
    elif isinstance(node, (cst.Tuple, cst.List)):
        for element in node.elements:
            yield from _target_names(element.value)
    elif isinstance(node, cst.StarredElement):
        yield from _target_names(node.value)


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return cst.Module([]).code_for_node(node)


# --- cache --------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path | None:
    """``$FSDP_READINGS_CACHE`` (empty or ``off`` disables the disk cache), else the platform's user cache
    dir."""
    configured = os.environ.get("FSDP_READINGS_CACHE")
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "none") else Path(configured).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fsdp-readings"


_MEMORY: dict[str, ModuleIndex] = {}
_FINGERPRINTS: dict[str, Fingerprints] = {}


class IndexCache:
    """Indexes by content hash: process memory first, then disk, then a libcst parse (written back to
    both)."""

    def __init__(self, directory: Path | None = None, *, use_default: bool = True) -> None:
        self.directory = directory if directory is not None or not use_default else default_cache_dir()
        self.parses = 0  # how many files this cache had to parse (benchmarks and tests read it)

    def _path(self, digest: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / f"index-v{INDEX_FORMAT}-libcst-{_LIBCST_VERSION}" / digest[:2] / f"{digest}.json"

    def index(self, data: bytes, text: str | None = None) -> ModuleIndex:
        """The index of a file's bytes (``text``: the bytes already decoded, to skip decoding again)."""
        digest = content_hash(data)
        found = _MEMORY.get(digest)
        if found is not None:
            return found
        path = self._path(digest)
        if path is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AssertionError):
                found = ModuleIndex.from_json(json.loads(path.read_text()))
        if found is None:
            self.parses += 1
            found = build_index(text if text is not None else decode_source(data))
            if path is not None:
                # A cache that cannot be written (read-only home, full disk) is only slower, never wrong.
                with contextlib.suppress(OSError):
                    write_atomic(path, json.dumps(found.to_json(), separators=(",", ":")))
        _MEMORY[digest] = found
        return found

    def fingerprint(self, text: str) -> Fingerprints:
        """``fingerprint(text)``, cached like indexes: a warm process does no parsing at all."""
        digest = content_hash(text.encode("utf-8", "surrogatepass"))
        found = _FINGERPRINTS.get(digest)
        if found is not None:
            return found
        path = (
            None
            if self.directory is None
            else (self.directory / f"fingerprints-v{ALGORITHM}" / digest[:2] / f"{digest}.json")
        )
        if path is not None:
            with contextlib.suppress(OSError, ValueError, TypeError):
                found = Fingerprints(**json.loads(path.read_text()))
        if found is None:
            found = fingerprint(text)
            if path is not None:
                with contextlib.suppress(OSError):
                    write_atomic(path, json.dumps(found.to_json()))
        _FINGERPRINTS[digest] = found
        return found

    @staticmethod
    def clear_memory() -> None:
        _MEMORY.clear()
        _FINGERPRINTS.clear()
