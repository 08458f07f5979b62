"""Body parsers are a registry keyed by fence kind: a new kind is one registered parser and its own region type."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from reader.format.body import BODY_PARSERS, BodyContext, Fence, register_body_parser
from reader.format.errors import GuideError
from reader.format.guide import ExpectBlock, Prose, SourceBlock
from reader.format.parse import parse_guide
from tests.reader.reader_support import PREFETCH_ANCHOR, Quiz, guide, quiz_blocks

BODY = """
# Prefetch

```quiz What does _prefetch_handle return?
nothing
```

Read it.

```source prefetch
note "handle._prefetched = True": marks the handle.
```
```quiz Who calls it?
the hooks
the root
```

The end.
"""


def parse(body: str):
    return parse_guide(guide(anchors=PREFETCH_ANCHOR, body=body), Path("readings/04-forward-prefetch.md"))


def test_a_registered_parser_yields_its_regions_in_order_with_prose_around(quiz_parser: str):
    g = parse(BODY)
    assert [type(r) for r in g.regions] == [Prose, Quiz, Prose, SourceBlock, Quiz, Prose]
    first, second = g.regions_of(Quiz)
    assert (first.question, first.answers) == ("What does _prefetch_handle return?", ("nothing",))
    assert (second.question, second.answers) == ("Who calls it?", ("the hooks", "the root"))
    assert [(r.start, r.end) for r in g.regions] == [(12, 13), (14, 16), (17, 19), (20, 22), (23, 26), (27, 29)]
    assert g.raw(second) == "```quiz Who calls it?\nthe hooks\nthe root\n```"
    assert g.regions_of(SourceBlock) == g.source_blocks() == g.source_blocks("prefetch")
    assert g.regions_of(ExpectBlock) == [] and g.expect_blocks() == {}


def test_a_registered_parser_reports_problems_by_line(quiz_parser: str):
    with pytest.raises(GuideError) as info:
        parse("Intro.\n\n```quiz\nx\n```\n")
    assert [(p.line, p.message) for p in info.value.problems] == [(14, "a quiz block needs a question")]


def test_an_unknown_fence_kind_stays_prose():
    assert "quiz" not in BODY_PARSERS
    g = parse(BODY.replace('```source prefetch\nnote "handle._prefetched = True": marks the handle.\n```\n', ""))
    (prose,) = g.regions
    assert isinstance(prose, Prose) and "```quiz Who calls it?\nthe hooks" in prose.text
    assert (prose.start, prose.end) == (12, 26)


def test_registering_a_kind_twice_is_an_error(quiz_parser: str):
    with pytest.raises(ValueError, match=r"a body parser for ```quiz fences is already registered: .*quiz_blocks"):
        register_body_parser("quiz", quiz_blocks)
    with pytest.raises(ValueError, match="already registered"):
        register_body_parser("source", quiz_blocks)  # the built-in kinds are registered the same way
    with pytest.raises(ValueError, match="one word"):
        register_body_parser("two words", quiz_blocks)
    assert BODY_PARSERS.kinds[-1] == "quiz" and {"source", "expect", "predict"} < set(BODY_PARSERS.kinds)


def test_a_parser_must_yield_regions_that_do_not_overlap():
    def not_a_region(fences: Sequence[Fence], context: BodyContext) -> Iterator[object]:
        yield "a string"

    def overlapping(fences: Sequence[Fence], context: BodyContext) -> Iterator[Quiz]:
        for fence in fences:
            yield Quiz("q", (), fence.start, fence.end)
            yield Quiz("again", (), fence.start, fence.end)

    for parser, error in ((not_a_region, TypeError), (overlapping, ValueError)):
        register_body_parser("quiz", parser)  # type: ignore[arg-type]
        try:
            with pytest.raises(error, match="```quiz parser yielded"):
                parse(BODY)
        finally:
            BODY_PARSERS.unregister("quiz")
