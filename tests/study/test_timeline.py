"""``fsdp-readings timeline`` as a reader meets it: driven in-process on the session's rank pool (the same code path
as the command line), printed to the console the CLI makes, as it is when piped (no terminal)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace as Record

import pytest
import torch

from checks.breakit.patches import wrapping
from checks.guides.g04_forward_prefetch import prefetch_two_ahead
from checks.ranks.manager import PoolManager
from reader.commands.app import build_parser, make_console
from reader.format.parse import load_guide
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.checkref import CheckFinder
from reader.source.torch_source import open_source
from reader.views.lanes import Span, rows

REPO = Path(__file__).resolve().parents[2]
READINGS = REPO / "readings"
TORCH_PARENT = Path(torch.__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[")
GUIDE, CLAIM = "04-forward-prefetch", "follows-iteration-1-order"
EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


def run(argv: list[str], pool: PoolManager | None = None, patches: tuple = (), width: int = 80) -> tuple[int, str]:
    """The command's exit code and what it printed on the CLI's own console, not a terminal (as when piped)."""
    args = build_parser().parse_args(["--readings", str(READINGS), "timeline", *argv])
    args.manager, args.patches = pool, patches
    out = io.StringIO()
    code = args.run(args, make_console(file=out, width=width))
    return code, out.getvalue()


def section(out: str, start: str, end: str | None = None) -> str:
    """The text from the line holding ``start`` up to the line holding ``end``."""
    tail = out[out.index(start) :]
    return tail[: tail.index(end)] if end is not None and end in tail else tail


PREFETCH = re.compile(r"prefetch (\S+) -> (\S+)")
SOURCE = re.compile(r"(\S+\.py):(\d+) › (\d+)")
ANCHOR = re.compile(r"★ (\S+)")
ROW_START = re.compile(r"^\s*\d+ [F·][U·][P·][R·][C·] ")


def prefetch_rows(text: str) -> list[tuple[str, str, str, int, int, str | None]]:
    """(issuer, target, file, source line, via line, anchor) of each prefetch row. Where they do not fit beside
    the event, the held units, the source and the anchor are on the lines under it, up to the next row."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = PREFETCH.search(line)
        if match is None or not ROW_START.match(line):
            continue
        block = [line]
        for below in lines[i + 1 :]:
            if ROW_START.match(below) or "━" in below:
                break
            block.append(below)
        joined = " ".join(block)
        source, anchor = SOURCE.search(joined), ANCHOR.search(joined)
        assert source is not None, block
        file, line_no, via = source.groups()
        found.append((*match.groups(), file, int(line_no), int(via), anchor.group(1) if anchor else None))
    return found


@pytest.fixture(scope="module")
def drawn(pool: PoolManager) -> str:
    code, out = run([GUIDE, CLAIM, "--all-ranks", "--iteration", "2"], pool)
    if "did not run" in out and "skipped" in out:
        pytest.skip(out)
    assert code == 0, out
    return out


def test_iteration_2_shows_the_forward_prefetches_in_iteration_1_order(drawn: str) -> None:
    assert "forward · iteration 1" not in drawn  # --iteration 2 draws iteration 2 only
    for rank in (0, 1):
        rank_part = section(drawn, f"rank {rank}:", f"rank {rank + 1}:")
        forward = section(rank_part, "forward · iteration 2", "backward · iteration 2")
        pairs = [f"{issuer} -> {target}" for issuer, target, *_ in prefetch_rows(forward)]
        assert pairs == ["root -> blocks.0", "blocks.0 -> blocks.1", "blocks.1 -> blocks.2"]


def test_every_prefetch_row_names_torch_lines_inside_a_quoted_anchor(drawn: str) -> None:
    guide = load_guide(READINGS / f"{GUIDE}.md", CheckFinder(extra_paths=[REPO]))
    workspace = Workspace(open_source(None), READINGS / LOCK_NAME)
    resolved, failed = workspace.resolutions(guide)
    workspace.source.close()
    assert not failed
    quoted = {block.anchor for block in guide.source_blocks()}
    found = prefetch_rows(drawn)
    assert len(found) == 12  # 3 forward + 3 backward prefetches on each of 2 ranks
    for issuer, target, file, source, via, anchor in found:
        path = f"torch/distributed/fsdp/{file}"
        text = (TORCH_PARENT / path).read_text(encoding="utf-8").splitlines()
        assert "_prefetch_handle(" in text[source - 1], (issuer, target, text[source - 1])  # the issuing call
        assert "_unshard(" in text[via - 1]  # the unshard it issued
        assert anchor in quoted, (issuer, target, anchor)
        span = resolved[anchor]
        assert span.relpath == path and span.start <= via <= span.end, (anchor, span.span(), via)


def test_the_header_says_rows_are_issue_order_not_concurrency(drawn: str) -> None:
    flat = " ".join(drawn.replace("│", " ").split())
    assert "streams do not overlap" in flat and "not concurrency" in flat
    assert "no record_comm block in this check" in flat  # guide 04's check records FSDP events only


def test_piped_output_has_no_colour_and_fits_80_columns(drawn: str) -> None:
    assert not ANSI.search(drawn)
    assert max(len(line) for line in drawn.splitlines()) <= 80


def test_a_failing_claim_still_draws_what_was_captured(pool: PoolManager) -> None:
    two_ahead = wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead)
    code, out = run([GUIDE, CLAIM, "--iteration", "2"], pool, patches=(two_ahead,), width=100)
    assert code == 1, out
    forward = section(out, "forward · iteration 2", "backward · iteration 2")
    order = ["root", "blocks.0", "blocks.1", "blocks.2"]  # iteration 1's forward order
    two_ahead_pairs = [f"{a} -> {b}" for a, b in zip(order, order[2:], strict=False)]
    assert [f"{a} -> {b}" for a, b, *_ in prefetch_rows(forward)] == two_ahead_pairs
    assert f"{CLAIM} failed" in out and "prefetch-order" in out


def test_a_claim_without_a_timeline_is_refused_at_once_with_the_claims_that_have_one() -> None:
    code, out = run([GUIDE, "prefetch-holds-next-unit"])  # no pool: refused before anything would run
    flat = " ".join(out.split())
    assert code == 2 and "prefetch-holds-next-unit has no timeline to draw" in flat
    assert "follows-iteration-1-order" in flat.split("it can draw:")[1]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([GUIDE, "no-such-claim"], f"{GUIDE} has no claim no-such-claim"),
        (["99-nothing", CLAIM], "unknown guide id: 99-nothing"),
        ([GUIDE, CLAIM, "--rank", "2"], "no rank 2"),
    ],
)
def test_broken_input_exits_2_naming_what_exists(argv: list[str], says: str) -> None:
    code, out = run(argv)  # no pool: nothing runs
    assert code == 2
    flat = " ".join(out.split())
    assert says in flat
    if "claim" in says:
        assert CLAIM in flat and "stale-order-after-change" in flat
    if "guide" in says:
        assert GUIDE in flat


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["timeline", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"timeline {GUIDE} {CLAIM} --iteration 2" in text
    assert "--all-ranks" in text and "exit status" in text


def test_rows_merge_collectives_into_their_phase_and_mark_the_narrowest_anchor() -> None:
    def event(seq: int, kind: str, unit: str = "root", state: str = "", iteration: int = 1, **kw: object) -> Record:
        fields = {"target": None, "detail": "", "source": "", "via": ""} | kw
        return Record(seq=seq, kind=kind, unit=unit, state=state, iteration=iteration, **fields)

    events = Record(events=[
        event(1, "root_pre_forward"),
        event(2, "unshard", state="FORWARD", source="torch/f.py:10"),
        event(4, "pre_backward", state="BACKWARD_PRE"),
        event(6, "final_callback"),
        event(7, "root_pre_forward", iteration=2),
    ])  # fmt: skip
    comm = Record(records=[
        Record(seq=3, op="all_gather", numel=1000, dtype="torch.float32", source="torch/g.py:5", in_backward=False),
        Record(seq=5, op="reduce_scatter", numel=8, dtype="torch.bfloat16", source="", in_backward=True),
    ])  # fmt: skip
    spans = [Span("whole", "torch/f.py", 1, 50), Span("statement", "torch/f.py", 9, 11)]
    drawn = rows([comm, events], spans)
    assert [(r.marker, r.phase, r.iteration, r.lane, r.text) for r in drawn] == [
        (True, "forward", 1, "F", "forward"),
        (False, "forward", 1, "F", "root pre-forward (root)"),
        (False, "forward", 1, "U", "unshard root"),
        (False, "forward", 1, "U", "all_gather 1,000 fp32 (4,000 B)"),
        (True, "backward", 1, "F", "backward"),
        (False, "backward", 1, "F", "pre-backward root"),
        (False, "backward", 1, "C", "reduce_scatter 8 bf16 (16 B)"),
        (False, "backward", 1, "F", "final callback"),
        (True, "forward", 2, "F", "forward"),
        (False, "forward", 2, "F", "root pre-forward (root)"),
    ]
    assert [r.anchor for r in drawn if r.source] == ["statement", None]
    # The unshard holds root; its all-gather (1,000 fp32) is root's size.
    assert [(r.text, r.held, r.held_bytes) for r in drawn if not r.marker][1:3] == [
        ("unshard root", ("root",), None),
        ("all_gather 1,000 fp32 (4,000 B)", ("root",), 4000),
    ]


def test_a_recording_without_fsdp_events_puts_only_autograds_collectives_under_backward() -> None:
    """A check that records collectives alone (DDP, or FSDP without record_events): a collective autograd issued
    is in backward; the others are outside backward, not under the last backward marker; an iteration ends
    where a backward does."""

    class Record:
        def __init__(self, **kw) -> None:
            self.__dict__.update(kw)

    def collective(seq: int, op: str, in_backward: bool) -> Record:
        return Record(seq=seq, op=op, numel=4, dtype="torch.float32", source="", in_backward=in_backward)

    comm = Record(records=[
        collective(1, "all_reduce", True),  # DDP's bucket, from autograd
        collective(2, "all_gather", False),  # an FSDP forward all-gather
        collective(3, "reduce_scatter", True),
        collective(4, "all_gather", False),  # the next step's forward
    ])  # fmt: skip
    drawn = rows([comm])
    assert [(r.marker, r.phase, r.iteration) for r in drawn] == [
        (True, "backward", 1), (False, "backward", 1),
        (True, "outside backward", 2), (False, "outside backward", 2),
        (True, "backward", 2), (False, "backward", 2),
        (True, "outside backward", 3), (False, "outside backward", 3),
    ]  # fmt: skip
