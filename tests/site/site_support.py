"""Reading a built site back: its pages parsed with the standard library's HTML parser (ids, links, classes,
the quotes' lines and notes), so the tests check the HTML itself, not the code that wrote it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
READINGS = ROOT / "readings"


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and (cls is None or cls in child.classes):
                found.append(child)
            found += child.find_all(tag, cls)
        return found

    @property
    def all_text(self) -> str:
        return self.text + "".join(c.all_text for c in self.children)


_VOID = {"meta", "link", "input", "br", "img", "hr", "rect", "line"}


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        # Text goes in document order: a text node after a child element is kept as a child of its own.
        self.stack[-1].children.append(Element("#text", {}, data))


def parse(path: Path) -> Element:
    tree = _Tree()
    tree.feed(path.read_text(encoding="utf-8"))
    return tree.root


def ids(page: Element) -> set[str]:
    return {e.attrs["id"] for e in page.find_all() if "id" in e.attrs}


def build(out: Path, data_dir: Path, *args: str, readings: Path = READINGS) -> subprocess.CompletedProcess[str]:
    """``fsdp-readings site OUT`` as a person runs it, in a process of its own, with its own data directory."""
    env = {**os.environ, "FSDP_READINGS_DATA_DIR": str(data_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "reader", "--readings", str(readings), "site", str(out), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip


REQUIRE = "FSDP_READINGS_REQUIRE_BROWSER"  # set by .ci/run, which installs Chromium and Java: a skip there is a failure


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason`` (how to install what is missing), or fail where CI promised it is installed."""
    if os.environ.get(REQUIRE):
        pytest.fail(f"{reason} (${REQUIRE} is set: CI installs it, so this test must run)")
    pytest.skip(reason)
