"""Exercises: a guide's break-it patches offered as puzzles (``fsdp-readings exercise GUIDE``).

An exercise names a patch of torch (built from the guide's own recipes, `checks.breakit.patches`), the claim it
makes fail and the `checks.violation.Violation` reason that failure carries. The learner reads the patch, guesses
which claim fails, then the patched check runs and shows its failure. ``tests/break_it/test_exercises.py`` runs
every exercise the same way and asserts the reason, so an exercise is a break-it test with a question on top.

A guide module declares them as ``EXERCISES = (Exercise(...), ...)``; a guide package (a guide whose checks are
several modules, ``checks/guides/gNN_<slug>/``) declares them in its ``recipes`` module, beside the recipes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from checks.ranks.protocol import Patch


@dataclass(frozen=True)
class Exercise:
    id: str
    claim: str  # the claim the patch makes fail
    patches: tuple[Patch, ...]
    puzzle: str  # what the patch does, in the guide's words; the question is always "which claim fails, and why?"
    reason: str  # the Violation reason the failure carries
    overrides: dict[str, Any] = field(default_factory=dict)  # kwargs the claim runs with (rarely needed)


GUIDES_PACKAGE = "checks.guides"


def exercise_modules(check_modules: Iterable[str]) -> list[str]:
    """The modules that declare a guide's ``EXERCISES``, from its claims' check modules: a one-module guide's own
    module; for a guide package (``checks.guides.gNN_<slug>.<subject>``), its ``recipes`` module."""
    found = set()
    for module in check_modules:
        package, _, _subject = module.rpartition(".")
        inside_guide = package.rpartition(".")[0] == GUIDES_PACKAGE
        found.add(f"{package}.recipes" if inside_guide else module)
    return sorted(found)


def exercises_of(check_module: str) -> tuple[Exercise, ...]:
    """The ``EXERCISES`` of a guide's check module (empty when it declares none)."""
    return tuple(getattr(importlib.import_module(check_module), "EXERCISES", ()))
