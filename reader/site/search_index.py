"""The site's search index: every item ``fsdp-readings search`` finds (`reader.format.hits.guide_hits` with
no words: guides, anchors, claims, notes, predict questions, prose lines) and the glossary's terms, each with
the page and id it links to. Written as a script that sets a global, so that it loads from ``file://``, where a
page may not fetch a JSON file. Predict answers are not indexed: they stay behind their disclosure."""

from __future__ import annotations

import json
from collections.abc import Iterable

from reader.format.guide import Guide, SourceBlock
from reader.format.hits import guide_hits
from reader.format.path import Term
from reader.format.predict import PredictQuestion
from reader.site.markdown import slug
from reader.site.pages import Page


def guide_entries(guide: Guide, page: Page) -> list[dict[str, str]]:
    """Each hit of ``guide`` (as read on this torch) with the id on its page the hit is at."""
    by_line: dict[tuple[str, int], str] = {}
    for anchor in guide.anchors:
        if anchor.name in page.quote_ids:
            by_line["anchor", anchor.line] = f"source-{page.quote_ids[anchor.name]}"
    for claim in guide.claims:
        by_line["claim", claim.line] = f"claim-{claim.id}"
    for block in guide.regions_of(SourceBlock):
        for note in block.notes:
            by_line["note", note.line] = f"note-{note.line}"
    for question in guide.regions_of(PredictQuestion):
        by_line["question", question.start] = f"predict-{question.id}"
    entries = []
    for hit in guide_hits(guide, []):
        line = int(hit.where.rsplit(":", 1)[1])
        target = by_line.get((hit.kind, line)) if hit.kind != "prose" else page.prose.heading_at(line)
        href = f"guides/{guide.id}.html" + (f"#{target}" if target and target in page.ids else "")
        entries.append({"k": hit.kind, "g": guide.id, "t": hit.text, "h": href})
    return entries


def term_entries(terms: Iterable[Term]) -> list[dict[str, str]]:
    return [{"k": "term", "g": "glossary", "t": f"{t.term}: {t.means}", "h": f"index.html#term-{slug(t.term)}"}
            for t in terms]  # fmt: skip


def script(entries: list[dict[str, str]]) -> str:
    # "</" inside a string would end an inline script; escaped anyway, so the file is safe to inline later.
    return "window.FSDP_SEARCH = " + json.dumps(entries, ensure_ascii=False).replace("</", "<\\/") + ";\n"
