"""The libcst symbol index: spans of every kind of definition, and the content-hash cache."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from reader.source.index import IndexCache, ParseFailure, build_index
from tests.reader.reader_support import FLAT_PARAM, RUNTIME_UTILS

TRICKY = '''\
"""Module docstring."""
# header comment

import os as _os
from . import sibling
from .pkg.mod import (
    a,
    b as bee,
)

X: int = 1
Y = Z = 2
(P, [Q, *R]) = 1, [2, 3, 4]

if _os.name == "nt":
    def platform():
        return "win"
elif _os.name == "java":
    def platform():
        return "jvm"
else:

    # comment attached to the def below

    # only this one is attached
    def platform():
        return "posix"

try:
    from fast import speedup
except ImportError:
    def speedup(x):  # fallback
        return x
finally:
    CLEANED = True


class Outer(Base, metaclass=Meta):
    """Doc."""

    attr: str = "a"

    class Inner:
        @staticmethod
        @functools.cache
        def method(
            x,
            y,
        ):
            return x + y



    def run(self):
        def helper():
            class Local:
                pass
            return Local
        if self:
            def conditional():
                pass
        return helper

    # trailing comment inside the class body
def after():  pass
async def coroutine(): await other()
'''


def spans(index, qualname):
    return [(d.kind, d.start, d.first, d.end) for d in index.get(qualname)]


def test_functions_classes_methods_nested_assignments_and_imports():
    index = build_index(TRICKY)
    assert spans(index, "X") == [("assignment", 11, 11, 11)]
    assert spans(index, "Y") == spans(index, "Z") == [("assignment", 12, 12, 12)]
    assert {"P", "Q", "R"} <= set(index.definitions)
    assert [d.target for d in index.get("_os")] == ["os"]
    assert [d.target for d in index.get("bee")] == [".pkg.mod:b"]
    assert [d.target for d in index.get("sibling")] == [".:sibling"]
    # Conditional definitions are module bindings: all three are kept, in source order.
    assert [d.first for d in index.get("platform")] == [16, 19, 26]
    assert spans(index, "platform")[2] == ("function", 25, 26, 27)  # only the adjacent comment is attached
    assert [d.kind for d in index.get("speedup")] == ["import", "function"]
    assert spans(index, "CLEANED") == [("assignment", 35, 35, 35)]
    # The indented comment after the last method belongs to the class body (libcst's block footer).
    assert spans(index, "Outer") == [("class", 38, 38, 64)]
    assert spans(index, "Outer.attr") == [("assignment", 41, 41, 41)]
    assert spans(index, "Outer.Inner.method") == [("function", 44, 44, 50)]
    assert spans(index, "Outer.run") == [("function", 54, 54, 62)]
    assert spans(index, "Outer.run.<locals>.helper") == [("function", 55, 55, 58)]
    assert spans(index, "Outer.run.<locals>.helper.<locals>.Local") == [("class", 56, 56, 57)]
    assert spans(index, "Outer.run.<locals>.conditional") == [("function", 60, 60, 61)]
    assert spans(index, "after") == [("function", 65, 65, 65)]
    assert spans(index, "coroutine") == [("function", 66, 66, 66)]
    # Locals of functions are not indexed as bindings.
    assert not index.get("Outer.run.<locals>.Local")


@pytest.mark.parametrize("source", [TRICKY, RUNTIME_UTILS, FLAT_PARAM])
def test_spans_agree_with_ast(source: str):
    """Independent oracle: ast's line numbers for every def/class (decorators included)."""
    index = build_index(source)
    lines = source.split("\n")

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + node.name
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                found = [d for d in index.get(qualname) if d.first == first]
                assert found, (qualname, first, index.get(qualname))
                extra = [ln for ln in lines[node.end_lineno : found[0].end] if not ln.strip().startswith("#")]
                assert found[0].end >= node.end_lineno and not any(ln.strip() for ln in extra), qualname
                inner = f"{qualname}." if isinstance(node, ast.ClassDef) else f"{qualname}.<locals>."
                visit(node.body, inner)
            for field in ("body", "orelse", "finalbody", "handlers"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    for child in getattr(node, field, []):
                        visit(getattr(child, "body", [child]) if field == "handlers" else [child], prefix)

    visit(ast.parse(source).body, "")


def test_names_for_suggestions_exclude_imports():
    index = build_index(RUNTIME_UTILS)
    names = index.names()
    assert "_prefetch_handle" in names and "_PrefetchMode.FORWARD" in names
    assert "Optional" not in names


def test_syntax_error_is_reported():
    with pytest.raises(ParseFailure, match="does not parse"):
        build_index("def broken(:\n")


def test_cache_memory_then_disk_then_parse(tmp_path: Path):
    data = RUNTIME_UTILS.encode()
    first = IndexCache(tmp_path)
    assert first.index(data) is first.index(data)
    assert first.parses == 1
    written = list(tmp_path.rglob("*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["format"] == 1

    IndexCache.clear_memory()  # a second process: only the disk cache survives
    second = IndexCache(tmp_path)
    assert second.index(data).definitions == first.index(data).definitions
    assert second.parses == 0

    changed = IndexCache(tmp_path)
    changed.index(data + b"\nLATE = 1\n")
    assert changed.parses == 1  # keyed by content: an edited file is parsed again


def test_corrupt_cache_entry_is_reparsed(tmp_path: Path):
    data = FLAT_PARAM.encode()
    IndexCache(tmp_path).index(data)
    for entry in tmp_path.rglob("*.json"):
        entry.write_text("{not json")
    IndexCache.clear_memory()
    cache = IndexCache(tmp_path)
    assert cache.index(data).get("FlatParamHandle.unshard")
    assert cache.parses == 1


def test_cache_can_be_disabled(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FSDP_READINGS_CACHE", "off")
    assert IndexCache().directory is None
    assert IndexCache().index(b"A = 1\n").get("A")


def test_unwritable_cache_dir_is_only_slower(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache dir should be")
    cache = IndexCache(blocker / "cache")
    assert cache.index(b"A = 1\n").get("A")
