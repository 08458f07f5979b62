"""The rank pool: N long-lived rank processes with an initialised process group, reused for every check.

PyTorch's own FSDP tests spawn fresh processes per test (seconds each). Here the ranks start once per world size
and per session; a check costs a message round trip. When a check leaves the group in doubt (a timeout, a dead
rank, a rank that never answered, a failed health check) the pool is torn down and the next check gets a new one.

Processes: each rank is forked from a zygote that imported torch once for the session (`checks.ranks.zygote`), in
its own session, tied to the zygote (which is tied to this process) by ``PR_SET_PDEATHSIG`` and to its pool by a
socketpair. Without a zygote (one that cannot start), a rank is ``python -m checks.ranks.worker``, tied to this
process directly. Ranks rendezvous through a FileStore in a private temporary
directory, and gloo listens on ephemeral ports, so two sessions on one machine never collide on a port.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Protocol

from checks.ranks import zygote as zygotes
from checks.ranks.failure import describe
from checks.ranks.protocol import CheckRequest, CheckRun, Outcome, RankResult, Ready, Shutdown, Task, Verified, Verify
from checks.ranks.worker import STACK_SIGNAL

GRACE_AFTER_FAILURE = 5.0  # seconds the other ranks get to finish once one rank failed or died
VERIFY_TIMEOUT = 20.0
STACK_WAIT = 3.0  # seconds to wait for faulthandler's dumps after asking for them
_LOG_LIMIT = 200_000


class PoolStartError(RuntimeError):
    """The ranks could not form a process group; the message holds each rank's output."""


class RankProcess(Protocol):
    """A rank's process as the pool handles it: a ``Popen``, or a `checks.ranks.zygote.ForkedRank`."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class _Rank:
    rank: int
    proc: RankProcess
    conn: Connection
    pidfd: int
    log: Path
    faults: Path

    def offsets(self) -> tuple[int, int]:
        return _size(self.log), _size(self.faults)

    def read_since(self, offsets: tuple[int, int]) -> tuple[str, str]:
        return _read_from(self.log, offsets[0]), _read_from(self.faults, offsets[1])

    def exit_signal(self) -> str | None:
        code = self.proc.poll()
        if code is None or code >= 0:
            return None
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"

    def exit_description(self) -> str:
        sig = self.exit_signal()
        return f"rank {self.rank} died of {sig}" if sig else f"rank {self.rank} exited with code {self.proc.poll()}"


class RankPool:
    """``world_size`` rank processes on one machine, sharing a process group."""

    def __init__(self, world_size: int, backend: str, *, start_timeout: float = 180.0) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.start_timeout = start_timeout
        self.broken = False
        self.closed = False
        self.pids: list[int] = []
        self.checks_run = 0
        self._ranks: list[_Rank] = []
        self._task_ids = itertools.count()
        self._zygote: zygotes.Zygote | None = None
        _sweep_orphaned_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))

    # -- life cycle ---------------------------------------------------------------------------------------------
    def start(self) -> RankPool:
        store = self._workdir / "store"
        env = worker_env()
        try:
            self._zygote = zygotes.acquire(env, Path.cwd())
        except OSError:
            self._zygote = None  # no zygote: each rank imports torch itself
        try:
            for rank in range(self.world_size):
                self._ranks.append(self._spawn(rank, store, env))
            self._await_ready()
        except BaseException:
            self.close(force=True)
            raise
        self.pids = [r.proc.pid for r in self._ranks]
        return self

    def _spawn(self, rank: int, store: Path, env: dict[str, str]) -> _Rank:
        ours, theirs = socket.socketpair()
        log = self._workdir / f"rank{rank}.log"
        faults = self._workdir / f"rank{rank}.faults"
        argv = [
            f"--rank={rank}", f"--world-size={self.world_size}", f"--backend={self.backend}", f"--store={store}",
            f"--faults={faults}",
        ]  # fmt: skip
        with log.open("ab") as log_file, theirs:
            proc, pidfd = self._forked(argv, env, log_file.fileno(), theirs.fileno())
            if proc is None:
                proc = subprocess.Popen(
                    [
                        sys.executable, "-m", "checks.ranks.worker", *argv, f"--fd={theirs.fileno()}",
                        f"--parent-pid={os.getpid()}",
                    ],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=Path.cwd(),
                    start_new_session=True,  # a terminal's Ctrl-C reaches the pool, which then stops its ranks
                )  # fmt: skip
                pidfd = os.pidfd_open(proc.pid)
        return _Rank(rank, proc, Connection(ours.detach()), pidfd, log, faults)

    def _forked(
        self, argv: list[str], env: dict[str, str], log_fd: int, rank_fd: int
    ) -> tuple[RankProcess | None, int]:
        """A rank forked by the zygote, with a pidfd of it; (None, -1) when the zygote cannot fork (it is then
        dropped, and this pool's ranks start as interpreters of their own)."""
        if self._zygote is None:
            return None, -1
        try:
            return self._zygote.spawn(argv, env, log_fd, rank_fd)
        except zygotes.ZygoteError as exc:
            print(f"fsdp-readings: starting ranks without a zygote: {exc}", file=sys.stderr)
            zygotes.release(self._zygote)
            self._zygote = None
            return None, -1

    def _await_ready(self) -> None:
        waiting = {r.conn: r for r in self._ranks}
        deaths = {r.pidfd: r for r in self._ranks}
        deadline = time.monotonic() + self.start_timeout
        while waiting:
            remaining = deadline - time.monotonic()
            ready = wait([*waiting, *deaths], timeout=max(remaining, 0))
            if not ready:
                stacks = self._dump_stacks(list(waiting.values()))
                raise PoolStartError(
                    f"{len(waiting)} of {self.world_size} ranks did not join the process group within "
                    f"{self.start_timeout:.0f} s\n{self._start_logs(stacks)}"
                )
            for handle in ready:
                if handle in deaths:
                    rank = deaths[handle]
                    if rank.conn in waiting and not rank.conn.poll():
                        rank.proc.wait()
                        raise PoolStartError(f"{rank.exit_description()} while starting\n{self._start_logs({})}")
                    continue
                rank = waiting.pop(handle)
                message = rank.conn.recv()
                if not isinstance(message, Ready):
                    raise PoolStartError(f"rank {rank.rank} sent {message!r} instead of Ready")
                self.backend = message.backend

    def _start_logs(self, stacks: dict[int, str]) -> str:
        parts = []
        for rank in self._ranks:
            log, faults = rank.read_since((0, 0))
            parts.append(f"── rank {rank.rank} output ──\n{log[-4000:]}{faults[-4000:]}{stacks.get(rank.rank, '')}")
        return "\n".join(parts)

    def close(self, *, force: bool = False) -> None:
        """Stop every rank (politely unless ``force`` or broken) and remove the pool's files. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if not (force or self.broken):
            for rank in self._ranks:
                if rank.proc.poll() is None:
                    with contextlib.suppress(OSError):
                        rank.conn.send(Shutdown())
            deadline = time.monotonic() + 5.0
            for rank in self._ranks:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rank.proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        for rank in self._ranks:
            _kill_group(rank.proc)
        for rank in self._ranks:
            rank.conn.close()
            os.close(rank.pidfd)
        if self._zygote is not None:
            zygotes.release(self._zygote)
            self._zygote = None
        shutil.rmtree(self._workdir, ignore_errors=True)

    # -- running checks -----------------------------------------------------------------------------------------
    def run(self, request: CheckRequest, timeout: float) -> CheckRun:
        if self.closed or self.broken:
            raise RuntimeError("this pool is closed; ask the PoolManager for a new one")
        if request.world_size != self.world_size:
            raise ValueError(f"a {request.world_size}-rank check cannot run on a {self.world_size}-rank pool")
        started = time.monotonic()
        task = Task(next(self._task_ids), request)
        marks = {r.rank: r.offsets() for r in self._ranks}
        for rank in self._ranks:
            with contextlib.suppress(OSError):  # a rank that died while idle: `_collect` reports how it died
                rank.conn.send(task)
        results = self._collect(task, timeout)
        if not self.broken:  # every rank answered; make sure the group survived the check
            self._verify()
        for rank in self._ranks:
            log, faults = rank.read_since(marks[rank.rank])
            result = results[rank.rank]
            result.log = log[-_LOG_LIMIT:]
            if faults.strip() and not result.stack:
                result.stack = faults
        self.checks_run += 1
        ordered = [results[r.rank] for r in self._ranks]
        return CheckRun(
            request, ordered, failure=describe(request, ordered, self.backend), duration=time.monotonic() - started
        )

    def _collect(self, task: Task, timeout: float) -> dict[int, RankResult]:
        results: dict[int, RankResult] = {}
        pending = {r.rank: r for r in self._ranks}
        deadline = time.monotonic() + timeout
        first_failure: tuple[float, str] | None = None
        while pending:
            limit = deadline if first_failure is None else min(deadline, first_failure[0] + GRACE_AFTER_FAILURE)
            ready = wait(
                [r.conn for r in pending.values()] + [r.pidfd for r in pending.values()],
                timeout=max(limit - time.monotonic(), 0),
            )
            if not ready:
                break
            for rank in list(pending.values()):
                outcome = None
                if rank.conn in ready or rank.conn.poll():
                    with contextlib.suppress(EOFError, OSError):  # else its socket closed: it died
                        outcome = rank.conn.recv()
                elif rank.pidfd not in ready:
                    continue
                if outcome is not None:
                    assert isinstance(outcome, Outcome) and outcome.task_id == task.task_id, outcome
                    results[rank.rank] = outcome.result
                    if not outcome.result.ok and first_failure is None:
                        first_failure = (time.monotonic(), f"rank {rank.rank} failed")
                else:
                    _reap(rank.proc)
                    self.broken = True
                    results[rank.rank] = RankResult(
                        rank.rank, ok=False, error=rank.exit_description(), signal=rank.exit_signal()
                    )
                    if first_failure is None:
                        first_failure = (time.monotonic(), rank.exit_description())
                del pending[rank.rank]
        if pending:
            self.broken = True
            if first_failure is None:
                why = f"timed out after {timeout:g} s (--check-timeout)"
            else:
                why = f"no answer {GRACE_AFTER_FAILURE:g} s after {first_failure[1]}"
            stacks = self._dump_stacks(list(pending.values()))
            for number in pending:
                results[number] = RankResult(number, ok=False, error=why, stack=stacks.get(number))
        return results

    def _verify(self) -> None:
        """Confirm the group still all-reduces correctly before the next check trusts it. The first wrong or
        missing answer retires the pool at once: a rank whose peer skipped the all-reduce waits in it forever."""
        for rank in self._ranks:
            rank.conn.send(Verify())
        deadline = time.monotonic() + VERIFY_TIMEOUT
        pending = {rank.conn: rank for rank in self._ranks}
        while pending:
            ready = wait(list(pending), timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                self.broken = True
                return
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    answer = conn.recv()
                except (EOFError, OSError):
                    answer = None
                if not (isinstance(answer, Verified) and answer.rank == rank.rank and answer.healthy):
                    self.broken = True
                    return

    def _dump_stacks(self, ranks: list[_Rank]) -> dict[int, str]:
        """Ask faulthandler in each rank for every thread's Python stack, then read what it wrote."""
        before = {r.rank: _size(r.faults) for r in ranks}
        for rank in ranks:
            if rank.proc.poll() is None:
                os.kill(rank.proc.pid, STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT
        while time.monotonic() < deadline and any(_size(r.faults) == before[r.rank] for r in ranks):
            time.sleep(0.05)
        time.sleep(0.1)  # let a dump in progress finish
        return {r.rank: _read_from(r.faults, before[r.rank]) for r in ranks}


_WORKDIR_PREFIX = "fsdp-readings-pool-"


def _sweep_orphaned_workdirs() -> None:
    """Remove the store and log directories of pools whose owning process died without closing them (a SIGKILLed
    pytest: its ranks died with it, by PR_SET_PDEATHSIG, but nothing removed their files)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*-*"):
        owner = path.name.removeprefix(_WORKDIR_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Whatever this process can import, the ranks can: checks, guides' helpers, a test module's sabotage.
    paths = [p or str(Path.cwd()) for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # Ranks of a pool share one machine; loopback avoids gloo picking an interface that cannot reach itself.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)  # a pool inside a torchrun job must not rejoin the job's group
    return env


def _reap(proc: RankProcess) -> None:
    """Wait for a rank whose socket closed; one that lingers is killed (it can no longer take work)."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc)


def _kill_group(proc: RankProcess) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # a SIGKILLed process is reaped at once
        proc.wait(timeout=10)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
