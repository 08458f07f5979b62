"""Predict questions: ```` ```predict <id> ```` fences, asked before the reading, revealed by a real run.

The fence holds TOML::

    ```predict reversed-order
    question = "Iteration 2 runs the blocks in reverse. Which prefetches does its forward issue?"
    kind = "set"                        # number | order | set | choice | text
    answer = ["root -> blocks.0"]       # the guide's answer, in the kind's shape
    claim = "stale-order-after-change"  # the claim whose run reveals it
    observe = "prefetched"              # where in the claim's returned value (rank 0's) the answer shows
    explain = "Forward prefetch follows the order iteration 1 recorded, not the one it runs now."
    ```

``observe`` is a dotted path into what the claim's check returns on rank 0 (``prefetched``, ``sizes.root``,
``0``); with it, ``pytest readings/`` runs the claim and fails the question if the guide's answer is not what
torch did. Without it the question is tied to the claim's outcome only (its check passing is the reveal).
``show`` is a path whose value is revealed but not compared (``.`` for the whole value), for an answer that is
not itself a value (a choice about *when*, a sentence). ``choices`` (a list) goes with ``kind = "choice"``;
``tolerance`` (absolute) may go with ``kind = "number"``. ``order`` is a list whose order is part of the answer
(one value per rank, per output); ``set`` is a list in any order (which units, which prefetches).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from reader.format.body import BodyContext, Fence, register_body_parser
from reader.format.errors import did_you_mean

KINDS = ("number", "order", "set", "choice", "text")
LISTS = ("order", "set")  # kinds whose answer is a list of items
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
KEYS = ("question", "kind", "answer", "claim", "observe", "show", "explain", "choices", "tolerance")
EXAMPLE = (
    'question = "..."\nkind = "number"\nanswer = 4\nclaim = "<claim id>"\nobserve = "<path in its value>"\n'
    'explain = "..."'
)


@dataclass(frozen=True)
class PredictQuestion:
    """One question of a guide's Predict section; a region of the body."""

    id: str
    question: str
    kind: str
    answer: Any
    claim: str
    observe: str | None
    show: str | None
    explain: str
    choices: tuple[str, ...]
    tolerance: float
    start: int
    end: int


def predict_blocks(fences: Sequence[Fence], context: BodyContext) -> Iterator[PredictQuestion]:
    claims = {c.id for c in context.guide.claims}
    seen: dict[str, int] = {}
    for fence in fences:
        start = fence.start
        if len(fence.args) != 1 or not ID_RE.match(fence.args[0]):
            context.problem(start, f"a predict block has one id, got `{fence.info}`", "write ```predict <question-id>")
            continue
        (qid,) = fence.args
        if qid in seen:
            context.problem(start, f"duplicate predict question `{qid}` (first on line {seen[qid]})", "rename one")
            continue
        seen[qid] = start
        try:
            data = tomllib.loads(fence.content)
        except tomllib.TOMLDecodeError as exc:
            context.problem(start, f"predict `{qid}` is not TOML: {exc}", f"write the block as TOML:\n{EXAMPLE}")
            continue
        question = _question(qid, data, fence, context, claims)
        if question is not None:
            yield question


def _question(
    qid: str, data: dict[str, Any], fence: Fence, context: BodyContext, claims: set[str]
) -> PredictQuestion | None:
    start, before = fence.start, len(context.problems.found)

    def problem(message: str, fix: str) -> None:
        context.problem(start, f"predict `{qid}`: {message}", fix)

    for key in sorted(set(data) - set(KEYS)):
        problem(f"unknown key `{key}`", f"use only {', '.join(KEYS)}")
    for key in ("question", "claim", "explain"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            problem(f"`{key}` must be a non-empty string", f'add `{key} = "..."`')
    kind = data.get("kind", "text")
    if kind not in KINDS:
        problem(f"unknown kind `{kind}`", f"use one of {', '.join(KINDS)}")
    claim = data.get("claim")
    if isinstance(claim, str) and claim not in claims:
        hint = did_you_mean(claim, claims)
        problem(f"names claim `{claim}`, which this guide does not make", hint or f"use one of {sorted(claims)}")
    choices = data.get("choices", [])
    answer = data.get("answer")
    if not _answer_fits(kind, answer, choices):
        problem(f"`answer` does not fit kind `{kind}`", _ANSWER_FIX.get(kind, "see reader/predict.py"))
    observe = data.get("observe")
    if observe is not None and (not isinstance(observe, str) or not observe.strip() or kind == "text"):
        problem("`observe` is a dotted path into the claim's value, and a text answer cannot be compared", "")
    show = data.get("show")
    if show is not None and (not isinstance(show, str) or not show.strip() or observe is not None):
        problem("`show` is a dotted path (or `.`), for a question without `observe`", "keep one of the two")
    tolerance = data.get("tolerance", 0)
    if type(tolerance) not in (int, float) or tolerance < 0 or (tolerance and kind != "number"):
        problem('`tolerance` is a non-negative number, for kind = "number" only', "remove it, or write 0.5")
    if len(context.problems.found) > before:
        return None
    return PredictQuestion(
        qid,
        data["question"].strip(),
        kind,
        answer,
        claim,
        observe,
        show,
        data["explain"].strip(),
        tuple(choices),
        float(tolerance),
        fence.start,
        fence.end,
    )


_ANSWER_FIX = {
    "number": "write a number: `answer = 3528`",
    "order": 'write a list of strings: `answer = ["3x2", "3x2", "0x2"]`',
    "set": 'write a list of strings: `answer = ["root -> blocks.0", "blocks.0 -> blocks.1"]`',
    "choice": 'add `choices = ["...", "..."]` and make `answer` one of them',
    "text": 'write a string: `answer = "..."`',
}


def _answer_fits(kind: str, answer: Any, choices: Any) -> bool:
    if kind == "number":
        return type(answer) in (int, float)
    if kind in LISTS:
        return isinstance(answer, list) and all(isinstance(a, str) for a in answer)
    if kind == "choice":
        ok = isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)
        return ok and answer in choices
    return isinstance(answer, str) and bool(answer.strip())


# -- reading the observed value, and comparing -------------------------------------------------------------------


class NotObserved(LookupError):
    """The claim's value has nothing at the question's ``observe`` path."""


def observed(value: Any, path: str) -> Any:
    """The part of a claim's returned value at the dotted ``path``: keys of mappings (a key may itself contain
    dots, ``eval.1.scale`` reaches ``value["eval"]["1.scale"]``; the longest key that matches wins), indices of
    sequences; ``.`` is the whole value."""
    if path == ".":
        return value
    parts, current, i = path.split("."), value, 0
    while i < len(parts):
        if isinstance(current, dict):
            key = next(
                (".".join(parts[i:j]) for j in range(len(parts), i, -1) if ".".join(parts[i:j]) in current), None
            )
            if key is not None:
                current, i = current[key], i + key.count(".") + 1
                continue
        part = parts[i]
        if (
            isinstance(current, list | tuple)
            and part.lstrip("-").isdigit()
            and -len(current) <= int(part) < len(current)
        ):
            current, i = current[int(part)], i + 1
            continue
        shown = sorted(current) if isinstance(current, dict) else type(current).__name__
        raise NotObserved(f"`{path}`: no `{part}` in {shown}")
    return current


ARROWS = re.compile(r"\s*(?:->|→|⟶|=>|➔|-->)\s*")
NUMBER_WORDS = (  # a typed number may be one of these words; its value is its index
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)  # fmt: skip
# A number may carry its unit; byte prefixes scale it (decimal kB/MB/GB, binary KiB/MiB/GiB).
UNIT_SCALE = {
    "": 1, "b": 1, "byte": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
    "gib": 2**30, "element": 1, "elements": 1, "elems": 1, "params": 1, "parameters": 1, "x": 1, "×": 1,
}  # fmt: skip
NUMBER = re.compile(r"^(?P<value>[+-]?(?:\d[\d,_ ' \u2009\u202f]*)?(?:\.\d+)?(?:e[+-]?\d+)?)\s*(?P<unit>[a-z×_-]*)$")
NONE = ("none", "no", "nothing")  # a count of zero, typed as a word


def normal(text: Any) -> str:
    """A text as answers compare it: case folded, quotes and backticks dropped, runs of white space one space,
    every arrow spelling (``->``, ``→``, ``=>``) one ``->``."""
    folded = str(text).strip().strip("`'\"").casefold()
    return ARROWS.sub(" -> ", " ".join(folded.split())).strip()


def parse_number(text: str, nouns: frozenset[str] = frozenset()) -> float | None:
    """A typed number: digit separators (``206,352``, ``206_352``, ``206 352``), a unit (``206352 bytes``,
    ``201.5 KiB``) or a noun of the question's own (``4 all-gathers`` where it asks how many all-gathers: ``nouns``,
    singular or plural), a small number word (``zero`` … ``twenty``, ``seven all-gathers``), or ``none`` for 0;
    None when it is not a number."""
    cleaned = " ".join(text.strip().casefold().split())
    head, _, noun = cleaned.partition(" ")
    if head in NUMBER_WORDS and (not noun or _is_noun(noun, nouns)):
        return float(NUMBER_WORDS.index(head))
    if cleaned in NONE:
        return 0.0
    found = NUMBER.match(cleaned)
    if found is None or not any(c.isdigit() for c in found["value"]):
        return None
    unit = found["unit"]
    if unit not in UNIT_SCALE and not _is_noun(unit, nouns):
        return None
    digits = re.sub(r"[,_ ' \u2009\u202f]", "", found["value"])
    try:
        return float(digits) * UNIT_SCALE.get(unit, 1)
    except ValueError:
        return None


def _is_noun(word: str, nouns: frozenset[str]) -> bool:
    return word.removesuffix("s") in nouns or word in nouns


def question_nouns(question: PredictQuestion) -> frozenset[str]:
    """The words of a question that may follow a typed number (``all-gathers``, ``units``), each also singular."""
    words = re.findall(r"[a-z][a-z_-]*[a-z]", question.question.casefold())
    return frozenset(words) | frozenset(w.removesuffix("s") for w in words)


def agrees(question: PredictQuestion, value: Any) -> bool:
    """Whether an observed (or a learner's parsed) value is the question's answer."""
    if question.kind == "number":
        try:
            return math.isclose(float(value), float(question.answer), rel_tol=0, abs_tol=question.tolerance)
        except (TypeError, ValueError):
            return False
    if question.kind in LISTS:
        if not isinstance(value, list | tuple):
            return False
        typed, wanted = [normal(v) for v in value], [normal(a) for a in question.answer]
        return typed == wanted if question.kind == "order" else sorted(typed) == sorted(wanted)
    if question.kind == "choice":
        return normal(value) == normal(question.answer)
    return False  # text answers are read, not compared


def item_shape(question: PredictQuestion) -> str:
    """How the answer key's items look, which says how a typed list splits: ``pairs`` (each ``a -> b``),
    ``phrases`` (words with spaces) or ``names`` (one token each: units, shapes, numbers)."""
    items = [normal(a) for a in question.answer]
    if items and all(item.count(" -> ") == 1 for item in items):
        return "pairs"
    return "phrases" if any(" " in item for item in items) else "names"


def split_items(question: PredictQuestion, text: str) -> list[str]:
    """A typed list split as the answer key's items read (`item_shape`): names on commas, semicolons, white space
    or arrows (``root blocks.1``, ``root, blocks.1``, ``root -> blocks.1``); pairs on commas, semicolons or
    white space between pairs (``root->blocks.0 blocks.0 -> blocks.1``); phrases on commas, semicolons or new
    lines only."""
    shape = item_shape(question)
    if shape == "phrases":
        return [item.strip() for item in re.split(r"[,;\n]", text) if item.strip()]
    tight = ARROWS.sub("->", text.strip())  # an arrow binds the two names around it
    if shape == "pairs":
        return [item.replace("->", " -> ") for item in re.split(r"[,;\s]+", tight) if item]
    return [item for item in re.split(r"[,;\s]+|->", tight) if item]


def parse_answer(question: PredictQuestion, text: str) -> Any:
    """A learner's typed answer in the question's shape: a number (see `parse_number`; None when it is not one);
    a list as `split_items` splits it; a choice by its text or its letter (a, b, ...); None for a choice that is
    neither."""
    text = text.strip()
    if question.kind == "number":
        return parse_number(text, question_nouns(question))
    if question.kind in LISTS:
        return split_items(question, text)
    if question.kind == "choice":
        letters = {chr(ord("a") + i): choice for i, choice in enumerate(question.choices)}
        picked = letters.get(text.casefold().rstrip(")."))
        if picked is not None:
            return picked
        return next((choice for choice in question.choices if normal(choice) == normal(text)), None)
    return text


def invalid(question: PredictQuestion, text: str) -> str | None:
    """Why ``text`` is not an answer of the question's kind (to ask again), or None when it is one."""
    if not text.strip():
        return "type an answer"
    if question.kind == "number" and parse_answer(question, text) is None:
        return "a number, such as 3528, 3,528 or 206352 bytes"
    if question.kind == "choice" and parse_answer(question, text) is None:
        letters = ", ".join(chr(ord("a") + i) for i in range(len(question.choices)))
        return f"one of the letters {letters}, or a choice's text"
    phrases = question.kind in LISTS and item_shape(question) == "phrases" and len(question.answer) > 1
    if phrases and len(split_items(question, text)) == 1:
        return "these items have spaces in them: separate them with commas"
    if question.kind in LISTS and item_shape(question) == "pairs":
        loose = [item for item in split_items(question, text) if item.count(" -> ") != 1 or item.startswith(" ")
                 or item.endswith(" ")]  # fmt: skip
        if loose:
            return f"each item is a pair, issuer -> target, not {loose[0].strip()!r}; separate pairs with commas"
    return None


def order_difference(question: PredictQuestion, given: Sequence[str]) -> tuple[list[str], list[str]]:
    """(missing, extra): the guide's items the learner left out, and the learner's items the guide does not have,
    compared as `normal` texts."""
    wanted = [normal(a) for a in question.answer]
    typed = [normal(g) for g in given]
    missing = [a for a, n in zip(question.answer, wanted, strict=True) if n not in typed]
    extra = [g for g, n in zip(given, typed, strict=True) if n not in wanted]
    return missing, extra


register_body_parser("predict", predict_blocks)
