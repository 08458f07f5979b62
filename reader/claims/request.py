"""How a claim becomes the `CheckRequest` its ranks run.

`traced_request` is the one place a claim becomes a request (claim items, the study commands and break-it tests
all go through it): the check and its kwargs (``{ expect = "<block>" }`` replaced by that block's items), its
world size, timeout and backends, the torch symbols its ranks trace for runtime evidence
(`reader.claims.evidence`), and any break-it patches. The protocol module is plain dataclasses: importing it
imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from checks.ranks.protocol import CheckRequest, CheckRun, Patch
from reader.claims.evidence import trace_symbols
from reader.format.guide import ClaimSpec, Guide
from reader.source.anchors import PATTERN_LOST, AnchorError, Resolution, Resolver

Send = Callable[[CheckRequest], CheckRun]  # hands one request to the ranks and returns their run


class Resolving(Protocol):
    """What a claim needs of the gate's `Workspace` (which the gate builds over this room): the torch it reads,
    and the guide's anchors resolved in that torch's source."""

    @property
    def torch_version(self) -> str | None: ...

    @property
    def resolver(self) -> Resolver: ...

    def resolutions(self, guide: Guide) -> tuple[dict[str, Resolution], dict[str, AnchorError]]: ...


class RankPoolUnavailable(RuntimeError):
    """The ranks cannot be reached at all (the rank pool cannot even be imported): the claim did not run."""


class UnresolvedAnchors(RuntimeError):
    """The guide's anchors do not all resolve in this torch, so there is nothing to trace a claim against."""

    def __init__(self, guide: Guide, failed: dict[str, AnchorError]) -> None:
        super().__init__(f"{guide.id}: anchors {sorted(failed)} do not resolve in this torch")
        self.failed = failed


def request_for(
    guide: Guide, claim: ClaimSpec, *, trace: tuple[str, ...] = (), patches: tuple[Patch, ...] = (), **overrides: Any
) -> CheckRequest:
    """The request that runs ``claim``'s check: its kwargs with expect blocks resolved (``overrides`` win), its
    world size and timeout, the torch symbols to trace for runtime evidence, and any break-it patches."""
    return CheckRequest(
        target=claim.check,
        kwargs={**guide.claim_kwargs(claim), **overrides},
        world_size=claim.world_size,
        trace=trace,
        patches=patches,
        timeout=claim.timeout,
        backends=claim.backends,
    )


def traced_request(
    workspace: Resolving, guide: Guide, claim: ClaimSpec, *, patches: tuple[Patch, ...] = (), **overrides: Any
) -> tuple[CheckRequest, dict[str, Resolution]]:
    """The request that runs ``claim`` with the guide's traceable anchors as its trace symbols, and the anchors'
    resolutions (to judge the evidence afterwards). Raises `UnresolvedAnchors` when an anchor the claim needs does
    not resolve."""
    resolutions, failed = workspace.resolutions(guide)
    for name, error in list(failed.items()):
        # A narrowing pattern (or a note) that no longer lands fails the anchor's own item, but its symbol still
        # resolves: trace that, so the claims still re-prove the behaviour on this torch.
        anchor = guide.anchor(name)
        if error.kind == PATTERN_LOST and anchor.pattern is not None:
            try:
                resolutions[name] = workspace.resolver.resolve(anchor.symbol, None)
            except AnchorError:
                continue
            del failed[name]
    # A removed symbol blocks the claims that name it as evidence (and, without named evidence, those whose guide
    # has nothing else to trace); the other claims run, traced on the anchors that resolve.
    named = set(claim.evidence)
    blocking = {n: e for n, e in failed.items() if n in named} if named else ({} if resolutions else failed)
    if blocking:
        raise UnresolvedAnchors(guide, blocking)
    trace = trace_symbols(guide, resolutions)
    return request_for(guide, claim, trace=trace, patches=patches, **overrides), resolutions
