"""Expect fences parsed into typed rows at collection time (`reader.format.expect_rows`), and the helpers a
check fails through (`checks.expected`): each shape's grammar, continuation lines, the problems a row that does not
fit raises (its line and fix), and the row record a `Violation` carries back."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from checks.expected import Expected, Row
from checks.violation import Violation
from reader.format.blocks import expect_blocks
from reader.format.body import BodyContext, Fence
from reader.format.errors import Problems
from reader.format.guide import ExpectBlock

FENCE_LINE = 20  # where the fence opens in a guide: the rows are read from line 21


def parsed(fence: str, rows: str) -> tuple[ExpectBlock | None, list[tuple[int, str, str]], list[str]]:
    """The block, the problems (line, message, fix) and the lines as numbered in the guide (index 0 is line 1),
    for one ```` ```<fence> ```` holding ``rows``, parsed by the registered body parser."""
    kind, *args = fence.split()
    opened = Fence(kind, tuple(args), rows, FENCE_LINE, FENCE_LINE + rows.count("\n") + 1)
    found = Problems(Path("readings/04-forward-prefetch.md"))
    context = BodyContext(guide=None, anchors=frozenset(), problems=found)  # type: ignore[arg-type]
    blocks = list(expect_blocks([opened], context))
    lines = [""] * (FENCE_LINE - 1) + [f"```{fence}", *rows.split("\n")]
    return (blocks[0] if blocks else None), [(p.line, p.message, p.fix) for p in found.found], lines


def line_of(lines: list[str], text: str) -> int:
    return lines.index(text) + 1


def test_pairs_rows_split_at_the_one_arrow() -> None:
    block, problems, lines = parsed("expect block pairs", "root      -> blocks.0\nblocks.0  → blocks.1\n")
    assert problems == []
    assert block.shape == "pairs" and block.expected.pairs == [("root", "blocks.0"), ("blocks.0", "blocks.1")]
    assert [r.line for r in block.expected] == [
        line_of(lines, "root      -> blocks.0"),
        line_of(lines, "blocks.0  → blocks.1"),
    ]


def test_mapping_keys_end_at_the_first_colon_and_space() -> None:
    block, problems, _ = parsed(
        "expect block mapping", "iteration 1: 394752\nroot: 3528 in 4 parameters, shared x: y\n"
    )
    assert problems == []
    assert block.expected.mapping == {"iteration 1": "394752", "root": "3528 in 4 parameters, shared x: y"}
    assert block.expected.row("iteration 1").cells == ("iteration 1", "394752")


def test_a_table_has_a_header_and_cells_two_spaces_apart() -> None:
    rows = "moment         PRE  POST\ncompute root   2    1\npost-backward root  0  0\n"
    block, problems, _ = parsed("expect block table", rows)
    assert problems == []
    table = block.expected
    assert table.header == ("moment", "PRE", "POST") and table.keys == ["compute root", "post-backward root"]
    assert table.column("POST") == {"compute root": "1", "post-backward root": "0"}
    assert table.cells(table.row("compute root")) == {"moment": "compute root", "PRE": "2", "POST": "1"}


def test_lines_keep_their_text_and_inner_spacing() -> None:
    block, problems, _ = parsed("expect block lines", "A       0     10  w0 2x5\n|r0           |r1\n")
    assert problems == []
    assert block.expected.texts == ["A       0     10  w0 2x5", "|r0           |r1"]
    assert block.expected.flats == ["A 0 10 w0 2x5", "|r0 |r1"]


def test_an_indented_line_continues_the_row_above_which_keeps_its_line() -> None:
    rows = "automatic: A.first\n           → A.second\n           → A.third\nmanual: B.first\n"
    block, problems, lines = parsed("expect block mapping", rows)
    assert problems == []
    assert block.expected.mapping == {"automatic": "A.first → A.second → A.third", "manual": "B.first"}
    assert [r.line for r in block.expected] == [line_of(lines, "automatic: A.first"), line_of(lines, "manual: B.first")]
    assert block.items == tuple(rows.rstrip().split("\n"))  # what a reader is shown: the lines as written


def test_the_shape_comes_before_a_torch_scope() -> None:
    block, problems, _ = parsed("expect block pairs [torch >=2.15]", "a -> b\n")
    assert problems == [] and block.shape == "pairs" and str(block.torch) == ">=2.15"


@pytest.mark.parametrize(
    ("fence", "rows", "bad_row", "message", "fix_starts"),
    [
        ("expect block pairs", "a -> b\na b\n", "a b",
         "a pairs row has one arrow with text on both sides; `a b` has 0 arrow(s)", "write the row as `<from> → <to>`"),
        ("expect block pairs", "a -> b -> c\n", "a -> b -> c",
         "a pairs row has one arrow with text on both sides; `a -> b -> c` has 2 arrow(s)", "write the row as"),
        ("expect block mapping", "a: 1\nb 2\n", "b 2",
         "a mapping row is `key: values`; `b 2` has no key, no `: ` or no values", "write the row as `<key>:"),
        ("expect block mapping", "a: 1\na: 2\n", "a: 2",
         "the key `a` is already a row of this mapping (line {first})", "give each row its own key"),
        ("expect block table", "unit  bytes\nroot  1  2\n", "root  1  2",
         "a table row has 2 cells like its header; `root  1  2` has 3", "separate a table's cells"),
        ("expect block table", "unit  bytes\nroot  1\n  more\n", "  more",
         "a table row cannot continue on the next line", "separate a table's cells"),
        ("expect block lines", "  a\nb\n", "  a",
         "the block's first row is indented deeper than the rows after it", "start every row at the same indent"),
    ],
)  # fmt: skip
def test_a_row_that_does_not_fit_its_shape_is_a_problem_on_its_line(
    fence: str, rows: str, bad_row: str, message: str, fix_starts: str
) -> None:
    block, problems, lines = parsed(fence, rows)
    first = line_of(lines, rows.split("\n", maxsplit=1)[0])
    ((line, said, fix),) = problems
    assert (line, said) == (line_of(lines, bad_row), message.format(first=first)) and fix.startswith(fix_starts)
    assert block is not None and block.expected is None  # never handed to a check (the guide does not load)


def test_a_fence_without_a_shape_says_which_shapes_there_are() -> None:
    block, problems, lines = parsed("expect block", "a -> b\n")
    ((line, message, fix),) = problems
    assert (line, message) == (
        line_of(lines, "```expect block"),
        "an expect block has a name and a shape, got `expect block`",
    )
    assert "lines, pairs, mapping, table" in fix and block is None


# -- the helpers a check fails through -----------------------------------------------------------------------------
BLOCK = Expected(
    "order",
    "pairs",
    (Row(10, "root -> blocks.0", "root", "blocks.0"), Row(11, "blocks.0 -> blocks.1", "blocks.0", "blocks.1")),
    line=9,
)


def test_fail_records_the_rows_key_and_line_in_the_violation() -> None:
    with pytest.raises(Violation) as caught:
        BLOCK.fail(BLOCK.row("blocks.0"), "prefetch-order", "blocks.0 prefetched blocks.2", observed="blocks.2")
    assert caught.value.reason == "prefetch-order" and caught.value.details == {"observed": "blocks.2"}
    assert caught.value.expect_rows == ({"block": "order", "line": 11, "key": "blocks.0"},)
    assert pickle.loads(pickle.dumps(BLOCK)) == BLOCK  # it travels to the ranks as it is


def test_require_rows_names_the_first_row_that_differs_or_is_missing() -> None:
    BLOCK.require_rows(["root  ->  blocks.0", "blocks.0 -> blocks.1"], reason="r", what="prefetches")  # spacing
    for observed, line in ((["root -> blocks.0", "blocks.0 -> blocks.2"], 11), (["root -> blocks.0"], 11),
                           (["x"], 10), (["root -> blocks.0", "blocks.0 -> blocks.1", "extra"], 11)):  # fmt: skip
        with pytest.raises(Violation) as caught:
            BLOCK.require_rows(observed, reason="prefetch-order", what="prefetches")
        assert [r["line"] for r in caught.value.expect_rows] == [line], observed
        assert caught.value.details["expected"] == ["root -> blocks.0", "blocks.0 -> blocks.1"]


def test_require_values_names_every_row_whose_value_differs() -> None:
    BLOCK.require_values({"root": "blocks.0", "blocks.0": "blocks.1"}, reason="r", what="targets")
    with pytest.raises(Violation) as caught:
        BLOCK.require_values({"root": "blocks.2", "x": "y"}, reason="targets-differ", what="targets")
    assert [r["key"] for r in caught.value.expect_rows] == ["root", "blocks.0"]  # wrong, and not observed
    assert caught.value.details["unstated"] == ["x"]


def test_a_model_comparison_that_fails_first_names_the_rows_the_same_run_makes_false() -> None:
    observed = {"root": "blocks.2", "blocks.0": "blocks.1"}
    with pytest.raises(Violation) as caught, BLOCK.naming_false_rows(lambda: BLOCK.differing_values(observed)):
        raise Violation("differs-from-model", "root prefetched blocks.2, the model says blocks.0", unit="root")
    assert (caught.value.reason, caught.value.details) == ("differs-from-model", {"unit": "root"})
    assert [r["key"] for r in caught.value.expect_rows] == ["root"]
    with (
        pytest.raises(Violation) as unnamed,
        BLOCK.naming_false_rows(lambda: BLOCK.differing_values(observed, keys=["blocks.0"])),
    ):
        raise Violation("differs-from-model", "no row of blocks.0 is false")
    assert unnamed.value.expect_rows == ()  # raised as it was: no row to name
