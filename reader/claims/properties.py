"""Property claims: hypothesis draws in the pytest process, and each drawn example is one request to the ranks.

Drawing here, not in the ranks, keeps every rank on the same example. Were hypothesis to run inside each rank, a
failure seen on one rank only would make the ranks shrink differently, build different modules and hang in
mismatched collectives. The settings are fixed so a run is reproducible in CI: derandomized, no example database
(nothing is written into the repository), no deadline (an example costs a pool round trip), and one bug reported.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pprint
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.format.guide import ClaimSpec, PropertySpec

if TYPE_CHECKING:
    from reader.claims.request import Send


@dataclass(frozen=True)
class ClaimRun:
    """What running a claim found: the run its verdict is judged on, and for a property claim, the example."""

    outcome: CheckRun  # a property's shrunk falsifying example's run, or its passing runs merged
    example: Any = None  # the shrunk falsifying example; None for a plain claim or a property that held
    examples_run: int = 1

    def falsifying(self) -> str:
        """The report line for a falsified property: the shrunk example, as the check received it."""
        shown = pprint.pformat(self.example, width=100, sort_dicts=False)
        return f"  falsifying example (shrunk; {self.examples_run} runs in all): example =\n{_indent(shown)}"


class _Falsified(Exception):  # an Exception: hypothesis shrinks it
    def __init__(self, run: CheckRun) -> None:
        super().__init__(run.reason or run.failure)
        self.run = run


class _Skipped(BaseException):  # not an Exception: hypothesis lets it through at once, without shrinking
    def __init__(self, run: CheckRun) -> None:
        super().__init__(run.skipped)
        self.run = run


def run_claim(claim: ClaimSpec, request: CheckRequest, send: Send) -> ClaimRun:
    """Run ``claim`` once, or, for a property claim, over its drawn examples."""
    if claim.property is None:
        return ClaimRun(send(request))
    return run_property(claim.property, request, send)


def strategy_of(prop: PropertySpec) -> Any:
    module, _, name = prop.draw.partition(":")
    return getattr(importlib.import_module(module), name)()


HYPOTHESIS_HOME = Path(tempfile.gettempdir()) / "fsdp-readings-hypothesis"


def run_property(prop: PropertySpec, request: CheckRequest, send: Send) -> ClaimRun:
    """Draw up to ``prop.examples`` examples; stop at the first that fails and shrink it."""
    from hypothesis import HealthCheck, Verbosity, given, settings
    from hypothesis.configuration import set_hypothesis_home_dir

    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        set_hypothesis_home_dir(HYPOTHESIS_HOME)  # its caches, never in the working directory (the repository)

    runs: list[CheckRun] = []

    @settings(
        max_examples=prop.examples,
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy_of(prop))
    def holds(example: Any) -> None:
        run = send(dataclasses.replace(request, kwargs={**request.kwargs, "example": example}))
        runs.append(run)
        if run.skipped:
            raise _Skipped(run)
        if not run.ok:
            raise _Falsified(run)

    try:
        holds()
    except _Skipped as skipped:
        return ClaimRun(skipped.run, None, len(runs))
    except _Falsified as falsified:
        return ClaimRun(falsified.run, falsified.run.request.kwargs["example"], len(runs))
    return ClaimRun(_merged(runs), None, len(runs))


def _merged(runs: list[CheckRun]) -> CheckRun:
    """The last passing run, with every rank's executed symbols the union over all examples: runtime evidence
    asks whether the code ran in the property's runs, not in one example's."""
    last = runs[-1]
    by_rank: dict[int, frozenset[str]] = {}
    for run in runs:
        for result in run.results:
            by_rank[result.rank] = by_rank.get(result.rank, frozenset()) | result.executed
    results = [dataclasses.replace(r, executed=by_rank.get(r.rank, r.executed)) for r in last.results]
    return dataclasses.replace(last, results=results)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
