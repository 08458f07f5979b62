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
    item_shape,
    normal,
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


def test_a_set_takes_its_items_in_any_order_and_an_order_does_not() -> None:
    units = _question("set", ["root", "blocks.1", "blocks.2"])
    assert agrees(units, parse_answer(units, "blocks.2, root, blocks.1"))
    ranks = _question("order", ["3x2", "3x2", "0x2"])
    assert agrees(ranks, parse_answer(ranks, "3x2 3x2 0x2")) and not agrees(ranks, parse_answer(ranks, "0x2 3x2 3x2"))


def test_a_typed_list_splits_as_the_answer_keys_items_read() -> None:
    names = _question("set", ["root", "blocks.1", "blocks.2"])
    for typed in ("root blocks.1 blocks.2", "root,blocks.1,blocks.2", "root -> blocks.1 -> blocks.2",
                  "root → blocks.1 → blocks.2", "root;  blocks.1\nblocks.2"):  # fmt: skip
        assert parse_answer(names, typed) == ["root", "blocks.1", "blocks.2"], typed
    pairs = _question("set", ["root -> blocks.0", "blocks.0 -> blocks.1"])
    for typed in ("root -> blocks.0, blocks.0 -> blocks.1", "root->blocks.0 blocks.0->blocks.1",
                  "root → blocks.0  blocks.0 → blocks.1", "blocks.0=>blocks.1; root -> blocks.0"):  # fmt: skip
        assert agrees(pairs, parse_answer(pairs, typed)) and invalid(pairs, typed) is None, typed
    phrases = _question("set", ["free split from _catch_all_reshard", "free dropped from _catch_all_reshard"])
    assert len(parse_answer(phrases, "free split from _catch_all_reshard, free dropped from _catch_all_reshard")) == 2
    assert invalid(phrases, "free split free dropped") == "these items have spaces in them: separate them with commas"


def test_a_pair_without_its_arrow_is_asked_again_not_graded() -> None:
    pairs = _question("set", ["root→1", "1→0"])
    assert (
        invalid(pairs, "root 1, 1 0") == "each item is a pair, issuer -> target, not 'root'; separate pairs with commas"
    )
    assert invalid(pairs, "root -> 1 -> 0") is not None  # a chain is not a list of pairs


GUIDES = Path(__file__).resolve().parents[2] / "readings"


def _list_questions() -> list[PredictQuestion]:
    from reader.format.parse import load_guide

    return [q for path in sorted(GUIDES.glob("[0-9][0-9]-*.md")) if not path.name.startswith("00")
            for q in load_guide(path).regions_of(PredictQuestion) if q.kind in ("order", "set")]  # fmt: skip


def _typed(question: PredictQuestion, arrow: str, separator: str) -> str:
    items = [normal(a).replace(" -> ", f" {arrow} ") for a in question.answer]
    if question.kind == "set":
        items = list(reversed(items))  # any order
    return separator.join(items)


@pytest.mark.parametrize("separator", [", ", " ", " -> ", " → "], ids=["commas", "spaces", "arrows", "unicode"])
def test_a_first_answer_to_every_list_question_is_graded_as_its_key_intends(separator: str) -> None:
    """The guide's own answer, typed as a learner would on a first try: comma-, space- or arrow-separated (arrows
    separate names; pairs keep their own arrow, written either way)."""
    for question in _list_questions():
        shape = item_shape(question)
        if (separator.strip() and shape != "names") or (separator == " " and shape == "phrases"):
            continue  # arrows separate names only (a pair's own arrow is its item); phrases take commas

        for arrow in ("->", "→"):
            typed = _typed(question, arrow, separator)
            assert invalid(question, typed) is None, (question.id, typed)
            assert agrees(question, parse_answer(question, typed)), (question.id, typed)


def test_a_number_may_carry_the_questions_own_noun_and_none_is_zero() -> None:
    question = PredictQuestion("n", "How many all-gathers does one backward issue?", "number", 4, "c", None, None, "",
                               (), 0.0, 1, 2)  # fmt: skip
    for typed in ("4 all-gathers", "4 all-gather", "four all-gathers", "4"):
        assert invalid(question, typed) is None and agrees(question, parse_answer(question, typed)), typed
    assert parse_answer(question, "none") == 0 and parse_answer(question, "No") == 0
    assert invalid(question, "4 apples") is not None and invalid(question, "four apples") is not None
