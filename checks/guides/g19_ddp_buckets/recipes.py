"""Guide 19's DDP bent on purpose: the break-it recipes `tests/break_it/test_19_ddp_buckets.py` applies (caps from
the start, no limit ever, one bucket per parameter, buckets not reversed, a rebuild that ignores the cap list,
never happens or comes from another rank, an extra broadcast, no_sync, gradient_as_bucket_view and comm hooks
bent), and `EXERCISES`, some of them as puzzles (``fsdp-readings exercise 19-ddp-buckets``)."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.guides.g19_ddp_buckets.comm_hooks import HOOKS_MODULE
from checks.models import ddp_buckets as db


def caps_from_the_start(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that applies the caps (1 MiB, then the cap) in iteration 1 as well."""
    return [self.first_bucket_bytes_cap, self.bucket_bytes_cap], []


def no_limit_ever(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that gives every bucketing, the rebuild's too, no limit: one bucket."""
    return [db.MAXSIZE], [db.MAXSIZE]


def rebuild_ignores_the_list(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that keeps a ``bucket_cap_mb_list`` for iteration 1 only."""
    limits, _ = original(self, **kwargs)
    return limits, []


def limits_ignoring_find_unused(original: Callable[..., Any], self: Any, *, static_graph: bool,
                                find_unused_parameters: bool) -> tuple[list[int], list[int]]:  # fmt: skip
    """``compute_bucket_size_limits`` as if ``find_unused_parameters`` were False: one bucket in iteration 1."""
    return original(self, static_graph=static_graph, find_unused_parameters=False)


def explicit_default_cap(original: Callable[..., Any], *args: Any, bucket_cap_mb: Any = None, **kwargs: Any) -> Any:
    """``_BucketCapacityConfig.create`` with the default 25 passed explicitly: no 1 MiB first bucket."""
    return original(*args, bucket_cap_mb=25 if bucket_cap_mb is None else bucket_cap_mb, **kwargs)


def doubled_cap(original: Callable[..., Any], *args: Any, bucket_cap_mb: Any = None, **kwargs: Any) -> Any:
    """``_BucketCapacityConfig.create`` with twice the cap asked for."""
    return original(*args, bucket_cap_mb=None if bucket_cap_mb is None else 2 * bucket_cap_mb, **kwargs)


def one_bucket_per_parameter(original: Callable[..., Any], tensors: Any, *args: Any, **kwargs: Any) -> Any:
    """``dist._compute_bucket_assignment_by_size`` that puts every parameter in a bucket of its own."""
    _, limits = original(tensors, *args, **kwargs)
    return [[i] for i in range(len(tensors))], [limits[0]] * len(tensors)


def reducer_not_reversed(original: Callable[..., Any], params: Any, bucket_indices: Any, limits: Any,
                         *args: Any) -> Any:  # fmt: skip
    """``dist.Reducer`` given iteration 1's buckets in registration order, not reversed."""
    return original(params, list(reversed(bucket_indices)), list(reversed(limits)), *args)


class _NoRebuild:
    """A reducer whose ``_rebuild_buckets`` does nothing; everything else is the real one's."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def pre_forward_without_rebuild(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``DistributedDataParallel._pre_forward`` whose call of ``self.reducer._rebuild_buckets()`` does nothing."""
    reducer = self.reducer
    self.reducer = _NoRebuild(reducer)
    try:
        return original(self, *args, **kwargs)
    finally:
        self.reducer = reducer


def pre_forward_hiding(original: Callable[..., Any], self: Any, *args: Any, name: str, **kwargs: Any) -> Any:
    """``DistributedDataParallel._pre_forward`` run with the environment variable ``name`` unset, so the reducer's
    rebuild, called from it, does not see it; restored after."""
    saved = os.environ.pop(name, None)
    try:
        return original(self, *args, **kwargs)
    finally:
        if saved is not None:
            os.environ[name] = saved


_REVERSED_GROUPS = itertools.count()  # every rank builds them in the same order, so the names agree


def reversed_ranks_group() -> Any:
    """A gloo group of every rank in reverse: its group rank 0 is the last global rank. Built through c10d's helper
    (``new_group`` sorts the ranks it is given) and registered as ``new_group`` registers one."""
    c10d = dist.distributed_c10d
    ranks = list(range(dist.get_world_size() - 1, -1, -1))
    group, _ = c10d._new_process_group_helper(
        len(ranks), ranks.index(dist.get_rank()), ranks, "gloo", c10d._get_default_store(),
        f"g19-reversed-{next(_REVERSED_GROUPS)}", timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    c10d._world.pg_group_ranks[group] = {global_rank: i for i, global_rank in enumerate(ranks)}
    return group


def ddp_on_reversed_ranks(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` on `reversed_ranks_group`: every broadcast DDP roots at its group's rank
    0, the rebuild's too, comes from the last global rank instead of rank 0."""
    original(self, *args, **{**kwargs, "process_group": reversed_ranks_group()})


def pre_forward_with_extra_broadcast(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``_pre_forward`` that also broadcasts one int32 from rank 0 every forward."""
    dist.broadcast(torch.zeros(1, dtype=torch.int32), src=0)
    return original(self, *args, **kwargs)


def no_sync_that_syncs(original: Callable[..., Any], self: Any) -> Any:
    """``no_sync`` that changes nothing: every micro-step all-reduces."""
    return contextlib.nullcontext()


def no_sync_never_restored(original: Callable[..., Any], self: Any) -> Any:
    """``no_sync`` that turns synchronisation off for good: the synced micro-step all-reduces nothing."""
    self.require_backward_grad_sync = False
    return contextlib.nullcontext()


@contextlib.contextmanager
def no_sync_dropping_gradients(original: Callable[..., Any], self: Any) -> Iterator[None]:
    """``no_sync`` that zeroes what the micro-steps accumulated when it exits."""
    with original(self):
        yield
    for param in self.module.parameters():
        if param.grad is not None:
            param.grad.zero_()


def forced_bucket_view(original: Callable[..., Any], self: Any, *args: Any, value: bool, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` with ``gradient_as_bucket_view`` forced to ``value``."""
    original(self, *args, **{**kwargs, "gradient_as_bucket_view": value})


def allreduce_fut_undivided(original: Callable[..., Any], process_group: Any, tensor: torch.Tensor) -> Any:
    """The default hook's ``_allreduce_fut`` that sums without dividing by the world size."""
    group = process_group if process_group is not None else dist.group.WORLD
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def allreduce_fut_twice(original: Callable[..., Any], process_group: Any, tensor: torch.Tensor) -> Any:
    """``_allreduce_fut`` that all-reduces a copy of the bucket first, and drops it."""
    dist.all_reduce(tensor.clone())
    return original(process_group, tensor)


def compress_as(original: Callable[..., Any], dtype: Any, process_group: Any, bucket: Any, *, to: str) -> Any:
    """The default hooks' ``_compress_hook`` casting to ``to`` (``"bfloat16"``, ``"float32"``) instead."""
    return original(getattr(torch, to), process_group, bucket)


def _local_only(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _rank_skewed(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    buffer = bucket.buffer()
    dist.all_reduce(buffer.div_(dist.get_world_size()))
    buffer[0] += 1e-6 * dist.get_rank()
    done: Any = torch.futures.Future()
    done.set_result(buffer)
    return done


def ddp_with_hook(original: Callable[..., Any], self: Any, *args: Any, hook: str, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` followed by a comm hook: ``local`` all-reduces nothing (each rank keeps
    its own gradient), ``skewed`` all-reduces and then adds a rank-dependent 1e-6 to one element."""
    original(self, *args, **kwargs)
    self.register_comm_hook(None, {"local": _local_only, "skewed": _rank_skewed}[hook])


# -- exercises: some of these recipes as puzzles (``fsdp-readings exercise 19-ddp-buckets``) -------------------------
_DDP = "torch.nn.parallel.distributed:DistributedDataParallel"
_LIMITS = "torch.nn.parallel.distributed:_BucketCapacityConfig.compute_bucket_size_limits"

EXERCISES = (
    Exercise(
        "caps-from-the-start",
        claim="overlap-from-iteration-2",
        patches=(wrapping(_LIMITS, caps_from_the_start),),
        puzzle="`compute_bucket_size_limits` gives the first bucketing the caps (1 MiB, then 25 MiB) even without "
        "`find_unused_parameters`, as if registration order were the order gradients become ready.",
        reason="overlap-in-iteration-1",
    ),
    Exercise(
        "no-limit-ever",
        claim="overlap-from-iteration-2",
        patches=(wrapping(_LIMITS, no_limit_ever),),
        puzzle="`compute_bucket_size_limits` hands the reducer `sys.maxsize` for its rebuild too.",
        reason="no-overlap",
    ),
    Exercise(
        "no-sync-never-restored",
        claim="no-sync-accumulates",
        patches=(wrapping(f"{_DDP}.no_sync", no_sync_never_restored),),
        puzzle="`no_sync` sets `require_backward_grad_sync = False` and never puts it back.",
        reason="synced-step-all-reduces",
    ),
    Exercise(
        "hook-forgets-to-divide",
        claim="allreduce-hook-is-builtin",
        patches=(wrapping(f"{HOOKS_MODULE}:_allreduce_fut", allreduce_fut_undivided),),
        puzzle="The default hook's `_allreduce_fut` all-reduces the bucket without dividing it by the world size.",
        reason="hook-gradients-differ",
    ),
)
