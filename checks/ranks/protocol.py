"""The messages between the pool (pytest's process) and its rank processes.

Plain dataclasses, pickled over a socketpair. Nothing here imports torch, so a pytest session that only reads
anchors never pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Patch:
    """Replace a torch attribute inside the ranks for one check (how break-it tests sabotage torch).

    ``target`` is ``"module:qualname"``; ``factory`` is ``"module:function"`` and is called rank-side as
    ``factory(original, **params)``; its return value replaces the attribute in every loaded module that holds
    the same object, and the original is restored after the check.
    """

    target: str
    factory: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckRequest:
    """One check to run on ``world_size`` ranks."""

    target: str  # "checks.guides.g04_forward_prefetch:follows_iteration_1_order"
    kwargs: dict[str, Any] = field(default_factory=dict)
    world_size: int = 2
    trace: tuple[str, ...] = ()  # "module:qualname" symbols whose code objects the ranks watch for
    patches: tuple[Patch, ...] = ()
    timeout: float | None = None  # seconds; None takes the manager's default
    seed: int = 0
    # Collect every probe log the check records, with each record's torch source line (checks.ranks.capture):
    # for views of the whole run (``fsdp-readings timeline``); off, probes attribute no lines and cost nothing more.
    capture: bool = False
    # The backends the check is written for (empty: any). A run on another is skipped, with the reason, rather
    # than failed: a claim about gloo's wire bytes says nothing about nccl's.
    backends: tuple[str, ...] = ()


@dataclass
class RankResult:
    """What one rank reported (or what the pool learned about it when it could not report)."""

    rank: int
    ok: bool
    value: Any = None
    error: str | None = None  # formatted traceback, or why the rank gave no answer (for people)
    error_type: str | None = None  # "module.QualName" of the exception the check raised
    message: str | None = None  # str() of that exception
    reason: str | None = None  # a `checks.violation.Violation`'s stable reason: the check's own finding
    details: dict[str, Any] | None = None  # the values that Violation compared (plain data)
    expect_rows: tuple[dict[str, Any], ...] = ()  # that Violation's expect rows ({"block", "line", "key"} each)
    executed: frozenset[str] = frozenset()
    duration: float = 0.0
    signal: str | None = None  # e.g. "SIGSEGV" when the rank died of a signal
    stack: str | None = None  # faulthandler dump: all threads, taken on timeout or fatal error
    log: str = ""  # what the rank wrote to stdout/stderr during this check
    captured: list[Any] = field(default_factory=list)  # the probe logs of a `CheckRequest.capture` run, in order
    recorded: frozenset[str] = frozenset()  # the kinds of probe recording the check finished: "events", "comm"


@dataclass
class CheckRun:
    """The outcome of a `CheckRequest` across all ranks."""

    request: CheckRequest
    results: list[RankResult]
    failure: str | None = None  # readable report; None when every rank passed
    skipped: str | None = None  # why the pool cannot run this check here
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.failure is None and all(r.ok for r in self.results)

    @property
    def failed(self) -> list[RankResult]:
        """The ranks that failed, in rank order."""
        return sorted((r for r in self.results if not r.ok), key=lambda r: r.rank)

    @property
    def reason(self) -> str | None:
        """The reason of the lowest failed rank's `Violation`, or None when no rank failed that way."""
        return next((r.reason for r in self.failed if r.reason is not None), None)

    @property
    def details(self) -> dict[str, Any]:
        """The details of that `Violation` (empty when there is none)."""
        return next((r.details or {} for r in self.failed if r.reason is not None), {})

    @property
    def expect_rows(self) -> tuple[dict[str, Any], ...]:
        """The guide rows that Violation names as now false (`checks.expected.Expected.fail`); empty when none."""
        return next((r.expect_rows for r in self.failed if r.reason is not None), ())

    @property
    def error_types(self) -> set[str]:
        """Exception types the failed ranks raised ("builtins.RuntimeError", ...)."""
        return {r.error_type for r in self.failed if r.error_type is not None}

    @property
    def executed(self) -> frozenset[str]:
        """Trace symbols whose code ran on at least one rank."""
        return frozenset().union(*(r.executed for r in self.results)) if self.results else frozenset()

    def values(self) -> list[Any]:
        """Every rank's return value, in rank order; raises with the report if the check failed."""
        if not self.ok:
            raise CheckFailed(self)
        return [r.value for r in sorted(self.results, key=lambda r: r.rank)]


class CheckFailed(AssertionError):
    def __init__(self, run: CheckRun) -> None:
        super().__init__(run.failure or run.skipped or "check failed")
        self.run = run


# Messages. A rank sends Ready once; then the pool sends Task (answered by an Outcome), Verify (answered by a
# Verified) or Shutdown.
@dataclass(frozen=True)
class Task:
    task_id: int
    request: CheckRequest


@dataclass(frozen=True)
class Verify:
    """Confirm the process group still works after a check (an all-reduce every rank must get right)."""


@dataclass(frozen=True)
class Verified:
    rank: int
    healthy: bool


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    rank: int
    pid: int
    backend: str
    device: str


@dataclass(frozen=True)
class Outcome:
    task_id: int
    result: RankResult


def backend_skip(request: CheckRequest, backend: str) -> str | None:
    """Why ``request`` does not run on ``backend`` (it names others), or None."""
    if not request.backends or backend in request.backends:
        return None
    return f"{request.target} is written for {' or '.join(request.backends)}; this run uses {backend}"
