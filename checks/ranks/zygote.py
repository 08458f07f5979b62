"""A process that has imported torch once and forks rank processes from that state.

A rank started as a fresh interpreter spends most of its start importing torch, its distributed packages and the
probes before it can join a group; a pool of N ranks pays that N times, and every test that builds its own pool
pays it again. The zygote pays it once per session: `Zygote.spawn` asks it for a rank, it forks, and the child
runs `checks.ranks.worker.main` with the imports already done (it then joins its process group as any rank does).
The zygote never creates a process group, a thread or a CUDA context, so forking it is safe, and it freezes its
objects out of the collector's sight first so that the children's collections do not touch (and copy) them.

Processes: the zygote is ``python -m checks.ranks.zygote`` in its own session, tied to the pool's process by
``PR_SET_PDEATHSIG``; each rank is its child, in a session of its own, tied to it the same way. So the pool's
process dying takes the zygote and then the ranks with it. The zygote reaps its children and reports each exit
status (as `subprocess` return codes: -N for a signal); a rank process on the pool's side is a `ForkedRank`,
which answers ``poll`` and ``wait`` like a ``Popen``. The zygote also hands over a pidfd for each child, opened
before the child could be reaped, so the pool can wait on the child's death without racing pid reuse.

One zygote serves every spawn whose environment, working directory and interpreter are those it started with; a
spawn with other ones gets a zygote of its own (a test that sets a variable torch reads at import sees it). Two
kinds of variable do not count, because nothing reads them at import: ``PYTHONPATH`` (each rank gets the pool's
own search path), and this project's ``FSDP_READINGS_*`` and pytest's ``PYTEST_CURRENT_TEST`` (read when used;
each rank gets the pool's values). Both change from test to test (the suite gives every test its own data
directory): counted, they would start a zygote per test. Zygotes are shared by the pools of a process and counted:
`acquire` starts one (without waiting for its imports), `release` stops it when its last pool leaves, unless
someone `hold`s zygotes for longer: a `PoolManager` while it is open, the pytest plugin for the session (which
also starts one once collection found claims, so its imports overlap the anchor items).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

_MESSAGE_LIMIT = 1 << 20
START_TIMEOUT = 120.0
CALL_TIME_PREFIX = "FSDP_READINGS_"  # this project's variables: read when used, never at import (see above)
CALL_TIME = frozenset({"PYTEST_CURRENT_TEST"})  # set by pytest for each test


class ZygoteError(RuntimeError):
    """The zygote could not start or stopped answering; the message holds its output."""


# -- the pool's side -------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class ForkedRank:
    """A rank process forked by a zygote: ``pid``, ``poll()`` and ``wait(timeout)`` as on a ``Popen``."""

    pid: int
    zygote: Zygote
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.read_exits(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0)
            self.zygote.read_exits(timeout=remaining)
        assert self.returncode is not None
        return self.returncode


@dataclass(eq=False)
class Zygote:
    key: tuple[Any, ...]
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    log: Path
    users: int = 0
    ready: bool = False
    children: dict[int, ForkedRank] = field(default_factory=dict)
    dead: bool = False

    def spawn(self, argv: list[str], env: dict[str, str], log_fd: int, rank_fd: int) -> tuple[ForkedRank, int]:
        """Fork a rank running ``checks.ranks.worker.main(argv + --fd, --parent-pid)`` with ``env``'s
        ``PYTHONPATH`` in front of its ``sys.path`` and its `call_time` variables in its environment, its output on
        ``log_fd`` and ``rank_fd`` as its socket to the pool. Returns the rank and a pidfd of it."""
        message = pickle.dumps(("spawn", argv, env.get("PYTHONPATH", ""), call_time(env), _REGISTRY.preloads))
        try:
            self._await_ready()
            socket.send_fds(self.sock, [message], [log_fd, rank_fd])
            while True:
                reply, fds = self._receive(timeout=START_TIMEOUT)
                if reply[0] == "spawned":
                    rank = self.children[reply[1]] = ForkedRank(reply[1], self)
                    return rank, fds[0]
                if reply[0] == "refused":
                    _REGISTRY.preloads = ()  # the next zygote would refuse too
                    raise ZygoteError(reply[1])
                self._record(reply)
        except (OSError, EOFError, ZygoteError) as exc:
            output = _tail(self.log)
            self.close()
            raise ZygoteError(f"the zygote did not fork a rank: {exc}\n{output}") from exc

    def _await_ready(self) -> None:
        if self.ready:
            return
        reply, _ = self._receive(timeout=START_TIMEOUT)
        if reply[0] != "ready":
            raise ZygoteError(f"the zygote sent {reply!r} instead of ready")
        self.ready = True

    def read_exits(self, timeout: float | None) -> None:
        """Take in the exit statuses the zygote has sent (waiting up to ``timeout`` for one)."""
        if self.dead or not self.ready:
            return
        try:
            if not wait([self.sock], timeout=timeout):
                return
            while True:
                reply, fds = self._receive(timeout=0)
                for fd in fds:
                    os.close(fd)
                self._record(reply)
                if not wait([self.sock], timeout=0):
                    return
        except (OSError, EOFError, ZygoteError):
            self._died()

    def _receive(self, timeout: float) -> tuple[tuple[Any, ...], list[int]]:
        if not wait([self.sock], timeout=timeout):
            raise ZygoteError(f"no answer within {timeout:g} s")
        data, fds, _, _ = socket.recv_fds(self.sock, _MESSAGE_LIMIT, 4)
        if not data:
            raise EOFError("the zygote closed its socket")
        return pickle.loads(data), fds

    def _record(self, reply: tuple[Any, ...]) -> None:
        if reply[0] == "exited":
            rank = self.children.pop(reply[1], None)
            if rank is not None:
                rank.returncode = reply[2]

    def _died(self) -> None:
        """The zygote is gone: its children died with it (their death signal), so they count as killed."""
        self.dead = True
        for rank in self.children.values():
            if rank.returncode is None:
                rank.returncode = -signal.SIGKILL
        self.children.clear()

    def close(self) -> None:
        if _REGISTRY.zygotes.get(self.key) is self:
            del _REGISTRY.zygotes[self.key]
        self._died()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.log.unlink()


@dataclass
class _Registry:
    zygotes: dict[tuple[Any, ...], Zygote] = field(default_factory=dict)
    holds: int = 0
    exit_hook: bool = False
    preloads: tuple[str, ...] = ()


_REGISTRY = _Registry()


@contextlib.contextmanager
def preloading(*modules: str) -> Iterator[None]:
    """While open, have every zygote import ``modules`` before its next fork, so ranks start with them imported
    (a test module whose checks build Hugging Face models, say, pays for ``transformers`` once, not once per rank).
    A module that cannot be imported there is left for the ranks to import (and fail on) themselves; one whose
    import starts a thread makes the zygote refuse to fork, and the pool start its ranks as interpreters. A zygote
    keeps what it imported after the block closes; only zygotes started later go without."""
    kept = _REGISTRY.preloads
    _REGISTRY.preloads = tuple(dict.fromkeys((*kept, *modules)))
    try:
        yield
    finally:
        _REGISTRY.preloads = kept


def hold() -> None:
    """Keep zygotes running when their last pool leaves, until the matching `unhold`."""
    _REGISTRY.holds += 1


def unhold() -> None:
    """End a `hold`; with none left, stop the zygotes no pool uses."""
    _REGISTRY.holds = max(_REGISTRY.holds - 1, 0)
    if _REGISTRY.holds == 0:
        for zygote in list(_REGISTRY.zygotes.values()):
            if zygote.users <= 0:
                zygote.close()


def acquire(env: dict[str, str], cwd: Path) -> Zygote:
    """A zygote for ranks with this environment and directory, started if none runs (its imports go on in the
    background until its first `Zygote.spawn`). Give it back with `release`."""
    key = (sys.executable, str(cwd), tuple(sorted((k, v) for k, v in env.items() if not _read_when_used(k))))
    found = _REGISTRY.zygotes.get(key)
    if found is None or found.dead or found.proc.poll() is not None:
        if found is not None:
            found.close()
        found = _REGISTRY.zygotes[key] = _start(key, env, cwd)
        if not _REGISTRY.exit_hook:
            atexit.register(close_all)
            _REGISTRY.exit_hook = True
    found.users += 1
    return found


def _read_when_used(variable: str) -> bool:
    return variable == "PYTHONPATH" or is_call_time(variable)


def is_call_time(variable: str) -> bool:
    return variable.startswith(CALL_TIME_PREFIX) or variable in CALL_TIME


def call_time(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` a zygote's key leaves out but a rank must see: this project's, and pytest's."""
    return {k: v for k, v in env.items() if is_call_time(k)}


def release(zygote: Zygote) -> None:
    zygote.users -= 1
    if zygote.users <= 0 and _REGISTRY.holds == 0:
        zygote.close()


def close_all() -> None:
    for zygote in list(_REGISTRY.zygotes.values()):
        zygote.close()


def _start(key: tuple[Any, ...], env: dict[str, str], cwd: Path) -> Zygote:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    handle, name = tempfile.mkstemp(prefix="fsdp-readings-zygote-", suffix=".log")
    with os.fdopen(handle, "ab") as log_file, theirs:
        proc = subprocess.Popen(
            [sys.executable, "-m", "checks.ranks.zygote", f"--fd={theirs.fileno()}", f"--parent-pid={os.getpid()}"],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # a terminal's Ctrl-C reaches the pool's process, not this one
        )
    return Zygote(key, proc, ours, Path(name))


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


# -- the zygote's side -----------------------------------------------------------------------------------------------
def _serve(sock: socket.socket) -> None:
    from checks.ranks import worker

    worker.preimport()
    _warm_up()
    import gc

    gc.collect()
    gc.freeze()  # the children share these pages: collections there must not touch (and so copy) them
    sock.send(pickle.dumps(("ready", os.getpid())))
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for handle in wait([sock, *children]):
            if handle is sock:
                data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_LIMIT, 4)
                if not data:
                    return  # the pool's process closed its end: stop (the children's pool kills them)
                _, argv, search_path, variables, modules = pickle.loads(data)
                log_fd, rank_fd = fds
                if refused := _preload(modules):
                    os.close(log_fd)
                    os.close(rank_fd)
                    sock.send(pickle.dumps(("refused", refused)))
                    continue
                pid = os.fork()
                if pid == 0:
                    _become_rank(sock, list(children), argv, search_path, variables, fds=(log_fd, rank_fd))
                os.close(log_fd)
                os.close(rank_fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                socket.send_fds(sock, [pickle.dumps(("spawned", pid))], [pidfd])
            else:
                pid = children.pop(handle)
                _, status = os.waitpid(pid, 0)
                os.close(handle)
                sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _preload(modules: tuple[str, ...]) -> str | None:
    """Import what `preload` asked for and is not imported yet; why forking is no longer safe, or None."""
    import gc
    import importlib

    missing = [m for m in modules if m not in sys.modules]
    if not missing:
        return None
    for module in missing:
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    threads = len(list(Path("/proc/self/task").iterdir()))
    if threads != 1:
        return f"importing {', '.join(missing)} left {threads} threads in the zygote; forking now would not be safe"
    gc.collect()
    gc.freeze()
    return None


def _warm_up() -> None:
    """Run once, before any fork, what every rank's first check would otherwise pay for: the lazy imports and
    registrations behind the first meta-device module, forward, backward and optimizer step. One thread, no
    process group: nothing here is unsafe to fork."""
    import torch

    from mini_gpt import GPT, preset

    torch.set_num_threads(1)  # the ranks' setting; an OpenMP pool started here would not survive the fork
    model = GPT(preset("tiny"))
    with torch.device("meta"):
        GPT(preset("tiny"))
    tokens = torch.zeros(2, 8, dtype=torch.long)
    for optimizer in (torch.optim.AdamW(model.parameters()), torch.optim.SGD(model.parameters(), lr=0.1)):
        _, loss = model(tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    threads = list(Path("/proc/self/task").iterdir())
    if len(threads) != 1:
        raise ZygoteError(f"the warm-up left {len(threads)} threads; forking now would not be safe")


def _become_rank(
    sock: socket.socket,
    siblings: list[int],
    argv: list[str],
    search_path: str,
    variables: dict[str, str],
    *,
    fds: tuple[int, int],
) -> None:
    """In the forked child: a rank's own session, output (``fds``: the log, then the socket to the pool), search
    path, the pool's values of the variables read when used, and arguments, then the worker's loop."""
    log_fd, rank_fd = fds
    try:
        parent = os.getppid()
        sock.close()
        for pidfd in siblings:
            os.close(pidfd)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        front = [p for p in search_path.split(os.pathsep) if p]
        sys.path[:] = front + [p for p in sys.path if p not in front]  # as the pool's PYTHONPATH would set it
        os.environ["PYTHONPATH"] = search_path
        for name in [n for n in os.environ if is_call_time(n)]:
            del os.environ[name]  # the zygote's own values: the pool may have unset one
        os.environ.update(variables)
        from checks.ranks import worker

        worker.main([*argv, f"--fd={rank_fd}", f"--parent-pid={parent}"])
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def main(argv: list[str]) -> None:
    import argparse

    from checks.ranks.worker import die_with_parent

    parser = argparse.ArgumentParser(prog="python -m checks.ranks.zygote")
    parser.add_argument("--fd", type=int, required=True, help="socket to the pool's process")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    _serve(socket.socket(fileno=args.fd))
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
