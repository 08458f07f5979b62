"""Does ``checks.guides.g04_forward_prefetch:no_prefetch_in_iteration_1`` exist? Answered without importing anything.

Check modules import torch and build process groups, so collection must not import them (that would make
collection slow and could fail for reasons unrelated to the guide). The top-level package is found with
``importlib.util.find_spec`` (which executes nothing for a top-level name and honours editable installs), the
submodule path is walked on disk, and the module's source is indexed with the same libcst index anchors use.
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from reader.source.index import IndexCache, ParseFailure

CHECK_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class CheckFinder:
    def __init__(self, extra_paths: Sequence[Path] = (), cache: IndexCache | None = None) -> None:
        self.extra_paths = [str(p) for p in extra_paths]
        self.cache = cache if cache is not None else IndexCache()

    def problem(self, ref: str) -> tuple[str, str] | None:
        """None if ``ref`` names an existing function (or class/assignment/import); else (message, fix)."""
        module, _, attr = ref.partition(":")
        located = self._locate(module)
        file_hint = module.replace(".", "/") + ".py"
        if located is None:
            return (
                f"check module `{module}` not found on sys.path",
                f"create {file_hint} defining `def {attr}(...)`, or correct `check`",
            )
        if located.suffix != ".py":
            return None  # compiled or namespace module: nothing to read, trust the name
        try:
            index = self.cache.index(located.read_bytes())
        except (OSError, ParseFailure) as exc:
            return (f"check module {located} cannot be read: {exc}", f"fix {located} so it parses")
        if index.get(attr) or index.get("__getattr__"):
            return None
        top_level = [n for n in index.names(kinds=("function", "class", "assignment", "import")) if "." not in n]
        close = difflib.get_close_matches(attr, top_level, n=3, cutoff=0.6)
        did_you_mean = f" (did you mean {', '.join(f'`{module}:{c}`' for c in close)}?)" if close else ""
        return (
            f"`{attr}` is not defined in {module} ({located}){did_you_mean}",
            f"define `def {attr}(...)` in {located.name}, or correct `check`",
        )

    def exercise_count(self, module: str) -> int:
        return len(self.exercises(module))

    def exercises(self, module: str) -> list[tuple[str, str]]:
        """(exercise id, claim id) of each ``Exercise(...)`` a check module's ``EXERCISES`` tuple declares
        (`checks.breakit.exercises`), read from its source: importing a check module imports torch."""
        located = self._locate(module)
        if located is None or located.suffix != ".py":
            return []
        try:
            tree = ast.parse(located.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return []
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "EXERCISES" for t in targets):
                calls = node.value.elts if isinstance(node.value, ast.Tuple | ast.List) else []
                return [found for c in calls if (found := _exercise(c)) is not None]
        return []

    def _locate(self, module: str) -> Path | None:
        top, *rest = module.split(".")
        spec = self._top_spec(top)
        if spec is None:
            return None
        if not rest:
            return Path(spec.origin) if spec.origin and spec.has_location else None
        directories = [Path(p) for p in (spec.submodule_search_locations or ())]
        for depth, part in enumerate(rest):
            last = depth == len(rest) - 1
            found: Path | None = None
            for directory in directories:
                if last and (directory / f"{part}.py").is_file():
                    return directory / f"{part}.py"
                compiled = [*directory.glob(f"{part}.*.so"), *directory.glob(f"{part}.*.pyd")] if last else []
                if compiled:
                    return compiled[0]
                if (directory / part).is_dir():
                    found = directory / part
                    break
            if found is None:
                return None
            if last:
                init = found / "__init__.py"
                return init if init.is_file() else found
            directories = [found]
        return None

    def _top_spec(self, top: str) -> importlib.machinery.ModuleSpec | None:
        loaded = sys.modules.get(top)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            return loaded.__spec__
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None and self.extra_paths:
            spec = importlib.machinery.PathFinder.find_spec(top, self.extra_paths)
        return spec


def _exercise(node: ast.expr) -> tuple[str, str] | None:
    """(id, claim) of an ``Exercise("id", claim="...", ...)`` call written with literal strings."""
    if not isinstance(node, ast.Call) or getattr(node.func, "id", "") != "Exercise" or not node.args:
        return None
    first = node.args[0]
    claim = next((k.value for k in node.keywords if k.arg == "claim"), None)
    if isinstance(first, ast.Constant) and isinstance(claim, ast.Constant):
        return str(first.value), str(claim.value)
    return None
