"""Turn the ranks' outcomes of a failed check into one readable report."""

from __future__ import annotations

import re

from checks.ranks.protocol import CheckRequest, RankResult

_LOG_TAIL = 4000  # characters of a rank's own output worth showing under its traceback
# torch.profiler (used by the collective recorder's cross-check) writes a line per profile start and stop; they
# say nothing about a failure.
_PROFILER_CHATTER = re.compile(r"^(USDT|STAGE|INFO|WARNING):\d{4}-\d\d-\d\d .*\.cpp:\d+\] .*$", re.MULTILINE)


def describe(request: CheckRequest, results: list[RankResult], backend: str) -> str | None:
    """None when every rank passed; else a report whose first line says which ranks failed and how. Ranks that
    failed with the same error are reported together, with one traceback."""
    failed = [r for r in sorted(results, key=lambda r: r.rank) if not r.ok]
    if not failed:
        return None
    ranks = ", ".join(str(r.rank) for r in failed)
    lines = [
        f"{request.target} failed on rank{'s' if len(failed) > 1 else ''} {ranks} "
        f"(world size {request.world_size}, {backend})"
    ]
    groups: dict[tuple[str | None, str | None], list[RankResult]] = {}
    for result in failed:
        groups.setdefault((result.error, result.signal), []).append(result)
    for (error, signal), members in groups.items():
        first = members[0]
        who = f"rank {first.rank}" if len(members) == 1 else "ranks " + ", ".join(str(r.rank) for r in members)
        cause = f"died of {signal}" if signal else _last_line(error)
        lines.append(f"── {who}: {cause} " + "─" * 20)
        if error:
            lines.append(error.rstrip())
        for result in members:
            if result.stack:
                lines.append(f"   Python stacks of rank {result.rank} (faulthandler, all threads):")
                lines.append(result.stack.rstrip())
            log = _PROFILER_CHATTER.sub("", result.log).strip()
            if log:
                lines.append(f"   output of rank {result.rank}:")
                lines.append(log[-_LOG_TAIL:])
    return "\n".join(lines)


def _last_line(error: str | None) -> str:
    if not error:
        return "failed"
    last = [line for line in error.strip().splitlines() if line.strip()]
    return last[-1].strip() if last else "failed"
