"""torchrun mode: the ranks are the pytest processes themselves, so a check runs where it is.

``torchrun --nproc-per-node=N -m pytest readings/`` starts N pytest sessions that collect the same items in the same
order; each runs every check on its own rank and the ranks exchange their outcomes, so every rank reports the
whole result. Claims written for another world size are skipped with the reason.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from datetime import timedelta

from checks.ranks.failure import describe
from checks.ranks.protocol import CheckRequest, CheckRun, backend_skip


def launched_by_torchrun() -> bool:
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE"))


class InPlaceRunner:
    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist

        from checks.ranks import backend as backends
        from checks.ranks.context import RankContext

        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.backend = backends.resolve(backend, 1) if backend == "auto" else backend
        device = torch.device("cuda", local_rank) if self.backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            cuda_device = device if device.type == "cuda" else None
            dist.init_process_group(self.backend, timeout=timedelta(minutes=30), device_id=cuda_device)
        self.ctx = RankContext(self.rank, self.world_size, self.backend, device, local_rank, seed=0)

    def run(self, request: CheckRequest, timeout: float) -> CheckRun:
        import torch.distributed as dist

        from checks.ranks.execute import execute

        if request.world_size != self.world_size:
            reason = f"torchrun started {self.world_size} ranks; this check is written for {request.world_size}"
            return CheckRun(request, [], skipped=reason)
        if skip := backend_skip(request, self.backend):
            return CheckRun(request, [], skipped=skip)
        started = time.monotonic()
        # No pool to rescue a hung rank here: dump every thread's stack and exit, and torchrun stops the job.
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
        try:
            mine = execute(request, self.ctx)
            results: list = [None] * self.world_size
            dist.all_gather_object(results, mine)
        finally:
            faulthandler.cancel_dump_traceback_later()
        failure = describe(request, results, self.backend)
        return CheckRun(request, results, failure=failure, duration=time.monotonic() - started)

    def close(self) -> None:
        """The job owns the process group; torchrun tears it down."""
