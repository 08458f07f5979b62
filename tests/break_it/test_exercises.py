"""Every exercise is a break-it test: its patches make its claim fail with its reason, through the same request
path as the claim's item. An exercise that names a claim its guide does not make is an error too."""

from __future__ import annotations

import pytest

from checks.breakit.exercises import Exercise, exercise_modules, exercises_of
from reader.format.guide import Guide
from reader.pytest_plugin.hooks import claim_request
from tests.break_it.conftest import guides


def guide_exercises() -> list[tuple[Guide, Exercise]]:
    found = []
    for guide in guides().values():
        for module in exercise_modules(claim.check.split(":")[0] for claim in guide.claims):
            found += [(guide, exercise) for exercise in exercises_of(module)]
    return found


CASES = guide_exercises()


def test_there_are_exercises_and_their_ids_are_unique() -> None:
    assert len(CASES) >= 5
    keys = [(g.id, e.id) for g, e in CASES]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("guide", "exercise"), CASES, ids=[f"{g.id}::{e.id}" for g, e in CASES])
def test_an_exercise_fails_its_claim_for_its_reason(pool, request, guide: Guide, exercise: Exercise) -> None:
    claim = guide.claim(exercise.claim)
    run = pool.run(claim_request(request.config, guide, claim, patches=exercise.patches, **exercise.overrides))
    assert run.skipped is None, run.skipped
    assert not run.ok, f"{guide.id}::{exercise.id} left {claim.id} passing"
    assert run.reason == exercise.reason, run.failure
