"""How guide 09's NO_SHARD is chosen and what it says: the deprecation warning when asked for, the clamp of a
one-rank group (and of a HYBRID_SHARD with one-rank shard groups, which then never syncs), the warnings' texts
being the guide's expect blocks and the lines they name the ones that built each unit."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from checks.expected import Expected, Row
from checks.guides.g09_no_shard_is_ddp.replicas import build_replica, distinct_ratios
from checks.models.divide_factors import postdivide, predivide
from checks.naming import clean
from checks.probes.comm import record_comm
from checks.ranks import tracing
from checks.ranks.codeswap import code_of
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, units
from checks.workloads.groups import one_rank_group

_FSDP_INIT = "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.__init__"
_INIT_CORE_STATE = "torch.distributed.fsdp._init_utils:_init_core_state"


@contextlib.contextmanager
def _recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def _where(filename: str, line: int) -> str:
    return f"{Path(filename).name}:{line}"


@contextlib.contextmanager
def _call_sites(symbol: str, within: str | None = None) -> Iterator[list[str]]:
    """``file:line`` where ``symbol`` was called, once per call in the block: the calling frame's line, or with
    ``within`` the line the nearest frame running ``within`` is at (so a wrapper in between does not move it).
    A tracer on the code reads it, without the warnings machinery."""
    sites: list[str] = []
    enclosing = set(code_objects(within)) if within else None

    def on_call(frame: Any) -> None:
        caller = frame.f_back
        while enclosing is not None and caller is not None and code_of(caller) not in enclosing:
            caller = caller.f_back
        sites.append(_where(caller.f_code.co_filename, caller.f_lineno) if caller else "?")

    # the trace function, not `checks.probes.calls`: a trampoline frame would move the warnings' stacklevel
    with tracing.subscribed(dict.fromkeys(code_objects(symbol), on_call)) as subscription:
        yield sites
    if subscription.errors:
        raise RuntimeError(f"the call-site recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def _quoted(expected: Expected) -> Row:
    """The row of a block that quotes one warning's text (wrapped in the guide: its continuation joins it)."""
    if len(expected) != 1:
        raise ValueError(f"expect block `{expected.name}` quotes one warning in one row; it has {len(expected)}")
    return expected.rows[0]


def deprecation_warning_at_construction(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Building each NO_SHARD unit on more than one rank warns once, a FutureWarning with the text of the guide's
    expect block, attributed to the line that called FullyShardedDataParallel; forward and backward warn nothing."""
    quote = _quoted(expected)
    with _recorded_warnings() as built, _call_sites(_FSDP_INIT) as built_at:
        model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.NO_SHARD)
    matching = [w for w in built if str(w.message) == quote.text]
    n_units = len(units(model))
    message = f"{len(matching)} warnings with the guide's text for {n_units} units; got {_messages(built)}"
    details = {"observed": len(matching), "expected": n_units, "warnings": _messages(built)}
    # No warning with the quoted text: the guide's row is not what torch says. Some, but not one per unit: the count.
    expected.require(matching, quote, "deprecation-count", message, **details)
    require(len(matching) == n_units, "deprecation-count", message, **details)
    categories = sorted({w.category.__name__ for w in matching})
    require_equal(categories, ["FutureWarning"], reason="wrong-category", what="the deprecation warning's category")
    # stacklevel=3 is meant to name the caller of FullyShardedDataParallel(...): each unit's own construction line
    # in the workload's file, the blocks' line three times, then the root's.
    caller = Path(inspect.getsourcefile(fsdp1_gpt) or "").name
    require(all(site.startswith(f"{caller}:") for site in built_at), "units-built-elsewhere",
            f"units were built at {built_at}, not in {caller}", observed=built_at)  # fmt: skip
    points_at = [_where(w.filename, w.lineno) for w in matching]
    require_equal(points_at, built_at, reason="warning-location", what="the lines the deprecation warnings name")
    with _recorded_warnings() as later:
        _, loss = model(*batch(ctx))
        loss.backward()
    require(not later, "warns-after-construction", f"forward and backward warned: {_messages(later)}",
            observed=_messages(later))  # fmt: skip
    return {"category": categories[0], "count": len(matching), "message": quote.text, "points_at": points_at}


def world_size_1_clamps_to_no_shard(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Over a one-rank process group, the default FULL_SHARD becomes NO_SHARD with a UserWarning (the guide's
    expect block) and no deprecation warning; every all-reduce then spans that one rank."""
    quote = _quoted(expected)
    alone = one_rank_group(ctx)
    with _recorded_warnings() as built, _call_sites(_INIT_CORE_STATE, within=_FSDP_INIT) as called_at:
        model = fsdp1_gpt(ctx, process_group=alone)
    matching = [w for w in built if str(w.message) == quote.text]
    n_units = len(units(model))
    message = f"{len(matching)} clamp warnings for {n_units} units; got {_messages(built)}"
    details = {"observed": len(matching), "warnings": _messages(built)}
    expected.require(matching, quote, "no-clamp-warning", message, **details)  # the quoted text never warned
    require(len(matching) == n_units, "no-clamp-warning", message, **details)
    require_equal(sorted({w.category.__name__ for w in matching}), ["UserWarning"], reason="wrong-category",
                  what="the clamp warning's category")  # fmt: skip
    deprecations = [m for m in _messages(built) if m.startswith("FutureWarning")]
    require(not deprecations, "also-deprecation-warning", f"the clamp also warned {deprecations}",
            observed=deprecations)  # fmt: skip
    # stacklevel=2 names FullyShardedDataParallel.__init__'s own line, inside torch: the one that calls
    # `_init_core_state`, once per unit.
    torch_file = Path(inspect.getsourcefile(FSDP) or "").name
    require(all(site.startswith(f"{torch_file}:") for site in called_at), "called-elsewhere",
            f"_init_core_state was called from {called_at}, not from {torch_file}", observed=called_at)  # fmt: skip
    points_at = [_where(w.filename, w.lineno) for w in matching]
    require_equal(points_at, called_at, reason="warning-location", what="the lines the clamp warnings name")
    strategies = {
        name: (u.sharding_strategy.name, u._handle._sharding_strategy.name) for name, u in units(model).items()
    }
    require_equal(strategies, dict.fromkeys(strategies, ("NO_SHARD", "NO_SHARD")), reason="not-clamped",
                  what="(state, handle) strategy per unit")  # fmt: skip
    with record_comm() as comm:
        _, loss = model(*batch(ctx))
        loss.backward()
    spans = [(c.op, c.group_size) for c in comm]
    require_equal(spans, [("all_reduce", 1)] * n_units, reason="not-one-rank-all-reduces", what="collectives")
    return {
        "strategy": sorted(set(strategies.values())),
        "category": matching[0].category.__name__,
        "points_at": points_at,
        "group_sizes": [c.group_size for c in comm],
    }


def hybrid_shard_of_one_never_syncs(ctx: RankContext) -> dict[str, Any]:
    """HYBRID_SHARD with a one-rank shard group and all ranks as replicas: clamped to NO_SHARD, it all-reduces over
    the one-rank group only, so each rank keeps its own local gradient, divided as if the ranks had been summed."""
    alone = one_rank_group(ctx)
    with _recorded_warnings():
        model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(alone, dist.group.WORLD))
    strategies = sorted({u._handle._sharding_strategy.name for u in units(model).values()})
    require_equal(strategies, ["NO_SHARD"], reason="not-clamped", what="handle strategies")
    x, y = batch(ctx)
    with record_comm() as comm:
        _, loss = model(x, y)
        loss.backward()
    replica = build_replica(ctx)
    _, ref = replica(x, y)
    ref.backward()
    ours = {clean(name): p for name, p in model.named_parameters()}
    ratios: set[float] = set()
    for name, param in replica.named_parameters():
        ratios.update(distinct_ratios(ours[name].grad.cpu(), param.grad.cpu()))
    # The factors are computed for all the data-parallel ranks (shard group × replicas); the all-reduce over one
    # rank changes nothing in between. A factor of 1 is skipped, which divides by 1 all the same.
    expected = 1 / (predivide(ctx.world_size) * postdivide(ctx.world_size))
    require_equal(sorted(ratios), [expected], reason="not-own-gradient-divided", what="gradient / local gradient")
    spans = sorted({(c.op, c.group_size) for c in comm})
    require_equal(spans, [("all_reduce", 1)], reason="not-one-rank-all-reduces", what="(collective, group size)")
    checksums = ctx.gather(float(sum(p.grad.double().sum() for p in ours.values())))
    require(len(set(checksums)) == ctx.world_size, "replicas-in-sync", f"gradient checksums per rank: {checksums}",
            observed=checksums)  # fmt: skip
    return {"strategy": strategies[0], "group_sizes": [c.group_size for c in comm], "grad_over_local": ratios.pop()}
