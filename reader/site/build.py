"""Write the site: ``index.html``, ``guides/<id>.html`` per guide, and ``assets/`` (the stylesheet with the
code colours, the search script and its index). No claim runs: results and pictures are read from the user's
data directory, where ``pytest readings/``, ``check`` and the views record them."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from reader.claims.pictures import Pictures
from reader.claims.progress import Progress, ProgressError, data_dir
from reader.claims.status import Status, tally
from reader.format.errors import GuideError
from reader.format.guide import Guide
from reader.format.path import load_glossary, reading_path
from reader.gate.lock import LockError
from reader.gate.workspace import Workspace
from reader.site import search_index
from reader.site.code import stylesheet
from reader.site.markdown import slug
from reader.site.pages import SiteContext, guide_page, index_page
from reader.views.guide import exercises_by_claim

_ID = re.compile(r'\bid="([^"]+)"')


@dataclass(frozen=True)
class Built:
    index: Path
    guides: list[Path]
    problems: list[str]  # what the site could not show (an unreadable progress file), said in the page's place


def build_site(
    guides: list[Guide], readings: Path, workspace: Workspace, out: Path, every_id: list[str] | None = None
) -> Built:
    """Every guide of ``guides`` as a page under ``out``, read on the workspace's torch; ``every_id``: the ids of
    all the guides of ``readings`` (the path and glossary name them), when only some are written. A page left
    from an earlier build of a guide not written now is removed: the site links to none."""
    problems: list[str] = []
    torch = workspace.torch_version or "unknown"
    here = workspace.release
    source = workspace.source
    context = SiteContext(torch, here, f"{source.kind} at {source.location}", str(data_dir()))
    try:
        progress: Progress | None = Progress()
    except ProgressError as exc:
        problems.append(str(exc))
        progress = None
    pictures = Pictures()
    ordered = sorted(guides, key=lambda g: (g.order, g.id))
    every_id = every_id or [g.id for g in ordered]
    path = reading_path(readings, every_id)
    sequence = [gid for track in path.tracks for gid in track.guides] if path else [g.id for g in ordered]
    sequence += [g.id for g in ordered if g.id not in sequence]
    written_ids = {g.id for g in ordered}
    sequence = [gid for gid in sequence if gid in written_ids]  # a site of some guides links only to those
    approved = _approved(workspace, ordered, here)

    (out / "guides").mkdir(parents=True, exist_ok=True)
    (out / "assets").mkdir(exist_ok=True)
    for stale in (out / "guides").glob("*.html"):
        if stale.stem not in written_ids:
            stale.unlink()
    written, entries, standing = [], [], {}
    for guide in ordered:
        read = guide.on(workspace.torch_version)
        results = progress.claims(guide.id, workspace.torch_version) if progress else {}
        at = sequence.index(guide.id)
        neighbours = (sequence[at - 1] if at > 0 else None, sequence[at + 1] if at + 1 < len(sequence) else None)
        page = guide_page(read, workspace, context, results=results, pictures=pictures,
                          exercises=exercises_by_claim(read), approved=guide.id in approved,
                          neighbours=neighbours)  # fmt: skip
        page.ids = set(_ID.findall(page.html))
        target = out / "guides" / f"{guide.id}.html"
        target.write_text(page.html, encoding="utf-8")
        written.append(target)
        entries += search_index.guide_entries(read, page)
        standing[guide.id] = _standing(workspace, guide, results)

    try:
        terms = load_glossary(readings, every_id)
    except (GuideError, OSError) as exc:
        problems.append(str(exc))
        terms = ()
    entries += search_index.term_entries(terms)
    tracks = path.tracks if path else ()
    rows = {g.id: {"id": g.id, "title": g.title, "approved": g.id in approved, **standing[g.id]} for g in ordered}
    shown_tracks = [
        {"name": t.name, "about": t.about, "rows": [rows[i] for i in t.guides if i in rows]} for t in tracks
    ]
    off_path = [rows[g.id] for g in ordered if not any(g.id in t.guides for t in tracks)]
    if off_path:
        shown_tracks.append({"name": "Not on the path", "about": "", "rows": off_path})
    start = path.start if path and path.start in written_ids else sequence[0]
    glossary = [{"term": t.term, "means": t.means, "see": t.see if t.see in written_ids else "", "slug": slug(t.term)}
                for t in terms]  # fmt: skip
    index = out / "index.html"
    release = _release_line(here, approved, ordered)
    html = index_page(context, release=release, start=start, tracks=shown_tracks, terms=glossary)
    index.write_text(html, encoding="utf-8")
    static = files("reader.site") / "static"
    for name in ("search.js",):
        shutil.copyfile(str(static / name), out / "assets" / name)
    (out / "assets" / "site.css").write_text(
        (static / "site.css").read_text(encoding="utf-8") + "\n/* code colours (pygments) */\n" + stylesheet() + "\n",
        encoding="utf-8",
    )
    (out / "assets" / "search-index.js").write_text(search_index.script(entries), encoding="utf-8")
    return Built(index, written, problems)


def _approved(workspace: Workspace, guides: list[Guide], here: str) -> set[str]:
    """The guides approved on this release (re-read, their claims passing there), by the lock."""
    try:
        lock = workspace.lock
    except LockError:
        return set()
    return {g.id for g in guides if here in lock.releases_of(g.id)}


def _release_line(here: str, approved: set[str], guides: list[Guide]) -> dict[str, object]:
    if guides and len(approved) == len(guides):
        text = f"torch {here} is an approved release: every guide was re-read and approved on it, its claims passing."
        return {"approved": True, "text": text, "here": here}
    which = "no guide" if not approved else f"{len(approved)} of {len(guides)} guides"
    text = (f"torch {here} is not an approved release ({which} approved on it): a guide not approved here may "
            "quote code that changed; its page marks each drifted quote.")  # fmt: skip
    return {"approved": False, "text": text, "here": here}


def _standing(workspace: Workspace, guide: Guide, results: dict[str, Status]) -> dict[str, str]:
    """A guide's row on the index: its anchors' drift and its claims' last results on this torch (as ``list``)."""
    read = guide.on(workspace.torch_version)
    drifted = sum(1 for anchor in read.anchors if not workspace.drift(read, anchor).ok)
    anchors = f"{drifted}/{len(read.anchors)} drifted" if drifted else f"{len(read.anchors)} ok"
    ran = [results[c.id] for c in guide.claims if c.id in results]
    held, failed = tally(ran)
    claims = "not run" if not ran else f"{held}/{len(guide.claims)} held" + (f", {failed} failed" if failed else "")
    return {
        "anchors": anchors,
        "anchors_class": "warn" if drifted else "ok",
        "claims": claims,
        "claims_class": "bad" if failed else "ok" if ran else "small",
    }
