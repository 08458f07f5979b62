"""Break-it tests: run a guide's claim with torch bent on purpose and show the claim's check then fails.

A claim that still passes with the behaviour it asserts removed proves nothing. Every test here is marked
``@pytest.mark.breaks(guide_id, claim_id)``; `test_coverage.py` fails if a claim of any guide has no such test.
The claim runs through the same request path as its pytest item (`reader.pytest_plugin.hooks.claim_request`), and a test
asserts *why* it failed on the structured result (``run.reason``, ``run.details``, ``run.error_types``), not on
rendered text.

For a claim with ``xfail`` (a known torch bug, its check failing for one reason today), breaking it means the
opposite: a patch that removes the bug, or fails the check for another reason, and the item then fails (an
unexpected pass of a strict xfail, or the wrong failure). The fixture asserts that, and the test asserts which.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checks.expected import Expected, Row
from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRun, Patch
from reader.claims.properties import run_claim
from reader.claims.verdict import fails_as_expected
from reader.format.expect_rows import parse_row
from reader.format.guide import Guide
from reader.format.parse import load_guide, looks_like_guide
from reader.pytest_plugin.hooks import claim_request

READINGS = Path(__file__).resolve().parents[2] / "readings"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "breaks(guide_id, claim_id): the claim this break-it test must make fail")


@functools.cache
def guides() -> dict[str, Guide]:
    """Every guide as read on the installed torch, the one the break-it runs bend: an expect block written once
    per torch range resolves to this release's (read on no torch in particular, two would both apply)."""
    import torch

    found = (load_guide(path).on(torch.__version__) for path in sorted(READINGS.glob("*.md")) if looks_like_guide(path))
    return {guide.id: guide for guide in found}


BreakRunner = Callable[..., CheckRun]


def expect_block(guide_id: str, name: str) -> Expected:
    """The guide's expect block ``name`` as its checks receive it on the installed torch."""
    guide = guides()[guide_id]
    block = guide.expect_blocks(guide.read_on)[name].expected
    assert block is not None, f"{guide_id}: expect block `{name}` did not parse"
    return block


def restated(guide_id: str, name: str, rows: Mapping[str, str]) -> Expected:
    """Block ``name`` with each row keyed in ``rows`` stating something else, each keeping its line: what follows
    the key (a mapping row's value, a pairs row's target, a table row's other cells two spaces apart), or a lines
    row's whole text; read by the guide parser's own row grammar, so the row is one a guide could hold."""
    block = expect_block(guide_id, name)
    joins = {"mapping": "{}: {}", "pairs": "{} → {}", "table": "{}  {}"}

    def said(row: Row) -> Row:
        if row.key not in rows:
            return row
        text = rows[row.key] if block.shape == "lines" else joins[block.shape].format(row.key, rows[row.key])
        return parse_row(block.shape, row.line, text, block.header)

    return replace(block, rows=tuple(said(row) for row in block))


def named_rows(run: CheckRun) -> list[tuple[str, str]]:
    """(expect block, row key) of each guide row the failed check recorded as now false
    (`checks.expected.Expected.fail`): what the gate's report points a reviewer at."""
    return [(row["block"], row["key"]) for row in run.expect_rows]


@pytest.fixture
def broken(pool: PoolManager, request: pytest.FixtureRequest) -> BreakRunner:
    """``broken(*patches, **kwarg_overrides)`` runs the claim named by the test's ``breaks`` marker with the
    patches applied, asserts its item would fail, and returns the run so the test can check *why*: the check
    failed (``run.reason``); for an xfail claim, it passed or failed for another reason than ``fails_with``."""
    marker = request.node.get_closest_marker("breaks")
    assert marker is not None, "a break-it test needs @pytest.mark.breaks(guide_id, claim_id)"
    guide_id, claim_id = marker.args
    guide = guides()[guide_id]
    claim = guide.claim(claim_id)

    def run(*patches: Patch, **overrides: Any) -> CheckRun:
        # A property claim runs over its drawn examples; the run returned is the shrunk falsifying example's
        # (its example in ``run.request.kwargs["example"]``).
        outcome = run_claim(
            claim, claim_request(request.config, guide, claim, patches=patches, **overrides), pool.run
        ).outcome
        assert outcome.skipped is None, outcome.skipped
        if claim.xfail is not None:
            expected = claim.xfail.fails_with
            assert not fails_as_expected(claim.xfail, outcome), (
                f"{guide_id}::{claim_id} still fails as its xfail expects (`{expected}`) with {patches} {overrides}"
            )
        else:
            assert not outcome.ok, f"{guide_id}::{claim_id} still passed with torch broken by {patches}"
        return outcome

    return run
