"""The ```predict block: parsing (problems pinned to lines), reading observed values, comparing answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from reader.format.errors import GuideError
from reader.format.parse import parse_guide
from reader.format.predict import (
    NotObserved,
    PredictQuestion,
    agrees,
    invalid,
    observed,
    order_difference,
    parse_answer,
    parse_number,
)
from tests.reader.reader_support import PREFETCH_ANCHOR, guide

CLAIM = """
[[claims]]
id = "forward-order"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
"""


def body(block: str) -> str:
    return f"# Forward prefetch\n\n## Predict\n\n{block}\n\n## Read\n\nProse after.\n"


NUMBER = """```predict root-size
question = "How many elements does the root's all-gather write?"
kind = "number"
answer = 3528
claim = "forward-order"
observe = "sizes.root"
explain = "No padding is needed."
```"""


def parse(block: str) -> list[PredictQuestion]:
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body(block))
    return parse_guide(text, Path("readings/04-forward-prefetch.md")).regions_of(PredictQuestion)


def problems(block: str) -> list[tuple[int, str]]:
    with pytest.raises(GuideError) as caught:
        parse(block)
    return [(p.line, p.message) for p in caught.value.problems]


def fence_line() -> int:
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body(NUMBER))
    return text.split("\n").index("```predict root-size") + 1


def test_a_question_is_a_region_between_prose() -> None:
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body(NUMBER))
    parsed = parse_guide(text, Path("readings/04-forward-prefetch.md"))
    [question] = parsed.regions_of(PredictQuestion)
    assert (question.id, question.kind, question.answer, question.observe) == (
        "root-size",
        "number",
        3528,
        "sizes.root",
    )
    kinds = [type(r).__name__ for r in parsed.regions]
    assert kinds == ["Prose", "PredictQuestion", "Prose"]
    assert parsed.raw(question).startswith("```predict root-size")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('claim = "forward-order"', 'claim = "forwrd-order"'), "names claim `forwrd-order`"),
        (("answer = 3528", 'answer = "many"'), "`answer` does not fit kind `number`"),
        (('kind = "number"', 'kind = "guess"'), "unknown kind `guess`"),
        (("answer = 3528", "answer = 3528\nhint = 1"), "unknown key `hint`"),
        (('explain = "No padding is needed."', ""), "`explain` must be a non-empty string"),
        (("answer = 3528", "answer = 3528\ntolerance = -1"), "`tolerance` is a non-negative number"),
        (('observe = "sizes.root"', 'observe = "sizes.root"\nshow = "."'), "`show` is a dotted path"),
        (("answer = 3528", "answer = = 3528"), "is not TOML"),
    ],
)
def test_problems_name_the_fence_line(edit: tuple[str, str], message: str) -> None:
    found = problems(NUMBER.replace(*edit))
    assert any(line == fence_line() and message in text for line, text in found), found


def test_a_choice_answer_must_be_one_of_the_choices_and_ids_unique() -> None:
    choice = NUMBER.replace('kind = "number"', 'kind = "choice"\nchoices = ["early", "late"]').replace(
        "answer = 3528", 'answer = "never"'
    )
    assert any("does not fit kind `choice`" in m for _, m in problems(choice))
    assert any("duplicate predict question `root-size`" in m for _, m in problems(NUMBER + "\n\n" + NUMBER))


def test_observed_follows_keys_and_indices() -> None:
    value = {"sizes": {"root": 3528}, "order": ["a", "b"]}
    assert observed(value, "sizes.root") == 3528
    assert observed(value, "order.1") == "b" and observed(value, "order.-1") == "b"
    assert observed(value, ".") is value
    assert observed({"eval": {"1.scale": "fp32", "1": {"scale": "no"}}}, "eval.1.scale") == "fp32"  # longest key
    with pytest.raises(NotObserved, match="no `leaf`"):
        observed(value, "sizes.leaf")
    with pytest.raises(NotObserved):
        observed(value, "order.7")


def test_answers_are_parsed_and_compared_by_kind() -> None:
    [number] = parse(NUMBER)
    assert agrees(number, parse_answer(number, "3,528")) and not agrees(number, parse_answer(number, "3529"))
    assert parse_answer(number, "lots") is None and not agrees(number, None)
    order = PredictQuestion("o", "q", "order", ["root -> blocks.0", "blocks.0 -> blocks.1"], "c", None, None, "", (),
                            0.0, 1, 2)  # fmt: skip
    assert agrees(order, parse_answer(order, "root ->  blocks.0; blocks.0 -> blocks.1"))
    assert not agrees(order, parse_answer(order, "blocks.0 -> blocks.1, root -> blocks.0"))
    choice = PredictQuestion("c", "q", "choice", "late", "c", None, None, "", ("early", "late"), 0.0, 1, 2)
    assert agrees(choice, parse_answer(choice, "b")) and agrees(choice, parse_answer(choice, "late"))
    assert not agrees(choice, parse_answer(choice, "a)"))
    text = PredictQuestion("t", "q", "text", "because", "c", None, None, "", (), 0.0, 1, 2)
    assert not agrees(text, "because")  # text answers are compared by the learner, not scored


def _question(kind: str, answer: object, choices: tuple[str, ...] = ()) -> PredictQuestion:
    return PredictQuestion("q", "q", kind, answer, "c", None, None, "", choices, 0.0, 1, 2)


def test_arrows_case_separators_and_units_are_read_as_a_learner_writes_them() -> None:
    """Guides 06 and 17 write "→", 04 writes "->"; a reduce op is "AVG"; sizes come with separators and units."""
    order = _question("order", ["root→1", "1→0"])
    assert agrees(order, parse_answer(order, "root -> 1, 1 -> 0"))
    assert agrees(order, parse_answer(order, "ROOT=>1; 1 → 0"))
    assert not agrees(order, parse_answer(order, "root -> 0, 1 -> 0"))
    choice = _question("choice", "AVG", ("SUM", "AVG"))
    assert agrees(choice, parse_answer(choice, "avg")) and agrees(choice, parse_answer(choice, "B)"))
    number = _question("number", 206352)
    for typed in ("206352", "206,352", "206_352", "206 352", "206352 bytes", "206,352 B", "206352 elements"):
        assert agrees(number, parse_answer(number, typed)), typed
    assert parse_number("201.5 KiB") == 201.5 * 1024 and parse_number("1.5 MB") == 1.5e6
    assert parse_number("zero") == 0 and parse_number("Three") == 3
    assert not agrees(_question("number", 3), parse_answer(_question("number", 3), "zero"))


def test_an_answer_that_does_not_fit_its_question_is_refused_with_the_reason() -> None:
    number = _question("number", 4)
    assert invalid(number, "four") is None and invalid(number, "4") is None
    assert invalid(number, "lots") == "a number, such as 3528, 3,528 or 206352 bytes"
    assert invalid(number, "4 apples") is not None  # not a unit: refused, never read as 4
    choice = _question("choice", "late", ("early", "late"))
    assert invalid(choice, "z") == "one of the letters a, b, or a choice's text"
    assert invalid(choice, "LATE") is None and invalid(choice, "b") is None
    assert invalid(_question("order", ["a"]), "") == "type an answer"


def test_an_order_answer_names_what_is_missing_and_what_is_extra() -> None:
    order = _question("order", ["root -> blocks.0", "blocks.0 -> blocks.1", "blocks.1 -> blocks.2"])
    given = parse_answer(order, "root → blocks.0, blocks.1 -> blocks.2, blocks.2 -> blocks.3")
    assert order_difference(order, given) == (["blocks.0 -> blocks.1"], ["blocks.2 -> blocks.3"])
    assert order_difference(order, list(reversed(order.answer))) == ([], [])  # same items: only the order differs
