"""Guide 09's break-it recipes (tests/break_it/test_09_no_shard_is_ddp.py applies them): NO_SHARD's reduction and
its choice bent on purpose."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from checks.models.divide_factors import postdivide, predivide
from checks.ranks import codeswap
from checks.ranks.codeswap import code_of


def map_no_shard_to(original: dict[Any, Any], strategy: str = "FULL_SHARD") -> dict[Any, Any]:
    """``SHARDING_STRATEGY_MAP`` with NO_SHARD pointing at a sharded handle strategy."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return {**original, ShardingStrategy.NO_SHARD: HandleShardingStrategy[strategy]}


@contextlib.contextmanager
def _all_reduce_replaced(replacement: Any) -> Iterator[Any]:
    """``dist.all_reduce`` is ``replacement(original, ...)`` for the duration (only around one FSDP call)."""
    original = dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: replacement(original, *args, **kwargs)
    try:
        yield
    finally:
        dist.all_reduce = original


def reduce_without_all_reduce(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` whose all-reduce does nothing: the divides still run."""
    with _all_reduce_replaced(lambda _all_reduce, *args, **kwargs: None):
        original(state, handle)


def reduce_with_all_reduce_twice(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` that all-reduces the same gradient twice."""

    def twice(all_reduce: Any, *args: Any, **kwargs: Any) -> Any:
        all_reduce(*args, **kwargs)
        return all_reduce(*args, **kwargs)

    with _all_reduce_replaced(twice):
        original(state, handle)


def init_core_state_silently(original: Any, *args: Any) -> Any:
    """`_init_core_state` with every warning it emits swallowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return original(*args)


def init_core_state_with_user_warnings(original: Any, *args: Any) -> Any:
    """`_init_core_state` whose warnings come out as plain UserWarnings, same text, same caller."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = original(*args)
    for w in caught:
        warnings.warn_explicit(str(w.message), UserWarning, w.filename, w.lineno)
    return state


def init_core_state_naming_the_def_line(original: Any, *args: Any) -> Any:
    """`_init_core_state` whose warnings name the first line (the ``def``) of the function they should point
    into, in the same file, instead of the line that called: the clamp's ``FullyShardedDataParallel.__init__``
    (stacklevel 2), the deprecation's caller of it (stacklevel 3)."""
    import sys

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = original(*args)
    init = sys._getframe()
    while init is not None and code_of(init) is not codeswap.original(inspect.unwrap(FSDP.__init__).__code__):
        init = init.f_back
    for w in caught:
        named = init.f_back if issubclass(w.category, FutureWarning) else init
        code = named.f_code
        warnings.warn_explicit(str(w.message), w.category, code.co_filename, code.co_firstlineno)
    return state


def init_core_state_without_clamp(original: Any, state: Any, *args: Any) -> Any:
    """`_init_core_state` that does not see a one-rank group as one rank, so it keeps the requested strategy."""
    real = state.world_size
    state.world_size = max(real, 2)
    try:
        return original(state, *args)
    finally:
        state.world_size = real


def reduce_also_over_replicas(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` followed by the all-reduce over the replicate group that a clamped HYBRID_SHARD
    never issues: what a fix for pytorch#154888 would add."""
    original(state, handle)
    replicas = getattr(state, "_inter_node_pg", None)
    if replicas is not None:
        dist.all_reduce(handle.flat_param.grad, group=replicas)


def divide_for_the_shard_group_only(original: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
    """`_init_process_group_state` that sizes the divide factors by the shard group alone, leaving out the
    replicas, as the clamp sizes the strategy."""
    state = original(state, *args, **kwargs)
    state._gradient_predivide_factor = predivide(state.world_size)
    state._gradient_postdivide_factor = postdivide(state.world_size)
    return state


def flatten_as_if_alone(original: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
    """`FlatParamHandle._init_flat_param_and_metadata` that builds a NO_SHARD flat parameter as if its group had
    one rank, so nothing pads it for the world size: what guide 09 once said torch does."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    real = handle.world_size
    if handle._sharding_strategy == HandleShardingStrategy.NO_SHARD:
        handle.world_size = 1
    try:
        return original(handle, *args, **kwargs)
    finally:
        handle.world_size = real
