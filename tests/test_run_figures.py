"""The run-figure rule, over every guide: a figure that depends on the run (elements that differ, the worst
difference, a timing, what a property's draws held) is stated as the bound its claim asserts, or computed by a
check or a test and compared with the guide's number, so it cannot go stale.

The convention this test enforces. A *run sentence* is a sentence of prose, of a note, of a predict question or
explanation, or a claim statement, that uses a word of measurement (`RUN_WORDS`: measured, differ, differing,
worst, largest, drawn, draws, ulps, "to the last bit", "one run", "4.3 s", a percentage, ...). Every number in a
run sentence must be *backed*: equal to a number the guide hands a check (a claim's kwargs, its world size, its
property's example count and the constants of the module it draws from) or to a number in one of the guide's
expect blocks, which a claim's check, or a test here (`DRAW_STATISTICS`), compares with what ran. References are
not figures and are taken out first: code spans, claim ids, links, file:line citations, issue numbers, guide
numbers, torch versions, step, rank and rule numbers; so are exact constants written as a power (2⁻²³, 2^-7).
Diagrams (fenced blocks) are not sentences.

A guide obeys it by stating a bound (`bound = 1e-6` in the claim, "within 1e-6" in the prose), by giving the
figure to a check (an expect block), or by not stating the figure. An exact figure (a size from the layout model)
in a run sentence is flagged too: the test cannot tell it from a measurement, so the guide says it in a sentence
of its own, or says what checks it. `test_a_planted_stale_figure_is_caught` is the test of this test.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checks.models import flat_param_draws, fsdp2_draws
from checks.ranks.protocol import CheckRequest, CheckRun, RankResult
from reader.claims.properties import run_property
from reader.format.guide import ExpectBlock, Guide, PropertySpec, Prose, SourceBlock
from reader.format.parse import load_guide, looks_like_guide
from reader.format.predict import PredictQuestion
from reader.gate.lock import Lock

READINGS = Path(__file__).resolve().parents[1] / "readings"

# Words that say a figure was observed in a run rather than derived.
RUN_WORDS = re.compile(
    r"\b(?i:measured|measures?|measurements?|measuring|differ|differs|differed|differing|different|differences?|"
    r"worst|largest|drawn|draws|ulps?|last bits?|this (?:cpu|machine)|(?:one|two|each|every|several|other|another) "
    r"runs?|in (?:a|one) run|seconds)\b"
    r"|\b\d+(?:\.\d+)? s\b"  # a timing: "4.3 s"
    r"|\d+(?:\.\d+)? ?%"  # a share of a run: "27%", "within 14%"
)
_SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_SUPER_DIGITS = str.maketrans(_SUPERSCRIPT + "⁻", "0123456789-")
# References and exact constants, removed before numbers are read.
_NOT_FIGURES = [
    re.compile(r"`[^`]*`"),  # code spans
    re.compile(r"\]\([^)]*\)"),  # a link's target (its text stays)
    re.compile(r"\S+\.(?:py|md|toml|lock)(?::\d+(?:[-–]\d+)?)?"),  # files and file:line citations
    re.compile(r"\b[\w./-]*#\d+\b"),  # pytorch#154888, verl#7493, #123
    re.compile(r"\bPEP \d+\b"),  # PEP 440: a document, not a figure
    re.compile(r"\bguides? \d\d(?:(?:, | and | or |[-–])\d\d)*\b", re.IGNORECASE),
    re.compile(r"\b(?:torch |pytorch |python |cp)?\d+\.\d+\.\d+\w*"),  # versions: 2.13.0, 2.14.1
    re.compile(r"\b(?:torch|pytorch|PyTorch|python|Python) ?\d+\.\d+\b"),  # torch 2.13
    re.compile(r"\b(?i:fixed|added|removed|changed|since|before|until) in \d+\.\d+\b"),  # fixed in 2.7
    re.compile(
        r"\b(?:steps?|iterations?|micro-batch(?:es)?|ranks?|seeds?|rules?|phase|chunks?) \d+"
        r"(?:(?:, | to | and | or |[-–])\d+(?![.,]?\d))*",
        re.IGNORECASE,
    ),
    re.compile(r"\*\*[a-z0-9][a-z0-9.-]*\*\*"),  # a claim id in bold, this guide's or another's
    re.compile(r"\b[a-z][a-z0-9]*(?:-[a-z0-9.]+){2,}\b"),  # a bare claim id: within-1e-6-of-ddp-at-4
    re.compile(r"\b[A-Za-z]+-\d+(?:/\d+)*"),  # names with a number: ZeRO-1/2/3, fp32-only
    re.compile(r"(?<![\d.])[A-Za-z]\s?[−+-]\s?\d+"),  # algebra: N−1, i − k + 1 (not 3.0e-8)
    re.compile(r"\b\d+(?:\.\d+)? ?× ?\d+[" + _SUPERSCRIPT + r"⁻]+"),  # 1.3 × 10⁻⁷ is read below, whole
    re.compile(r"\b\d+(?:[⁻" + _SUPERSCRIPT + r"]+|\^-?\d+)"),  # 2⁻²³, 2^-7: exact constants
]
_SCIENTIFIC_TIMES = re.compile(r"\b(\d+(?:\.\d+)?) ?× ?10([⁻" + _SUPERSCRIPT + r"]+)")
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([-+]?\d+))?(?![\w])")
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=[A-Z(*`\"'])|\n\s*\n|\n\s*[-*] ")


@dataclass(frozen=True)
class Sentence:
    guide: str
    line: int  # the line of the region it is in
    where: str  # "prose", "note", "predict", "claim"
    text: str


@dataclass(frozen=True)
class Unbacked:
    sentence: Sentence
    figures: tuple[str, ...]

    def __str__(self) -> str:
        s = self.sentence
        return f"{s.guide}.md:{s.line} ({s.where}): {', '.join(self.figures)} in {s.text!r}"


def _text_units(guide: Guide) -> Iterator[tuple[int, str, str]]:
    """(line, kind, text) of everything a reader reads as prose."""
    for region in guide.regions:
        if isinstance(region, Prose):
            yield region.start, "prose", region.text
        elif isinstance(region, SourceBlock):
            for note in region.notes:
                yield note.line, "note", note.text
        elif isinstance(region, PredictQuestion):
            yield region.start, "predict", f"{region.question}\n\n{region.explain}"
    for claim in guide.claims:
        yield claim.line, "claim", claim.statement


def _without_fences(text: str) -> str:
    """Prose without its fenced blocks (diagrams and examples are not sentences)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def sentences(guide: Guide) -> Iterator[Sentence]:
    for line, kind, raw in _text_units(guide):
        text = _without_fences(raw)
        at = 0
        for part in _SENTENCE_END.split(text):
            if part and part.strip():
                at = text.find(part, at)
                yield Sentence(guide.id, line + text.count("\n", 0, at), kind, " ".join(part.split()))


def _strip_references(text: str, claim_ids: set[str]) -> str:
    for claim_id in sorted(claim_ids, key=len, reverse=True):
        text = text.replace(claim_id, " ")
    text = re.sub(r"\*\*-at-\d\*\*", " ", text)  # "**x** and **-at-4**"
    for pattern in _NOT_FIGURES[:-2]:
        text = pattern.sub(" ", text)
    return text


def figures(text: str, claim_ids: set[str]) -> list[tuple[str, float]]:
    """The numbers of a sentence that could be figures, as written and as values."""
    text = _strip_references(text, claim_ids)
    found: list[tuple[str, float]] = []
    for match in _SCIENTIFIC_TIMES.finditer(text):
        found.append((match.group(0), float(f"{match.group(1)}e{match.group(2).translate(_SUPER_DIGITS)}")))
    for pattern in _NOT_FIGURES[-2:]:
        text = pattern.sub(" ", text)
    for match in _NUMBER.finditer(text):
        whole, fraction, exponent = match.groups()
        value = float(whole.replace(",", "") + (fraction or "") + (f"e{exponent}" if exponent else ""))
        found.append((match.group(0), value))
    return found


def _numbers_in(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, str):
        yield from (v for _, v in figures(value, set()))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _numbers_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _numbers_in(item)


def backing(guide: Guide) -> set[float]:
    """The numbers a check compares with a run: claims' kwargs (expect blocks resolved), example counts, world
    sizes, and every expect block."""
    found: set[float] = set()
    for claim in guide.claims:
        for release in RELEASES:  # an expect block may be written once per torch range: each release's
            if claim.applies_to(release):
                found.update(_numbers_in(guide.on(release).claim_kwargs(claim)))
        found.add(float(claim.world_size))
        if claim.property is not None:
            found.add(float(claim.property.examples))
            found.update(_draw_constants(claim.property))
    for block in guide.regions_of(ExpectBlock):
        found.update(_numbers_in(list(block.items)))
    return found


def _draw_constants(prop: PropertySpec) -> Iterator[float]:
    """The int constants of the module a property draws from (``MAX_NUMEL = 4099``): what its draws are made of."""
    module = importlib.import_module(prop.draw.partition(":")[0])
    for name, value in vars(module).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            yield float(value)


def _backed(value: float, backed: set[float]) -> bool:
    return any(math.isclose(value, b, rel_tol=1e-9, abs_tol=0.0) for b in backed)


def unbacked(guide: Guide) -> list[Unbacked]:
    claim_ids = {claim.id for claim in guide.claims}
    backed = backing(guide)
    found = []
    for sentence in sentences(guide):
        if not RUN_WORDS.search(_strip_references(sentence.text, claim_ids)):
            continue
        loose = tuple(shown for shown, value in figures(sentence.text, claim_ids) if not _backed(value, backed))
        if loose:
            found.append(Unbacked(sentence, loose))
    return found


# The releases the lock approves the guides on: a claim's kwargs are resolved on each release it holds for.
RELEASES = Lock.load(READINGS / "anchors.lock").matrix or ("2.13.0",)


def _guides() -> list[Guide]:
    """Every guide as written: `backing` reads it on each release of the matrix, where an expect block written per
    release (guides 17, 21) has one version, as a claim's run receives it."""
    return [load_guide(path) for path in sorted(READINGS.glob("*.md")) if looks_like_guide(path)]


GUIDES = {guide.id: guide for guide in _guides()}


@pytest.mark.parametrize("guide_id", sorted(GUIDES))
def test_every_run_figure_is_backed(guide_id: str) -> None:
    loose = unbacked(GUIDES[guide_id])
    assert not loose, "figures of a run that no check compares:\n" + "\n".join(str(u) for u in loose)


# --- what a property's draws hold -----------------------------------------------------------------------------


def drawn(prop: PropertySpec) -> list[Any]:
    """The examples a property claim's run draws, in order: its own settings (`run_property`), every example
    passing, as when the claim holds. Derandomized, so the same examples every time."""
    examples: list[Any] = []

    def send(request: CheckRequest) -> CheckRun:
        examples.append(request.kwargs["example"])
        return CheckRun(request, [RankResult(rank=0, ok=True)])

    run_property(prop, CheckRequest("tests.test_run_figures:drawn"), send)
    return examples


def _flat_param_statistics(ranks: int) -> Callable[[dict[str, Any]], bool]:
    def undivided(unit: dict[str, Any]) -> bool:
        return flat_param_draws.spec_of(unit, ranks).params_end % ranks != 0

    return undivided


def _fsdp2_rows(test: Callable[[int, int], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda model: any(test(shape[0], shape_numel(shape)) for _, shape, _ in fsdp2_draws.params_of(model))


def shape_numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@dataclass(frozen=True)
class DrawStatistics:
    """A guide's expect block of counts over a property's draws: ``<count> <what>`` per item, the first
    ``<n> draws``; each ``what`` is one of ``counts``."""

    block: str
    draw: str
    counts: Mapping[str, Callable[[Any], bool]]


DRAW_STATISTICS = {
    "12-flat-parameter": DrawStatistics(
        "draw-statistics",
        "checks.models.flat_param_draws:units",
        {
            "use the original parameters": lambda u: u["use_orig_params"],
            "compute in bf16": lambda u: u["param_dtype"] == "bfloat16",
            "tie a weight": lambda u: any(m["kind"] == "tied" for m in u["modules"]),
            "freeze something": lambda u: any(not p.requires_grad for p in flat_param_draws.params_of(u)),
            "have a zero-size parameter": lambda u: any(p.numel == 0 for p in flat_param_draws.params_of(u)),
            "have a fifth child, the trainable bare parameter added": lambda u: len(u["modules"]) == 5,
            "at two ranks need padding to a multiple of 2": (_flat_param_statistics(2)),
            "at four ranks need padding to a multiple of 4": (_flat_param_statistics(4)),
        },
    ),
    "16-fsdp2-per-parameter-sharding": DrawStatistics(
        "draw-statistics",
        "checks.models.fsdp2_draws:models",
        {
            "have a child": lambda m: m["child"] is not None,
            "have a bf16 group": lambda m: any(dtype == "bfloat16" for *_, dtype in fsdp2_draws.params_of(m)),
            "have a parameter whose dim 0 is zero": _fsdp2_rows(lambda rows, numel: rows == 0),
            "have a parameter with rows but no elements": _fsdp2_rows(lambda rows, numel: rows > 0 and numel == 0),
            "at two ranks have a parameter with fewer rows than ranks": _fsdp2_rows(lambda rows, numel: rows < 2),
            "at four ranks have a parameter with fewer rows than ranks": _fsdp2_rows(lambda rows, numel: rows < 4),
            "at two ranks have a parameter whose dim 0 the world size does not divide": (
                _fsdp2_rows(lambda rows, numel: rows % 2 != 0)
            ),
            "at four ranks have a parameter whose dim 0 the world size does not divide": (
                _fsdp2_rows(lambda rows, numel: rows % 4 != 0)
            ),
        },
    ),
}
_COUNT = re.compile(r"^(\d+) (.+)$")


def counted(statistics: DrawStatistics, items: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """(what the block says, what the draws hold), by item."""
    stated = {}
    for item in items:
        match = _COUNT.match(item)
        assert match is not None, f"{item!r} is not '<count> <what>'"
        stated[match.group(2)] = int(match.group(1))
    assert "draws" in stated, "the block's first item says how many draws: '<n> draws'"
    unknown = set(stated) - set(statistics.counts) - {"draws"}
    assert not unknown, f"no way to count {sorted(unknown)}; known: {sorted(statistics.counts)}"
    examples = drawn(PropertySpec(statistics.draw, stated["draws"]))
    found = {"draws": len(examples)}
    found |= {what: sum(1 for e in examples if holds(e)) for what, holds in statistics.counts.items() if what in stated}
    return stated, found


@pytest.mark.parametrize("guide_id", sorted(DRAW_STATISTICS))
def test_the_draw_statistics_a_guide_states_are_what_its_draws_hold(guide_id: str) -> None:
    statistics = DRAW_STATISTICS[guide_id]
    block = GUIDES[guide_id].expect_blocks()[statistics.block]
    stated, found = counted(statistics, block.items)
    assert stated == found


# --- the test of the test -----------------------------------------------------------------------------------

PLANTED = """+++
id = "99-planted"
title = "A guide with stale figures"
order = 99
torch = ">=2.13"

[[anchors]]
name = "prefetch"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"

[[claims]]
id = "within-1e-6-at-4"
statement = "Parameters stay within 1e-6 of DDP's."
check = "checks.ranks.selftest:trivial"
kwargs = { bound = 1e-6 }
world_size = 4
+++
# Planted

The claim allows 1e-6 (**within-1e-6-at-4**, guide 09, pytorch#154888, torch 2.13.0, step 5).

PLANTED_SENTENCE
"""
STALE = [
    "Measured on this CPU: 14,157 of 51,588 gradient elements differ, by at most 3.0e-8.",
    "The largest parameter difference is 6.0e-7 after five steps.",
    "In 200 draws, 33 tie a weight.",
    "The losses are equal to the last bit, 4.8e-7 apart.",
    "Measured here: 4.3 s for the 12 units.",
    "About 27% of the elements come out differing.",
    "The worst element is 1.3 × 10⁻⁷ of the largest gradient.",
]


def _planted(sentence: str) -> Guide:
    from reader.format.parse import parse_guide

    return parse_guide(PLANTED.replace("PLANTED_SENTENCE", sentence), READINGS / "99-planted.md")


@pytest.mark.parametrize("sentence", STALE)
def test_a_planted_stale_figure_is_caught(sentence: str) -> None:
    loose = unbacked(_planted(sentence))
    assert len(loose) == 1 and loose[0].sentence.text == sentence, loose


@pytest.mark.parametrize(
    "sentence",
    [
        "The claim allows 1e-6 of DDP's parameters; the runs so far stayed below it.",  # the claim's own bound
        "The flat parameter holds 3,528 elements.",  # an exact figure, no word of measurement
        "Step 5 is the last (**within-1e-6-at-4**), guide 09 measured it, pytorch#154888.",  # references only
    ],
)
def test_a_backed_figure_or_a_reference_is_not(sentence: str) -> None:
    assert unbacked(_planted(sentence)) == []


def test_a_draw_statistic_that_drifted_is_caught() -> None:
    statistics = DRAW_STATISTICS["12-flat-parameter"]
    block = GUIDES["12-flat-parameter"].expect_blocks()[statistics.block]
    stale = tuple(item.replace("21 tie", "33 tie") for item in block.items)  # the figure the guide once had
    stated, found = counted(statistics, stale)
    assert stated["tie a weight"] == 33 and found["tie a weight"] != 33
