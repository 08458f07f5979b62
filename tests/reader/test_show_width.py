"""Every real guide through ``fsdp-readings show`` (the CLI's own console and code path, only writing to a
buffer at a fixed width, not a terminal), at 60, 80 and 100 columns: nothing runs past the width, no word of the
prose is lost, and each quoted panel numbers exactly the anchor's lines of the installed torch (from the
definition itself when a section banner heads it), a line too wide continuing on rows marked ``↪``.

The expected lines come from the reader's own resolution (``Workspace.current``), and the rendered first and
last lines are compared with that file's text, so a phantom or missing line shows up as a failure here.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from markdown_it import MarkdownIt

from reader.commands.app import main, make_console
from reader.format.guide import Guide, Prose, SourceBlock
from reader.format.parse import load_all
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.anchors import AnchorError, Resolution
from reader.source.checkref import CheckFinder
from reader.source.torch_source import open_source
from reader.views import guide as guide_view
from reader.views.fit import plain_code
from reader.views.guide import sentence_markdown, verbatim_rst
from reader.views.quote import shown_start

pytestmark = pytest.mark.shared_index_cache  # renders the real guides; counts no cache

READINGS = Path(__file__).resolve().parents[2] / "readings"
GUIDE_IDS = sorted(path.stem for path in READINGS.glob("[0-9][0-9]-*.md"))
WIDTHS = (60, 80, 100)
CROPPED = "\ue000"  # what ends a row show crops, in these renders: no guide writes it
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\))")  # CSI sequences and OSC (links)
# A quoted line: the panel's edge, the note marker or two spaces, the right-aligned number, then the code.
NUMBERED = re.compile(r"^│ (?:❱ |  )( *\d+) (.*?) *│$")
NOTE_LABEL = re.compile(r"^│ +(?:L(\d+)(?:–\d+)?|not found|×\d+) ▸ ")  # a note's first line


@dataclass(frozen=True)
class Shown:
    guide: Guide
    workspace: Workspace
    width: int
    out: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


@pytest.fixture(scope="module")
def shown() -> Iterator[Callable[[str, int], Shown]]:
    """``shown(guide_id, width)``: the guide as ``show`` prints it, rendered once per module."""
    done: dict[tuple[str, int], Shown] = {}
    guides, _ = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    # The guide as show reads it on this torch: anchors and notes scoped to other releases are not shown.
    by_id = {guide.id: guide.on(torch.__version__) for guide in guides}
    workspace = Workspace(open_source(None), READINGS / LOCK_NAME)

    def render(guide_id: str, width: int) -> Shown:
        if (guide_id, width) not in done:
            buffer = io.StringIO()
            console = make_console(file=buffer, width=width, force_terminal=False, color_system=None)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(guide_view, "CROPPED", CROPPED)
                code = main(["--readings", str(READINGS), "show", guide_id], console=console)
            assert code == 0, buffer.getvalue()[-2000:]
            done[guide_id, width] = Shown(by_id[guide_id], workspace, width, buffer.getvalue())
        return done[guide_id, width]

    yield render
    workspace.source.close()


def test_every_guide_is_covered() -> None:
    assert {"00-format", "03-unshard-reshard", "05-mixed-precision"} <= set(GUIDE_IDS)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("guide_id", GUIDE_IDS)
def test_no_line_is_wider_than_the_console(shown, guide_id: str, width: int) -> None:
    view = shown(guide_id, width)
    wide = [(n, len(line), line) for n, line in enumerate(view.lines, start=1) if len(line) > width]
    assert not wide, f"{guide_id} at {width} columns: {wide[:3]}"
    assert ANSI.search(view.out) is None  # not a terminal: plain text


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("guide_id", GUIDE_IDS)
def test_nothing_is_cropped_at_80_columns_or_wider(shown, guide_id: str, width: int) -> None:
    """A diagram's or an expect block's row is cropped only below 80 columns (the guides keep them within 78
    cells, `test_fits_80_columns.py`), and nothing else is ever cropped."""
    cropped = [line.rstrip() for line in shown(guide_id, width).lines if CROPPED in line]
    assert not cropped, f"{guide_id} at {width} columns crops {len(cropped)} row(s): {cropped[:3]}"


def test_below_80_columns_a_wide_row_is_cropped_not_wrapped(shown) -> None:
    # guide 12's layout diagrams are drawn at 78 cells: at 60 they are cropped, the fallback, and still fit
    lines = shown("12-flat-parameter", 60).lines
    assert any(line.rstrip().endswith(CROPPED) for line in lines)
    assert max(len(line) for line in lines) <= 60


# --- no text lost -------------------------------------------------------------------------------------------

_MARKDOWN = MarkdownIt().enable("strikethrough").enable("table")  # rich.markdown's parser
_DECORATION = re.compile(r"^[\u2500-\u259f]+$")  # box drawing and block elements: borders, rules, quote bars


def _inline_words(token) -> list[str]:
    """The words of an inline token as rendered: emphasis and backticks dropped, link text kept."""
    parts = []
    for child in token.children or ():
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return "".join(parts).split()


def markdown_chunks(text: str) -> list[list[str]]:
    """The words of each paragraph (list items' included) and heading of a piece of Markdown."""
    tokens = _MARKDOWN.parse(text)
    return [
        _inline_words(token)
        for before, token in itertools.pairwise(tokens)
        if token.type == "inline" and before.type in ("paragraph_open", "heading_open")
    ]


def expected_chunks(guide: Guide) -> list[list[str]]:
    """The words of the prose, the notes and the claims, as `show` means them to read: torch's
    reStructuredText kept verbatim, a note's "42." kept a sentence, a claim's code spans without backticks
    (`reader.views.guide`)."""
    chunks: list[list[str]] = []
    for region in guide.on(torch.__version__).regions:  # a source block of an anchor scoped elsewhere is not shown
        if isinstance(region, Prose):
            chunks += markdown_chunks(verbatim_rst(region.text))
        elif isinstance(region, SourceBlock):
            for note in region.notes_for(torch.__version__):  # a note scoped to other versions is not shown
                chunks += markdown_chunks(verbatim_rst(sentence_markdown(note.text)))
    chunks += [plain_code(claim.statement).split() for claim in guide.claims]  # code spans shown without backticks
    return [chunk for chunk in chunks if chunk]


def rendered_words(out: str) -> str:
    return " ".join(word for word in out.split() if not _DECORATION.match(word))


def test_markdown_chunks_strip_emphasis_and_backticks() -> None:
    text = "- **claim-id.** Under `FULL_SHARD`,\n  *kept* [unit](https://x.org).\n\n## Head `x`\n"
    assert markdown_chunks(text) == [["claim-id.", "Under", "FULL_SHARD,", "kept", "unit."], ["Head", "x"]]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("guide_id", GUIDE_IDS)
def test_every_word_of_the_prose_notes_and_claims_is_shown_in_order(shown, guide_id: str, width: int) -> None:
    view = shown(guide_id, width)
    words = f" {rendered_words(view.out)} "
    squeezed = _squeeze(words)
    # A word longer than the console (a long code span at 60 columns) is folded onto the next line: its pieces
    # must still read, in order, with nothing between them.
    missing = [
        " ".join(chunk)
        for chunk in expected_chunks(view.guide)
        if f" {' '.join(chunk)} " not in words and _squeeze(" ".join(chunk)) not in squeezed
    ]
    assert not missing, f"{guide_id} at {width} columns lost text of {len(missing)} paragraph(s): {missing[:2]}"


# --- quoted lines -------------------------------------------------------------------------------------------


def panels(view: Shown) -> Iterator[tuple[SourceBlock, Resolution, list[str]]]:
    """Each source block of the guide with its anchor's resolution and the lines of its panel."""
    lines = view.lines
    at = 0
    for block in view.guide.regions_of(SourceBlock):
        found = view.workspace.current(view.guide.anchor(block.anchor))
        assert not isinstance(found, AnchorError), found.render()
        head = f"╭─ {block.anchor} "
        at = next((i for i in range(at, len(lines)) if lines[i].startswith(head)), None)
        assert at is not None, f"no panel titled {head!r} in {view.guide.id} at {view.width} columns"
        end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("╰"))
        body = lines[at + 1 : end]
        span = f"{found.relpath}:{shown_start(found)}-{found.end}"
        # What does not fit on the border (the span, the qualified name) is on rows of its own above the code.
        moved = list(itertools.takewhile(lambda row: NUMBERED.match(row) is None, body))
        if not lines[at].startswith(f"{head}· {span} "):
            assert lines[at].rstrip("─╮") == head
            text = "".join("".join(row.strip("│").split()) for row in moved)
            assert text.startswith(_squeeze(span)), f"{block.anchor}: the span is neither on the title nor below it"
        yield block, found, body[len(moved) :]
        at = end


def numbered(body: list[str]) -> list[tuple[int, int, str]]:
    """(panel line index, file line number, code) of each quoted line, the code joined from the numbered line
    and its continuations (rows marked ↪ where the number would be). A continuation, a note or a code line that
    starts with digits is not a numbered line: its digits do not end where the numbers do. After a note's
    label, lines are the note's until the next numbered line."""
    first = NUMBERED.match(body[0])
    assert first is not None, f"a panel starts with {body[0]!r}, not a numbered line"
    width = len(first.group(1))
    continuation = re.compile(rf"^│ {{{width + 2}}}↪ (.*?) *│$")
    found: list[tuple[int, int, str]] = []
    in_note = False
    for index, line in enumerate(body):
        match = NUMBERED.match(line)
        if match is not None and len(match.group(1)) == width:
            found.append((index, int(match.group(1)), match.group(2)))
            in_note = False
        elif NOTE_LABEL.match(line):
            in_note = True
        elif not in_note and (more := continuation.match(line)):
            at, number, code = found[-1]
            found[-1] = (at, number, code + more.group(1))
        else:
            assert in_note, f"neither code nor a note: {line!r}"
    return found


def _squeeze(code: str) -> str:
    return "".join(code.split())  # wrapping moves whitespace to line ends; it must not add or drop any code


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("guide_id", GUIDE_IDS)
def test_each_panel_numbers_exactly_the_anchor_lines(shown, guide_id: str, width: int) -> None:
    view = shown(guide_id, width)
    for block, found, body in panels(view):
        quoted = numbered(body)
        numbers = [number for _, number, _ in quoted]
        where = f"{guide_id}/{block.anchor} at {width} columns"
        start = shown_start(found)
        assert numbers[0] == start and numbers[-1] == found.end, f"{where}: {numbers[0]}..{numbers[-1]}"
        assert numbers == list(range(start, found.end + 1)), f"{where}: lines missing, repeated or extra"
        source = view.workspace.source.read_text(found.relpath)
        assert source is not None
        file_lines = source.split("\n")
        for _, number, code in quoted:  # every line whole (wrapped, not cropped), the first and last included
            assert _squeeze(code) == _squeeze(file_lines[number - 1]), f"{where}: L{number} shows {code!r}"


@pytest.mark.parametrize("guide_id", GUIDE_IDS)
def test_notes_follow_their_lines_in_line_order(shown, guide_id: str) -> None:
    view = shown(guide_id, 100)
    label = re.compile(r"^│ +L(\d+)(?:–\d+)? ▸ ")
    for block, found, body in panels(view):
        quoted = numbered(body)
        lines = [match.group(1) for line in body if (match := label.match(line))]
        cited = [int(n) for n in lines]
        assert cited == sorted(cited), f"{guide_id}/{block.anchor}: notes out of line order: {cited}"
        notes = block.notes_for(view.workspace.torch_version)
        pinned = sum(1 for p in view.workspace.resolver.notes(found, [n.pattern for n in notes]) if p.count == 1)
        assert len(cited) == pinned
        for index, line in enumerate(body):
            match = label.match(line)
            if match is None:
                continue
            above = max(number for at, number, _ in quoted if at < index)  # the quoted line the note sits under
            assert above >= int(match.group(1)), f"{guide_id}/{block.anchor}: L{match.group(1)} above its line"
            assert re.search(rf"^│ ❱ +{match.group(1)} ", "\n".join(body), re.MULTILINE)  # that line is marked


# --- the real stdout path -----------------------------------------------------------------------------------


def test_piped_show_is_plain_text_at_the_width_in_columns(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["--readings", str(READINGS), "show", "03-unshard-reshard"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert max(len(line) for line in lines) == 100
    assert any(line.startswith("╭─ post-forward · torch/distributed/fsdp/_runtime_utils.py:") for line in lines)


def test_on_a_terminal_the_escape_codes_add_no_width(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    console = make_console(file=buffer, width=80, force_terminal=True, color_system="truecolor")
    assert main(["--readings", str(READINGS), "show", "04-forward-prefetch"], console=console) == 0
    out = buffer.getvalue()
    assert "\x1b[" in out
    plain = ANSI.sub("", out).splitlines()
    assert max(len(line) for line in plain) <= 80
