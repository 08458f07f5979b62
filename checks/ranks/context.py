"""What a check function receives on its rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from checks.violation import Violation


@dataclass(frozen=True)
class RankContext:
    """One rank's view of the process group a check runs on.

    ``device`` is ``cpu`` under gloo and ``cuda:<local_rank>`` under nccl; build models and pass
    ``device_id=ctx.device`` to FSDP so the same check runs on both.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    local_rank: int
    seed: int

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (an object all-gather on the world group)."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def assert_same_on_all_ranks(self, value: Any, what: str) -> None:
        """Fail on every rank, naming the ranks that differ, unless ``value`` is equal everywhere."""
        values = self.gather(value)
        differing = [r for r, v in enumerate(values) if v != values[0]]
        if differing:
            lines = "\n".join(f"  rank {r}: {v!r}" for r, v in enumerate(values))
            raise Violation(
                "differs-between-ranks",
                f"{what} differs between ranks (rank 0 vs {differing}):\n{lines}",
                what=what,
                differing=differing,
            )

    def agreed(self, fn: Any, *args: Any) -> Any:
        """Run the rank-local ``fn``, then let every rank know whether any rank found a `Violation`: if one did,
        every rank raises the first failing rank's, so no rank walks on alone into a collective (an all-gather in
        ``summon_full_params``) that the failed ranks never reach, and hangs there until the pool's timeout."""
        try:
            value, found = fn(*args), None
        except Violation as violation:
            value, found = None, (violation.reason, str(violation), violation.details, violation.expect_rows)
        failed = [(rank, v) for rank, v in enumerate(self.gather(found)) if v is not None]
        if failed:
            rank, (reason, message, details, rows) = failed[0]
            raise Violation(reason, f"rank {rank}: {message}", expect_rows=rows, failed_rank=rank, **details)
        return value
