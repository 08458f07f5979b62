"""The words of a claim's failure: where it is, what it says, the check it ran, and why it did not pass.

One place for them, so that ``pytest readings/``, ``fsdp-readings check`` and the drift report say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping

from reader.format.guide import ClaimSpec, Guide
from reader.source.anchors import AnchorError


def claim_header(where: str, claim: ClaimSpec, verb: str) -> str:
    """The first lines of every claim failure: where, what the claim says, and the check it ran."""
    kwargs = ", ".join(f"{k}={v!r}" for k, v in claim.kwargs.items())
    return (
        f"{where}: claim `{claim.id}` {verb}\n"
        f"  statement: {claim.statement}\n"
        f"  check:     {claim.check}({kwargs}) on {claim.world_size} rank(s)"
    )


def blocked_claim(
    where: str, display_path: str, guide: Guide, claim: ClaimSpec, failed: Mapping[str, AnchorError]
) -> str:
    """A claim that cannot run because some of its guide's anchors do not resolve: which, and why."""
    lines = [claim_header(where, claim, "cannot run: the guide's anchors do not resolve in this torch")]
    for name, error in failed.items():
        lines.append(f"  {unresolved_anchor(display_path, guide, name, error)}")
        lines += [f"    hint: {hint}" for hint in error.hints]
    return "\n".join(lines)


def unresolved_anchor(display_path: str, guide: Guide, name: str, error: AnchorError) -> str:
    """One anchor that does not resolve, in a line: its name, where the guide declares it, and why."""
    return f"anchor `{name}` ({display_path}:{guide.anchor(name).line}) {error.kind}: {error.message}"
