"""Resolve an anchor (``module:qualname`` plus an optional pattern) to live torch source: file, lines, text.

Resolution never imports torch: the module name maps to a file of a ``TorchSource``, the file's libcst index
(cached by content hash) maps the qualified name to a span, and a pattern narrows the span to one statement.
When a symbol is gone, the error says what is nearest: close names in the module (difflib), the import the
name became, or the sibling module that now defines it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from reader.source.fingerprint import Fingerprints, SnippetSyntaxError
from reader.source.index import Definition, IndexCache, ModuleIndex, ParseFailure
from reader.source.patterns import enclosing_statement, find
from reader.source.torch_source import TorchSource, decode_source

REMOVED = "removed"
PATTERN_LOST = "pattern lost"
TRACEABLE_KINDS = ("function", "class")


@dataclass(frozen=True)
class Resolution:
    symbol: str
    pattern: str | None
    kind: str  # kind of the whole symbol: "function" | "class" | "assignment"
    relpath: str  # relative to the directory holding torch/: stable across installs, used in the lock
    display_path: str  # what a person opens
    start: int  # 1-based, inclusive: the span of ``text`` (narrowed to a statement when ``pattern`` is set)
    end: int
    text: str
    definition: tuple[int, int]  # the whole symbol's span
    fingerprints: Fingerprints

    @property
    def traceable(self) -> bool:
        """Whether the symbol has code objects a rank can trace (classes expand to their methods
        rank-side)."""
        return self.kind in TRACEABLE_KINDS

    @property
    def location(self) -> str:
        return f"{self.display_path}:{self.start}"

    def span(self) -> str:
        return f"{self.relpath}:{self.start}-{self.end}"


@dataclass(eq=False)  # exceptions compare and hash by identity
class AnchorError(Exception):
    """The anchor cannot be pinned to exactly one place in this torch. ``kind`` is a drift class."""

    kind: str  # REMOVED or PATTERN_LOST
    symbol: str
    message: str
    hints: list[str] = field(default_factory=list)
    where: str | None = None  # file:line of the module, when it exists

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.kind}: {self.message}"]
        lines += [f"  hint: {hint}" for hint in self.hints]
        return "\n".join(lines)


@dataclass(frozen=True)
class NoteMatch:
    pattern: str
    line: int  # file line where the matched code starts
    count: int  # how many times the pattern matched (1 is the only good answer)


class Resolver:
    def __init__(self, source: TorchSource, cache: IndexCache | None = None) -> None:
        self.source = source
        self.cache = cache if cache is not None else IndexCache()
        self._memo: dict[tuple[str, str | None], Resolution | AnchorError] = {}
        self._files: dict[str, tuple[str, ModuleIndex] | None] = {}

    def resolve(self, symbol: str, pattern: str | None = None) -> Resolution:
        key = (symbol, pattern)
        if key not in self._memo:
            try:
                self._memo[key] = self._resolve(symbol, pattern)
            except AnchorError as exc:
                self._memo[key] = exc
        found = self._memo[key]
        if isinstance(found, AnchorError):
            raise found
        return found

    def notes(self, resolution: Resolution, patterns: list[str]) -> list[NoteMatch]:
        """Where each note pattern lands in the anchor's (narrowed) code."""
        found = []
        for pattern in patterns:
            matches = find(resolution.text, pattern)
            line = resolution.start + matches[0].start[0] - 1 if matches else resolution.start
            found.append(NoteMatch(pattern, line, len(matches)))
        return found

    # --- internals ------------------------------------------------------------------------------------------

    def _module(self, relpath: str) -> tuple[str, ModuleIndex] | None:
        if relpath not in self._files:
            data = self.source.read_bytes(relpath)
            if data is None:
                self._files[relpath] = None
            else:
                text = decode_source(data)
                self._files[relpath] = (text, self.cache.index(data, text))
        return self._files[relpath]

    def _resolve(self, symbol: str, pattern: str | None) -> Resolution:
        module, _, qualname = symbol.partition(":")
        relpath = self.source.module_file(module)
        if relpath is None:
            raise AnchorError(
                REMOVED,
                symbol,
                f"module {module} does not exist in this torch",
                self._module_hints(module, qualname),
            )
        try:
            loaded = self._module(relpath)
        except ParseFailure as exc:
            raise AnchorError(REMOVED, symbol, f"{self.source.display(relpath)} {exc}") from exc
        assert loaded is not None
        text, index = loaded
        definitions = [d for d in index.get(qualname) if d.kind != "import"]
        if not definitions:
            raise AnchorError(
                REMOVED,
                symbol,
                f"{module} has no `{qualname}`",
                self._symbol_hints(module, relpath, qualname, index),
                where=self.source.display(relpath),
            )
        lines = text.split("\n")
        definition, (start, end) = self._pick(symbol, pattern, definitions, lines, relpath)
        snippet = "\n".join(lines[start - 1 : end]) + "\n"
        try:
            prints = self.cache.fingerprint(snippet)
        except SnippetSyntaxError as exc:  # cannot happen for a span of a parsed file; say so if it does
            raise AnchorError(REMOVED, symbol, f"lines {start}-{end} do not parse alone: {exc}") from exc
        return Resolution(
            symbol=symbol,
            pattern=pattern,
            kind=definition.kind,
            relpath=relpath,
            display_path=self.source.display(relpath),
            start=start,
            end=end,
            text=snippet,
            definition=(definition.start, definition.end),
            fingerprints=prints,
        )

    def _pick(
        self, symbol: str, pattern: str | None, definitions: list[Definition], lines: list[str], relpath: str
    ) -> tuple[Definition, tuple[int, int]]:
        where = self.source.display(relpath)
        if pattern is None:
            if len(definitions) > 1:
                at = ", ".join(str(d.first) for d in definitions)
                raise AnchorError(
                    PATTERN_LOST,
                    symbol,
                    f"`{symbol}` is defined {len(definitions)} times "
                    f"(lines {at}); the anchor cannot tell which one it reads",
                    ['add `pattern = "..."` with code unique to the definition you mean'],
                    where,
                )
            only = definitions[0]
            return only, (only.start, only.end)
        hits: list[tuple[Definition, int, int]] = []
        for definition in definitions:
            text = "\n".join(lines[definition.start - 1 : definition.end]) + "\n"
            for match in find(text, pattern):
                first, last = enclosing_statement(text, match)
                hits.append((definition, definition.start + first - 1, definition.start + last - 1))
        if len(hits) != 1:
            found = (
                "matches nothing"
                if not hits
                else (f"matches {len(hits)} statements (lines {', '.join(str(h[1]) for h in hits)})")
            )
            fix = (
                "if the code was rewritten, re-read it and update the pattern"
                if not hits
                else "lengthen the pattern until it is unique"
            )
            raise AnchorError(PATTERN_LOST, symbol, f"pattern `{pattern}` {found} in `{symbol}`", [fix], where)
        definition, start, end = hits[0]
        return definition, (start, end)

    def _symbol_hints(self, module: str, relpath: str, qualname: str, index: ModuleIndex) -> list[str]:
        hints: list[str] = []
        imported = [d for d in index.get(qualname) if d.kind == "import"]
        if imported:
            hints.append(
                f"`{qualname}` is now imported into {module} from {imported[0].target} "
                f"(line {imported[0].first}); anchor the definition there"
            )
        owner, _, _ = qualname.rpartition(".")
        names = index.names()
        pool = [n for n in names if n.startswith(owner + ".")] if owner and owner in index.definitions else names
        close = difflib.get_close_matches(qualname, pool, n=3, cutoff=0.6) or difflib.get_close_matches(
            qualname, names, n=3, cutoff=0.6
        )
        if close:
            described = ", ".join(f"`{n}` (line {index.get(n)[0].first})" for n in close)
            hints.append(f"nearest names in {module}: {described}")
        hints += self._defined_elsewhere(relpath.rpartition("/")[0], qualname, exclude=relpath)
        return hints

    def _module_hints(self, module: str, qualname: str) -> list[str]:
        package, _, leaf = module.rpartition(".")
        hints: list[str] = []
        package_dir = package.replace(".", "/")
        while package_dir and not self.source.exists(f"{package_dir}/__init__.py") and "/" in package_dir:
            package_dir = package_dir.rpartition("/")[0]
        siblings = [
            n.removesuffix(".py")
            for n in self.source.list_dir(package_dir)
            if (n.endswith(".py") and n != "__init__.py") or self.source.exists(f"{package_dir}/{n}/__init__.py")
        ]
        close = difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)
        if close:
            dotted = package_dir.replace("/", ".")
            hints.append("nearest modules: " + ", ".join(f"{dotted}.{n}" for n in close))
        hints += self._defined_elsewhere(package_dir, qualname, exclude=None)
        return hints

    def _defined_elsewhere(self, package_dir: str, qualname: str, exclude: str | None) -> list[str]:
        """Find the symbol in sibling modules: a cheap byte search first, then the index confirms."""
        leaf = qualname.rpartition(".")[2]
        needle = re.compile(
            rb"^\s*(?:async\s+def|def|class)\s+"
            + re.escape(leaf.encode())
            + rb"\b|^"
            + re.escape(leaf.encode())
            + rb"\s*[:=]",
            re.MULTILINE,
        )
        found = []
        for name in self.source.list_dir(package_dir):
            relpath = f"{package_dir}/{name}"
            if not name.endswith(".py") or relpath == exclude:
                continue
            data = self.source.read_bytes(relpath)
            if data is None or not needle.search(data):
                continue
            try:
                loaded = self._module(relpath)
            except ParseFailure:
                continue
            if loaded and any(d.kind != "import" for d in loaded[1].get(qualname)):
                dotted = relpath.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                line = loaded[1].get(qualname)[0].first
                found.append(
                    f"`{qualname}` is defined in {dotted} (line {line}); if it moved, "
                    f"change the anchor's symbol to `{dotted}:{qualname}`"
                )
        return found
