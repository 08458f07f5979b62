"""The site's pages filled in: a guide's regions in document order (prose, quotes, expect blocks, predict
questions), its claims with their last results and pictures, and the index. Templates (``templates/``) are
Jinja2 with autoescaping on: every string from a guide or from torch is escaped unless a renderer here made it
HTML (`Markup`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from reader.claims.pictures import Pictures
from reader.claims.status import Status
from reader.format.guide import ClaimSpec, ExpectBlock, Guide, Prose, SourceBlock, block_reference
from reader.format.predict import LISTS, PredictQuestion
from reader.gate.workspace import Workspace
from reader.site.code import highlighted_lines
from reader.site.markdown import Prose as ProseRenderer
from reader.site.markdown import sentence
from reader.views.drift import DriftView
from reader.views.guide import view_commands
from reader.views.memory import svg as memory_svg
from reader.views.quote import BrokenQuote, Quote, quote

ENV = Environment(loader=PackageLoader("reader.site", "templates"), autoescape=select_autoescape(["html"]))
LAYOUT_WIDTH = 100  # columns of the layout diagram drawn as SVG text


@dataclass
class Page:
    """A guide's page as written, with the ids it holds (for search links and the link check)."""

    html: str
    ids: set[str]
    prose: ProseRenderer
    quote_ids: dict[str, str] = field(default_factory=dict)  # anchor name → id of its first quote on the page


def _quote_html(guide: Guide, q: Quote, key: str) -> str:
    rows = highlighted_lines(q.found.text)
    pinned = q.highlighted
    segments = []
    for segment in q.segments:
        lines = [
            {"number": n, "html": Markup(rows[n - q.found.start] if n - q.found.start < len(rows) else ""),
             "pinned": n in pinned}
            for n in range(segment.first, segment.last + 1)
        ]  # fmt: skip
        notes = [_note(p) for p in segment.notes]
        segments.append({"lines": lines, "notes": notes, "last": segment.last})
    view = {"name": key, "location": q.location, "qualname": q.qualname, "status": q.status, "ok": q.ok}
    drift = [] if q.ok or q.drift is None else _drift_lines(guide, q)
    return ENV.get_template("quote.html").render(quote=view, segments=segments, lost=[_note(p) for p in q.lost],
                                                 drift=drift)  # fmt: skip


def _drift_lines(guide: Guide, q: Quote) -> list[dict[str, str]]:
    """The drift's words as the report and pytest say them (`reader.views.drift`), a style class per line."""
    assert q.drift is not None
    path = f"{guide.path.parent.name}/{guide.path.name}"
    anchor = guide.anchor(q.name)
    view = DriftView(f"{path}:{anchor.line}", guide.id, path, anchor.name, anchor.symbol, q.drift)
    return [{"text": text, "style": style.replace(" ", "-")} for text, style in view.lines()]


def _note(pinned: Any) -> dict[str, Any]:
    scope = f"*(torch {pinned.note.torch})* " if pinned.note.torch is not None else ""
    lines = pinned.lines
    return {
        "line": pinned.note.line,
        "label": pinned.label,
        "first": lines[0] if lines else 0,
        "last": lines[-1] if lines else 0,
        "html": Markup(sentence(scope + pinned.note.text)),
    }


def _expect_html(guide: Guide, block: ExpectBlock) -> str:
    users = [c.id for c in guide.claims for v in c.kwargs.values() if block_reference(v) == block.name]
    checked = f"checked by claim {', '.join(users)}" if users else "not used by any claim"
    return ENV.get_template("expect.html").render(name=block.name, checked=checked, items="\n".join(block.items))


def _predict_html(guide: Guide, question: PredictQuestion) -> str:
    answer = ", ".join(question.answer) if question.kind in LISTS else str(question.answer)
    return ENV.get_template("predict.html").render(
        q=question,
        question=Markup(sentence(question.question)),
        answer=answer,
        explain=Markup(sentence(question.explain)),
        guide_id=guide.id,
    )


RESULT_TEXT = {
    Status.PASSED: "held",
    Status.XFAILED: "held (fails as its xfail expects)",
    Status.FAILED: "FAILED",
    Status.XPASSED: "passed, though its xfail expects a failure",
    Status.SKIPPED: "skipped",
}


def _claim(guide: Guide, claim: ClaimSpec, result: Status | None, torch: str | None, *, drawn: Mapping[str, Any],
           exercises: Mapping[str, list[str]]) -> dict[str, Any]:  # fmt: skip
    shown = (
        f"last run on torch {torch}: {RESULT_TEXT[result]}"
        if result
        else (f"not run on torch {torch} yet: fsdp-readings check {guide.id} {claim.id}")
    )
    pictures = []
    title = f"{guide.id} · {claim.id} · rank 0"
    if drawn.get("series"):
        pictures.append({"id": f"memory-{claim.id}", "svg": Markup(memory_svg(drawn["series"], title)),
                         "caption": f"bytes held per category over the step, rank 0 of the last passing run on torch "
                                    f"{torch}"})  # fmt: skip
    if drawn.get("layout"):
        pictures.append({"id": f"layout-{claim.id}", "svg": Markup(layout_svg(drawn["layout"], title)),
                         "caption": f"the flat parameter as rank 0 read it in the last passing run on torch "
                                    f"{torch}"})  # fmt: skip
    return {
        "id": claim.id,
        "ranks": claim.world_size,
        "statement": Markup(sentence(claim.statement)),
        "result": shown,
        "result_class": f"result-{result or 'none'}",
        "commands": [f"fsdp-readings check {guide.id} {claim.id}", *view_commands(guide, claim, exercises)],
        "pictures": pictures,
    }


def layout_svg(fields: Mapping[str, Any], title: str) -> str:
    """The flat-parameter diagram ``fsdp-readings layout`` prints, as SVG text rows (monospace, one per row)."""
    from checks.models.flat_param_diagram import diagram_lines

    rows = [title, *diagram_lines(dict(fields), width=LAYOUT_WIDTH)]
    char_w, line_h = 7.8, 16
    width = int(max(len(r) for r in rows) * char_w) + 16
    height = line_h * len(rows) + 12
    body = "\n".join(
        f'<text x="8" y="{line_h * (i + 1)}" xml:space="preserve">{escape(row)}</text>' for i, row in enumerate(rows)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="ui-monospace, Menlo, Consolas, monospace" font-size="13">\n'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>\n{body}\n</svg>\n'
    )


@dataclass(frozen=True)
class SiteContext:
    """What every page shows in its frame."""

    torch: str
    release: str
    source: str
    data_dir: str


def guide_page(
    guide: Guide,
    workspace: Workspace,
    context: SiteContext,
    *,
    results: Mapping[str, Status],
    pictures: Pictures,
    exercises: Mapping[str, list[str]],
    approved: bool,
    neighbours: tuple[str | None, str | None],
) -> Page:
    """``guide`` (as read on the workspace's torch) as a page."""
    prose = ProseRenderer({"claims"})
    page = Page("", set(), prose)
    regions: list[Markup] = []
    quote_keys: set[str] = set()
    for region in guide.regions:
        if isinstance(region, Prose):
            regions.append(Markup(prose.html(region.text, region.start)))
        elif isinstance(region, SourceBlock):
            key, n = region.anchor, 2
            while f"source-{key}" in quote_keys:  # an anchor quoted again: ids stay unique on the page
                key, n = f"{region.anchor}-{n}", n + 1
            quote_keys.add(f"source-{key}")
            page.quote_ids.setdefault(region.anchor, key)
            quoted = quote(guide, region, workspace)
            if isinstance(quoted, BrokenQuote):
                html = ENV.get_template("broken_quote.html").render(
                    name=key, symbol=quoted.symbol, error=quoted.error.render()
                )
            else:
                html = _quote_html(guide, quoted, key)
            regions.append(Markup(html))
        elif isinstance(region, ExpectBlock):
            regions.append(Markup(_expect_html(guide, region)))
        elif isinstance(region, PredictQuestion):
            regions.append(Markup(_predict_html(guide, region)))
        else:  # a fence kind registered outside the reader's core: its Markdown source, verbatim
            regions.append(Markup(f'<pre class="diagram"><code>{escape(guide.raw(region))}</code></pre>'))
    claims = [
        _claim(
            guide,
            c,
            results.get(c.id),
            context.torch,
            drawn=pictures.of(guide.id, c.id, context.torch),
            exercises=exercises,
        )
        for c in guide.claims
    ]
    previous, following = neighbours
    page.html = ENV.get_template("guide.html").render(
        title=guide.title, root="../", torch=context.torch, source=context.source, data_dir=context.data_dir,
        guide=guide, approved=approved, release=context.release, regions=regions, claims=claims,
        path=workspace.display(guide.path), previous=previous, next=following,
    )  # fmt: skip
    return page


def index_page(context: SiteContext, **values: Any) -> str:
    return ENV.get_template("index.html").render(
        title="Reading guides", root="", torch=context.torch, source=context.source, data_dir=context.data_dir,
        **values,
    )  # fmt: skip
