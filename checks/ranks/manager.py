"""One place that runs checks for a session: keeps a pool per world size, rebuilds broken ones, or runs in place
under torchrun."""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Literal

from checks.ranks import backend as backends
from checks.ranks import zygote as zygotes
from checks.ranks.inplace import InPlaceRunner, launched_by_torchrun
from checks.ranks.pool import RankPool, worker_env
from checks.ranks.protocol import CheckRequest, CheckRun, backend_skip

Mode = Literal["persistent", "fresh", "torchrun"]
MODES: tuple[str, ...] = ("auto", "persistent", "fresh", "torchrun")
DEFAULT_TIMEOUT = 60.0


class PoolManager:
    """Runs `CheckRequest`s.

    - ``persistent``: one `RankPool` per world size, started on first use and reused; rebuilt after a check that
      leaves it broken.
    - ``fresh``: a new pool for every check (for debugging, and the baseline the benchmark compares against).
    - ``torchrun``: this process is one rank of a torchrun job; checks run in place.
    ``auto`` picks torchrun when RANK and WORLD_SIZE are set, else persistent.
    """

    def __init__(
        self,
        backend: str = "auto",
        mode: str = "auto",
        timeout: float = DEFAULT_TIMEOUT,
        default_world_size: int = 2,
        start_timeout: float = 180.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown pool mode {mode!r}; choose one of {', '.join(MODES)}")
        if backend not in backends.BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(backends.BACKENDS)}")
        self.mode: Mode = ("torchrun" if launched_by_torchrun() else "persistent") if mode == "auto" else mode  # type: ignore[assignment]
        self.requested_backend = backend
        self.timeout = timeout
        self.default_world_size = default_world_size
        self.start_timeout = start_timeout
        self.pools_started = 0
        self.spawned_pids: list[int] = []  # every rank process this manager ever started (for leak checks)
        self._pools: dict[int, RankPool] = {}
        self._inplace: InPlaceRunner | None = None
        self._owner_pid = os.getpid()
        self._holding = self.mode != "torchrun"
        if self._holding:
            zygotes.hold()  # a pool rebuilt after a broken check forks from the same zygote
        atexit.register(self.close)

    def backend_for(self, world_size: int) -> str:
        return backends.resolve(self.requested_backend, world_size)

    def run(self, request: CheckRequest) -> CheckRun:
        timeout = request.timeout if request.timeout is not None else self.timeout
        if self.mode == "torchrun":
            if self._inplace is None:
                self._inplace = InPlaceRunner(self.requested_backend)
            return self._inplace.run(request, timeout)
        backend = self.backend_for(request.world_size)
        reason = backend_skip(request, backend) or backends.unavailable(backend, request.world_size)
        if reason:
            return CheckRun(request, [], skipped=reason)
        if self.mode == "fresh":
            pool = self._start(request.world_size, backend)
            try:
                return pool.run(request, timeout)
            finally:
                pool.close()
        pool = self._pools.get(request.world_size)
        if pool is None or pool.broken or pool.closed:
            if pool is not None:
                pool.close()
            pool = self._pools[request.world_size] = self._start(request.world_size, backend)
        run = pool.run(request, timeout)
        if pool.broken:  # the next check of this size gets a fresh pool
            pool.close()
        return run

    def prestart(self) -> None:
        """Start the zygote the ranks will fork from now, so that its imports overlap whatever comes before the
        first check (it is kept while this manager is open)."""
        if self.mode != "torchrun":
            zygotes.release(zygotes.acquire(worker_env(), Path.cwd()))

    def pool(self, world_size: int) -> RankPool | None:
        """The live persistent pool of that size, if any (for tests and diagnostics)."""
        return self._pools.get(world_size)

    def _start(self, world_size: int, backend: str) -> RankPool:
        self.pools_started += 1
        pool = RankPool(world_size, backend, start_timeout=self.start_timeout).start()
        self.spawned_pids.extend(pool.pids)
        return pool

    def close(self) -> None:
        if os.getpid() != self._owner_pid:  # a forked child must not stop its parent's ranks
            return
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._inplace is not None:
            self._inplace.close()
        if self._holding:
            self._holding = False
            zygotes.unhold()
