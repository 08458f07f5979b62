"""A rank process of the pool: join the process group once, then run checks until told to stop.

Started by `checks.ranks.pool.RankPool`, forked from a zygote that did the imports (`checks.ranks.zygote`), or as
``python -m checks.ranks.worker`` when there is none; never by hand.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import signal
import sys
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path

from checks.ranks.protocol import Outcome, Ready, Shutdown, Task, Verified, Verify

STACK_SIGNAL = signal.SIGUSR1  # the pool sends it to ask for every thread's Python stack


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this rank when the pool's process dies, however it dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m checks.ranks.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    parser.add_argument("--store", required=True, help="FileStore path shared by the ranks of one pool")
    parser.add_argument("--fd", type=int, required=True, help="socket to the pool")
    parser.add_argument("--faults", required=True, help="file that receives faulthandler stacks")
    parser.add_argument("--parent-pid", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = _parse(argv)
    die_with_parent(args.parent_pid)
    conn = Connection(args.fd)
    # Append mode: the pool reads what was added since a check began, however many dumps came before.
    faults = Path(args.faults).open("a", buffering=1)  # noqa: SIM115 - must outlive every check
    faulthandler.enable(faults, all_threads=True)
    faulthandler.register(STACK_SIGNAL, faults, all_threads=True)

    import torch
    import torch.distributed as dist

    from checks.ranks import isolation
    from checks.ranks.context import RankContext
    from checks.ranks.execute import execute

    torch.set_num_threads(1)  # N ranks share the machine's cores; more threads only thrash
    if args.backend == "nccl":
        device = torch.device("cuda", args.rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    store = dist.FileStore(args.store, args.world_size)
    dist.init_process_group(
        args.backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(minutes=30),  # the pool enforces per-check timeouts itself
        device_id=device if args.backend == "nccl" else None,
    )
    preimport()
    isolation.freeze_baseline()
    ctx = RankContext(args.rank, args.world_size, args.backend, device, local_rank=args.rank, seed=0)
    conn.send(Ready(args.rank, os.getpid(), args.backend, str(device)))

    while True:
        message = conn.recv()
        if isinstance(message, Shutdown):
            break
        if isinstance(message, Verify):
            conn.send(Verified(args.rank, _group_works(args.world_size, device)))
            continue
        assert isinstance(message, Task), message
        result = execute(message.request, ctx)
        conn.send(Outcome(message.task_id, result))

    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without destroy_process_group or interpreter teardown: gloo can SIGABRT in its destructors at exit,
    # and the kernel releases the sockets and the store file either way.
    os._exit(0)


def _group_works(world_size: int, device: object) -> bool:
    import torch
    import torch.distributed as dist

    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    return int(probe.item()) == world_size


def preimport() -> None:
    """Pay for the heavy imports once per rank rather than inside the first check."""
    import torch.distributed.fsdp
    import torch.distributed.fsdp._fully_shard
    import torch.distributed.optim
    import torch.nn.parallel
    import torch.utils._python_dispatch  # noqa: F401  (the memory probe's)


if __name__ == "__main__":
    main(sys.argv[1:])
