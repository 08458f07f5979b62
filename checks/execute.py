"""Run one `CheckRequest` on this rank: the code path shared by pool workers and torchrun ranks."""

from __future__ import annotations

import pickle
import time
import traceback
from dataclasses import replace

from checks import isolation, patching, tracing
from checks.context import RankContext
from checks.protocol import CheckRequest, RankResult
from checks.symbols import load


def execute(request: CheckRequest, ctx: RankContext) -> RankResult:
    ctx = replace(ctx, seed=request.seed)
    state = isolation.snapshot()
    groups_before = isolation.live_groups()
    started = time.perf_counter()
    executed: set[str] = set()
    try:
        isolation.reseed(request.seed)
        check = load(request.target)
        with patching.applied(request.patches), tracing.watch(request.trace) as seen:
            try:
                value = check(ctx, **request.kwargs)
            finally:
                executed = set(seen)
        _ensure_picklable(value, request.target)
        result = RankResult(rank=ctx.rank, ok=True, value=value)
    except BaseException as exc:  # a check's SystemExit or KeyboardInterrupt is still its failure
        result = RankResult(rank=ctx.rank, ok=False, error=_format(exc))
    finally:
        isolation.restore(state)
    try:
        isolation.destroy_groups_created_since(groups_before)
        isolation.collect()
    except Exception as exc:  # cleanup failing means the next check cannot trust this rank
        result = RankResult(rank=ctx.rank, ok=False, error=f"cleanup after the check failed:\n{_format(exc)}")
    result.executed = frozenset(executed)
    result.duration = time.perf_counter() - started
    return result


def _ensure_picklable(value: object, target: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(
            f"{target} returned a {type(value).__name__} that cannot be sent back from the rank ({exc}); "
            "return plain data (numbers, strings, lists, dicts, dataclasses), not tensors bound to a group "
            "or modules"
        ) from exc


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
