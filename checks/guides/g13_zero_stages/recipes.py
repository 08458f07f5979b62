"""Guide 13's break-it recipes: the reference ZeRO and torch bent on purpose (``tests/break_it/`` applies them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


# -- break-it recipes: the reference ZeRO and torch bent on purpose (tests/break_it/ applies them) ------------------
def neighbours_range(original: Callable[..., tuple[int, int]]) -> Callable[..., tuple[int, int]]:
    """`checks.zero.groups.shard_range` that gives each rank its neighbour's slice: the reduced gradient lands in,
    and the optimizer updates, a slice the rank does not own."""

    def shifted(padded: int, world_size: int, rank: int) -> tuple[int, int]:
        return original(padded, world_size, (rank + 1) % world_size)

    return shifted


def ddp_without_all_reduce(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """`DistributedDataParallel.__init__` followed by a communication hook that all-reduces nothing: every rank
    keeps its own gradient, as if the reducer's bucket all-reduce were missing."""
    original(self, *args, **kwargs)

    def local_only(state, bucket):  # unannotated: DDP refuses any annotation but dist.GradBucket
        done: Any = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    self.register_comm_hook(None, local_only)


_EXTRA: list[torch.Tensor] = []
EXTRA_TEMP_BYTES = 100_000  # between one block (64,080 bytes) and two (128,160): what the old bound let through


def extra_temp_in_shard_grad_op(original: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
    """``_pre_backward_hook`` that, under SHARD_GRAD_OP, allocates a 100,000-byte temporary in the root's hook and
    keeps it through backward (`drop_extra_temp` frees it): memory FULL_SHARD's run does not hold."""
    from torch.distributed.fsdp import ShardingStrategy

    if state._is_root and state.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and not _EXTRA:
        _EXTRA.append(torch.ones(EXTRA_TEMP_BYTES // 4))
    return original(state, *args, **kwargs)


def drop_extra_temp(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``_post_backward_final_callback`` that frees `extra_temp_in_shard_grad_op`'s temporary first."""
    _EXTRA.clear()
    return original(*args, **kwargs)


def sgd_keeping_momentum_always(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """`SGD.step`, then a momentum buffer for every parameter with a gradient, whatever its momentum: SGD as if
    ``group["momentum"] != 0`` were not asked."""
    loss = original(self, *args, **kwargs)
    for group in self.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                self.state[p].setdefault("momentum_buffer", p.grad.detach().clone())
    return loss


def adam_forgetting_amsgrad(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """`Adam.step`, then each parameter's ``max_exp_avg_sq`` dropped: an Adam whose amsgrad keeps no third buffer."""
    loss = original(self, *args, **kwargs)
    for state in self.state.values():
        state.pop("max_exp_avg_sq", None)
    return loss


def adam_keeping_an_extra_buffer(original: Any, self: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
    """`Adam._init_group`, then one more zero buffer per parameter with a gradient: state a third larger."""
    out = original(self, group, *args, **kwargs)
    for p in group["params"]:
        if p.grad is not None:
            self.state[p].setdefault("extra", torch.zeros_like(p))
    return out


def pre_backward_every_time(original: Any) -> Any:
    """`Zero3._pre_backward` without FSDP1's once-per-forward flag: every output gradient gathers again."""

    def pre_backward(self: Any, i: int) -> None:
        self._gather(self.blocks[i])

    return pre_backward
