"""Guide parsing: the model of a good guide, and every kind of bad input named by line with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from reader.format.errors import GuideError
from reader.format.guide import Prose, SourceBlock
from reader.format.parse import looks_like_guide, parse_guide
from reader.source.checkref import CheckFinder
from tests.reader.reader_support import PREFETCH_ANCHOR, UNSHARD_ANCHOR, guide

CLAIM = """
[[claims]]
id = "forward-order"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
markers = ["slow"]
evidence = ["prefetch"]
timeout = 90

[claims.kwargs]
mode = "forward"
iterations = 2
"""

BODY = """
# Forward prefetch

Read the function first.

```source prefetch
note "handle._prefetched = True": marks the handle so it is not prefetched twice.
    A continuation line joins the note.

note 'if not handle:': nothing to prefetch.
```

```python
print("an ordinary code block is prose")
```
"""


@pytest.fixture
def checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CheckFinder:
    package = tmp_path / "site" / "fakechecks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "prefetch.py").write_text(
        "import torch  # never imported by the finder\n\n\ndef forward_order(**kwargs):\n    pass\n\n\n"
        "def backward_order(**kwargs):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return CheckFinder()


def parse(text: str, checks: CheckFinder | None = None, name: str = "04-forward-prefetch.md"):
    return parse_guide(text, Path("readings") / name, checks)


def problems(text: str, checks: CheckFinder | None = None) -> list[tuple[int, str, str]]:
    with pytest.raises(GuideError) as info:
        parse(text, checks)
    return [(p.line, p.message, p.fix) for p in info.value.problems]


def test_a_good_guide(checks: CheckFinder):
    g = parse(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=CLAIM, body=BODY), checks)
    assert (g.id, g.title, g.order, str(g.torch)) == ("04-forward-prefetch", "Forward prefetch", 4, ">=2.13")
    assert [(a.name, a.line) for a in g.anchors] == [("prefetch", 8), ("unshard", 12)]
    (claim,) = g.claims
    assert claim.line == 16 and claim.world_size == 2 and claim.markers == ("slow",)
    assert claim.kwargs == {"mode": "forward", "iterations": 2} and claim.evidence == ("prefetch",)
    assert claim.timeout == 90.0
    kinds = [type(r) for r in g.regions]
    assert kinds == [Prose, SourceBlock, Prose]
    block = g.source_blocks("prefetch")[0]
    assert (block.start, block.end) == (33, 38)
    assert [(n.pattern, n.line) for n in block.notes] == [
        ("handle._prefetched = True", 34),
        ("if not handle:", 37),
    ]
    assert block.notes[0].text.endswith("twice. A continuation line joins the note.")
    assert g.applies_to("2.13.0+cpu") and g.applies_to("2.14.0.dev20250101") and not g.applies_to("2.12.1")


def test_front_matter_missing_or_unclosed():
    assert problems("# just markdown\n")[0][:2] == (1, "no TOML front matter")
    assert problems("+++\nid = 'x'\n")[0][:2] == (1, "the front matter opened on line 1 is never closed")


def test_malformed_toml_points_at_the_md_line():
    ((line, message, fix),) = problems(guide(anchors=PREFETCH_ANCHOR).replace('name = "prefetch"', "name = prefetch"))
    assert line == 9 and message.startswith("malformed TOML front matter: Invalid value")
    assert "strings need quotes" in fix


def test_missing_and_mistyped_top_level_keys():
    text = '+++\ntitel = "x"\norder = "four"\ntorch = "~~2"\n+++\n'
    found = problems(text)
    assert (2, "unknown key `titel` in front matter", "did you mean `title`?") in found
    assert any(line == 3 and "`order` must be an integer" in m for line, m, _ in found)
    assert any(line == 4 and "not a PEP 440 version specifier" in m for line, m, _ in found)
    assert any("missing `id`" in m and 'add `id = "04-forward-prefetch"`' in f for _, m, f in found)


@pytest.mark.parametrize(
    "symbol,fix",
    [
        (
            "torch.distributed.fsdp._runtime_utils._prefetch_handle",
            "`torch.distributed.fsdp._runtime_utils:_prefetch_handle`",
        ),
        ("numpy.linalg:norm", "must start with `torch.`"),
        ("torch.a:b c", "`package.module:Class.method`"),
    ],
)
def test_unknown_anchor_syntax(symbol: str, fix: str):
    ((line, message, found_fix),) = problems(
        guide(anchors=PREFETCH_ANCHOR.replace("torch.distributed.fsdp._runtime_utils:_prefetch_handle", symbol))
    )
    assert line == 10 and message == f"unknown anchor syntax `{symbol}`" and fix in found_fix


def test_nested_function_anchor_syntax_is_accepted():
    anchors = '[[anchors]]\nname = "hook"\nsymbol = "torch.a._b:outer.<locals>.inner"\n'
    assert parse(guide(anchors=anchors)).anchors[0].qualname == "outer.<locals>.inner"


def test_duplicate_anchor_names_and_claim_ids(checks: CheckFinder):
    anchors = PREFETCH_ANCHOR + PREFETCH_ANCHOR.replace("_prefetch_handle", "_unshard")
    claims = CLAIM.replace('\n[claims.kwargs]\nmode = "forward"\niterations = 2\n', "") * 2
    found = problems(guide(anchors=anchors, claims=claims), checks)
    assert (
        13,
        "duplicate anchor name `prefetch` (first on line 9)",
        "give every anchor of a guide its own name",
    ) in found
    assert any(line == 26 and m == "duplicate claim id `forward-order` (first on line 17)" for line, m, _ in found)


def test_missing_check_module_and_function(checks: CheckFinder):
    found = problems(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("forward_order", "forwrd_order")), checks)
    ((line, message, fix),) = found
    assert line == 15 and "`forwrd_order` is not defined in fakechecks.prefetch" in message
    assert "did you mean `fakechecks.prefetch:forward_order`" in message and "prefetch.py" in fix
    found = problems(
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("fakechecks.prefetch", "fakechecks.nope")), checks
    )
    assert found[0][:2] == (15, "check module `fakechecks.nope` not found on sys.path")
    assert "create fakechecks/nope.py" in found[0][2]
    bad = problems(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("fakechecks.prefetch:", "fakechecks.")), checks)
    assert "is not `module:function`" in bad[0][1]


def test_check_lookup_never_imports_the_check_module(checks: CheckFinder):
    import sys

    parse(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM), checks)
    assert "fakechecks" not in sys.modules and "fakechecks.prefetch" not in sys.modules


def test_bad_claim_fields():
    claims = CLAIM.replace("world_size = 2", "world_size = 0").replace('["slow"]', '["slow", "world_size"]')
    claims = claims.replace("timeout = 90", "timeout = -1").replace('evidence = ["prefetch"]', 'evidence = ["prefech"]')
    claims = claims.replace("timeout = -1", "timeout = -1\nbogus = 1")
    found = problems(guide(anchors=PREFETCH_ANCHOR, claims=claims))
    messages = {m for _, m, _ in found}
    assert "`world_size` must be a positive integer, not 0" in messages
    assert "`world_size` is not set through `markers`" in messages
    assert "`timeout` must be a positive number of seconds, not -1" in messages
    assert "`evidence` names `prefech`, which is not an anchor of this guide" in messages
    assert any(f == "did you mean `prefetch`?" for _, _, f in found)
    assert (20, "unknown key `bogus` in [[claims]]") in {(line, m) for line, m, _ in found}


def test_bad_pattern():
    found = problems(guide(anchors=PREFETCH_ANCHOR + 'pattern = "\\"unterminated"\n'))
    assert found[0][0] == 11 and "is not Python code" in found[0][1]


def test_directive_problems_point_at_their_lines():
    body = """
```source prefetc
note "x": y
```

```source prefetch
paste of code here
note "if not handle:" missing colon
note if_not_quoted: text
note "\\"open": text
```

```source
```
"""
    found = problems(guide(anchors=PREFETCH_ANCHOR, body=body))
    lines = {line: message for line, message, _ in found}
    assert lines[12] == "source block names `prefetc`, which is not an anchor of this guide"
    assert lines[17].startswith("unknown line in a source block")
    assert "missing `:`" in lines[18]
    assert lines[19] == "a note needs its code pattern as a quoted string"
    assert "is not Python code" in lines[20]
    assert lines[23] == "a source block names one anchor, got `source`"


def test_one_bad_symbol_does_not_cascade():
    anchors = PREFETCH_ANCHOR.replace(":_prefetch_handle", "._prefetch_handle")
    found = problems(guide(anchors=anchors, claims=CLAIM.replace("fakechecks", "x"), body=BODY))
    assert [m for _, m, _ in found] == [
        "unknown anchor syntax `torch.distributed.fsdp._runtime_utils._prefetch_handle`"
    ]


def test_which_markdown_files_are_guides(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text("# Readings\n")
    numbered = tmp_path / "05-backward.md"
    numbered.write_text("# forgot the front matter\n")
    fronted = tmp_path / "notes.md"
    fronted.write_text("+++\n+++\n")
    assert not looks_like_guide(readme)
    assert looks_like_guide(numbered) and looks_like_guide(fronted)


EXPECT_CLAIM = CLAIM.replace('mode = "forward"', 'mode = "forward"\norder = { expect = "order" }')
EXPECT_BODY = (
    BODY
    + """
The order, as the guide states it:

```expect order pairs
root -> blocks.0

blocks.0 -> blocks.1
```
"""
)


def test_expect_block_feeds_a_claim(checks: CheckFinder):
    g = parse(guide(anchors=PREFETCH_ANCHOR, claims=EXPECT_CLAIM, body=EXPECT_BODY), checks)
    (block,) = g.expect_blocks().values()
    assert block.name == "order" and block.items == ("root -> blocks.0", "blocks.0 -> blocks.1")
    (claim,) = g.claims
    assert claim.kwargs["order"] == {"expect": "order"}  # the spec keeps the reference; resolution is explicit
    kwargs = g.claim_kwargs(claim)
    assert kwargs["order"] is block.expected and (kwargs["mode"], kwargs["iterations"]) == ("forward", 2)
    assert block.expected.pairs == [("root", "blocks.0"), ("blocks.0", "blocks.1")]
    # each row keeps the line the parser read it on (a blank line between rows counts)
    assert [row.line for row in block.expected] == [block.start + 1, block.start + 3]


def test_expect_block_problems(checks: CheckFinder):
    body = EXPECT_BODY + "\n```expect order lines\nx\n```\n\n```expect\n```\n\n```expect empty lines\n```\n"
    claims = EXPECT_CLAIM.replace('{ expect = "order" }', '{ expect = "ordr" }')
    found = problems(guide(anchors=PREFETCH_ANCHOR, claims=claims, body=body), checks)
    messages = {m: (line, fix) for line, m, fix in found}
    assert messages["claim `forward-order` takes `order` from expect block `ordr`, which this guide does not have"] == (
        12, "did you mean `order`?")  # fmt: skip
    assert any(m.startswith("duplicate expect block `order` (first on line") for m in messages)
    assert "an expect block has a name and a shape, got `expect`" in messages
    assert "expect block `empty` is empty" in messages


def test_an_xfail_table_is_read_into_the_claim(checks: CheckFinder):
    xfail = 'xfail = { reason = "pytorch#1: why", issue = "https://github.com/o/r/issues/1", fails_with = "bad-order" }'
    claims = CLAIM.replace("timeout = 90", f"timeout = 90\n{xfail}")
    (claim,) = parse(guide(anchors=PREFETCH_ANCHOR, claims=claims), checks).claims
    assert claim.xfail is not None
    assert (claim.xfail.reason, claim.xfail.fails_with, claim.xfail.strict) == ("pytorch#1: why", "bad-order", True)


@pytest.mark.parametrize(
    ("xfail", "message"),
    [
        ('xfail = true', "`xfail` must be a table"),
        ('xfail = { reason = "r", issue = "https://x/1" }', "missing `fails_with` in claims #1"),
        ('xfail = { reason = "r", issue = "pytorch#1", fails_with = "a-b" }', "`issue = 'pytorch#1'` is not a URL"),
        ('xfail = { reason = "r", issue = "https://x/1", fails_with = "Not Kebab" }',
         '`fails_with = "Not Kebab"` is not a valid fails_with: the kebab-case `Violation` reason the check raises '
         "while the bug is there"),
        ('xfail = { strict = "yes", reason = "r", issue = "https://x/1", fails_with = "a" }',
         "`strict` must be true or false, not 'yes'"),
        ('xfail = { reason = "r", issue = "https://x/1", fails_with = "a", raises = "a" }',
         "unknown key `raises` in xfail"),
    ],
)  # fmt: skip
def test_bad_xfail_tables(xfail: str, message: str):
    claims = CLAIM.replace("timeout = 90", f"timeout = 90\n{xfail}")
    found = problems(guide(anchors=PREFETCH_ANCHOR, claims=claims))
    assert (20, message) in {(line, m) for line, m, _ in found}


def test_property_and_claim_torch_fields(checks: CheckFinder):
    extra = 'torch = ">=2.14.1"\nproperty = { draw = "fakechecks.prefetch:backward_order", examples = 5 }'
    (claim,) = parse(
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("timeout = 90", f"timeout = 90\n{extra}")), checks
    ).claims
    assert claim.property is not None and (claim.property.draw, claim.property.examples) == (
        "fakechecks.prefetch:backward_order",
        5,
    )
    assert claim.torch is not None and not claim.applies_to("2.13.0") and claim.applies_to("2.15.0")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('property = "x"', "`property` must be a table"),
        ('property = { draw = "fakechecks.prefetch:nope", examples = 5 }',
         "`nope` is not defined in fakechecks.prefetch"),
        ('property = { draw = "fakechecks.prefetch:backward_order", examples = 0 }',
         "`examples` must be an integer from 1 to 1000, not 0"),
        ('property = { draw = "fakechecks.prefetch:backward_order" }',
         "`examples` must be an integer from 1 to 1000, not None"),
        ('torch = "2.14"', '`torch = "2.14"` is not a PEP 440 version specifier'),
        ("torch = 2", "`torch` must be a PEP 440 version specifier string"),
    ],
)  # fmt: skip
def test_bad_property_and_claim_torch_fields(checks: CheckFinder, extra: str, message: str):
    found = problems(
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("timeout = 90", f"timeout = 90\n{extra}")), checks
    )
    assert any(m.startswith(message) for _, m, _ in found), found


def test_a_claim_names_the_backends_it_is_written_for(checks: CheckFinder):
    (claim,) = parse(
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("timeout = 90", 'timeout = 90\nbackend = "gloo"')), checks
    ).claims
    assert claim.backends == ("gloo",)
    found = problems(
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.replace("timeout = 90", 'timeout = 90\nbackend = "mpi"'))
    )
    assert (20, "`backend` must name gloo or nccl, not 'mpi'") in {(line, m) for line, m, _ in found}
