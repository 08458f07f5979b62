"""Turn the ranks' outcomes of a failed check into one readable report."""

from __future__ import annotations

from checks.protocol import CheckRequest, RankResult

_LOG_TAIL = 4000  # characters of a rank's own output worth showing under its traceback


def describe(request: CheckRequest, results: list[RankResult], backend: str) -> str | None:
    """None when every rank passed; else a report whose first line says which ranks failed and how."""
    failed = [r for r in sorted(results, key=lambda r: r.rank) if not r.ok]
    if not failed:
        return None
    ranks = ", ".join(str(r.rank) for r in failed)
    lines = [
        f"{request.target} failed on rank{'s' if len(failed) > 1 else ''} {ranks} "
        f"(world size {request.world_size}, {backend})"
    ]
    for result in failed:
        cause = f"died of {result.signal}" if result.signal else _first_line(result.error)
        lines.append(f"── rank {result.rank}: {cause} " + "─" * 20)
        if result.error:
            lines.append(result.error.rstrip())
        if result.stack:
            lines.append(f"   Python stacks of rank {result.rank} (faulthandler, all threads):")
            lines.append(result.stack.rstrip())
        if result.log.strip():
            lines.append(f"   output of rank {result.rank}:")
            lines.append(result.log[-_LOG_TAIL:].rstrip())
    return "\n".join(lines)


def _first_line(error: str | None) -> str:
    if not error:
        return "failed"
    last = [line for line in error.strip().splitlines() if line.strip()]
    return last[-1].strip() if last else "failed"
