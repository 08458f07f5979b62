"""A guide's prose as HTML, with the conventions ``show`` keeps (`reader.views.guide`): torch's
reStructuredText shown with its backticks, a note's "42." kept a sentence, a diagram (any fenced block) never
wrapped but scrolled, and a table that scrolls inside its own box on a narrow screen. Headings get ids, so that
search results and the table of contents can link to them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

from reader.views.guide import sentence_markdown, verbatim_rst


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    id: str
    line: int  # the guide line it is on


def _fence(renderer: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    return f'<pre class="diagram"><code>{escape(tokens[idx].content.rstrip())}</code></pre>\n'


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _fence)
    md.add_render_rule("table_open", lambda *a: '<div class="table"><table>\n')
    md.add_render_rule("table_close", lambda *a: "</table></div>\n")
    return md


_MD = _markdown()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.casefold()).strip("-") or "section"


class Prose:
    """Renders prose regions of one page, giving headings ids unique on that page."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken
        self.headings: list[Heading] = []

    def html(self, text: str, first_line: int) -> str:
        tokens = _MD.parse(verbatim_rst(text))
        for index, token in enumerate(tokens):
            if token.type == "heading_open":
                title = tokens[index + 1].content
                base = slug(title)
                found, n = base, 2
                while found in self.taken:
                    found, n = f"{base}-{n}", n + 1
                self.taken.add(found)
                token.attrSet("id", found)
                line = first_line + (token.map[0] if token.map else 0)
                self.headings.append(Heading(int(token.tag[1]), title, found, line))
        return _MD.renderer.render(tokens, _MD.options, {})

    def heading_at(self, line: int) -> str | None:
        """The id of the last heading at or above guide line ``line``."""
        above = [h for h in self.headings if h.line <= line]
        return above[-1].id if above else None


def sentence(text: str) -> str:
    """A note's or a claim's text: inline Markdown, one paragraph."""
    return _MD.render(verbatim_rst(sentence_markdown(text)))
