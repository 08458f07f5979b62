"""What ``fsdp-readings search`` finds in a guide, and the site's search index holds: its id and title, anchors,
claims, notes, predict questions and prose lines, each with the guide line it is on and the command that opens
it. Predict answers and explanations are not items: they stay hidden until asked."""

from __future__ import annotations

from dataclasses import dataclass

from reader.format.guide import Guide, Prose, SourceBlock
from reader.format.predict import PredictQuestion
from reader.source.files import relative_to_cwd


@dataclass(frozen=True)
class Hit:
    kind: str  # guide | prose | claim | note | anchor | question | term
    where: str  # "readings/06-backward-prefetch.md:212", or the glossary
    text: str
    open: str  # the command that shows it


def guide_hits(guide: Guide, words: list[str]) -> list[Hit]:
    path = relative_to_cwd(guide.path)
    show = f"fsdp-readings show {guide.id}"
    found: list[Hit] = []
    if matches(f"{guide.id} {guide.title}", words):
        found.append(Hit("guide", f"{path}:{guide.id_line}", f"{guide.id}: {guide.title}", show))
    for anchor in guide.anchors:
        if matches(f"{anchor.name} {anchor.symbol}", words):
            found.append(Hit("anchor", f"{path}:{anchor.line}", f"{anchor.name} = {anchor.symbol}", show))
    for claim in guide.claims:
        if matches(f"{claim.id} {claim.statement}", words):
            text = f"{claim.id}: {claim.statement}"
            found.append(Hit("claim", f"{path}:{claim.line}", text, f"fsdp-readings check {guide.id} {claim.id}"))
    for block in guide.regions_of(SourceBlock):
        for note in block.notes:
            if matches(note.text, words):
                found.append(Hit("note", f"{path}:{note.line}", note.text, show))
    for question in guide.regions_of(PredictQuestion):
        if matches(question.question, words):
            found.append(
                Hit("question", f"{path}:{question.start}", question.question, f"fsdp-readings predict {guide.id}")
            )
    for prose in guide.regions_of(Prose):
        for offset, line in enumerate(prose.text.split("\n")):
            if matches(line, words):
                found.append(Hit("prose", f"{path}:{prose.start + offset}", line.strip(), show))
    return found


def matches(text: str, words: list[str]) -> bool:
    folded = text.casefold()
    return all(word in folded for word in words)
