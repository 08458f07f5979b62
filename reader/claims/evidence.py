"""Runtime evidence: which torch code a claim's ranks must trace, and whether any of it ran.

A claim passes only if its check passed *and* at least one of the code objects the guide reads executed on
some rank (or, with ``evidence``, each one the claim names). Otherwise the check proved something, but not about
the code the guide quotes. `reader.claims.request` sends these symbols with the claim; `reader.claims.verdict`
asks `missing_evidence` once the ranks have answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from reader.format.guide import ClaimSpec, Guide

if TYPE_CHECKING:
    from reader.source.anchors import Resolution

NEVER_RAN = "this check never ran the code its guide reads"


def trace_symbol(symbol: str) -> str:
    """The symbol ranks trace for an anchor. A nested function (``outer.<locals>.inner``) is traced through its
    outermost enclosing function: ranks resolve symbols by attribute access, which cannot reach a function
    that exists only while ``outer`` runs; ``outer`` running is the closest evidence they can report."""
    module, _, qualname = symbol.partition(":")
    return f"{module}:{qualname.split('.<locals>.')[0]}"


def trace_symbols(guide: Guide, resolutions: Mapping[str, Resolution]) -> tuple[str, ...]:
    """Symbols of the guide's function/method/class anchors, in guide order, without repeats.

    A narrowed anchor traces its enclosing symbol (code objects are per function, not per statement).
    Module-level assignments have no code object and are left out. Classes are sent as classes; ranks expand
    them to methods.
    """
    seen: dict[str, None] = {}
    for anchor in guide.anchors:
        found = resolutions.get(anchor.name)
        if found is not None and found.traceable:
            seen.setdefault(trace_symbol(anchor.symbol), None)
    return tuple(seen)


def evidence_symbols(claim: ClaimSpec, guide: Guide, resolutions: Mapping[str, Resolution]) -> dict[str, list[str]]:
    """Traced symbol → anchor names whose execution counts as evidence for this claim (``evidence`` narrows
    the set)."""
    wanted = set(claim.evidence) if claim.evidence else {a.name for a in guide.anchors}
    found: dict[str, list[str]] = {}
    for anchor in guide.anchors:
        resolution = resolutions.get(anchor.name)
        if anchor.name in wanted and resolution is not None and resolution.traceable:
            found.setdefault(trace_symbol(anchor.symbol), []).append(anchor.name)
    return found


def missing_evidence(
    claim: ClaimSpec, guide: Guide, resolutions: Mapping[str, Resolution], executed: frozenset[str]
) -> str | None:
    """None when the claim's evidence ran (each named anchor, or without ``evidence`` any anchor of the guide);
    else the failure message."""
    wanted = evidence_symbols(claim, guide, resolutions)
    if not wanted:
        names = ", ".join(claim.evidence or [a.name for a in guide.anchors]) or "(none)"
        return (
            f"{NEVER_RAN}: no traceable anchor to look for. The evidence anchors ({names}) are module-level "
            "assignments or there are none; anchor the function, method or class the claim is about"
        )
    if claim.evidence:
        # Named evidence is a promise about each anchor: every one of them must have run.
        silent = {symbol: names for symbol, names in wanted.items() if symbol not in executed}
        if not silent:
            return None
        heading, fix = "These evidence anchors did not execute on any rank", "remove the anchor from the claim's"
        return _never_ran(silent, executed, heading, fix)
    if executed & wanted.keys():
        return None
    fix = "name the anchors it does exercise in the claim's"
    return _never_ran(wanted, executed, "None of these executed on any rank", fix)


def _never_ran(symbols: Mapping[str, list[str]], executed: frozenset[str], heading: str, fix: str) -> str:
    listed = "\n".join(f"  - {', '.join(names)}: {symbol}" for symbol, names in symbols.items())
    ran = ", ".join(sorted(executed)) if executed else "none of the traced symbols"
    return (
        f"{NEVER_RAN}.\n{heading}:\n{listed}\nExecuted: {ran}.\nMake the check exercise that code, or {fix} `evidence`."
    )
