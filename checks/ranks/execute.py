"""Run one `CheckRequest` on this rank: the code path shared by pool workers and torchrun ranks."""

from __future__ import annotations

import pickle
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from checks.ranks import capture, isolation, marks, patching
from checks.ranks.context import RankContext
from checks.ranks.protocol import CheckRequest, RankResult
from checks.ranks.symbols import load
from checks.violation import Violation


def execute(request: CheckRequest, ctx: RankContext) -> RankResult:
    ctx = replace(ctx, seed=request.seed)
    state = isolation.snapshot()
    groups_before = isolation.live_groups()
    started = time.perf_counter()
    executed: set[str] = set()
    captured: list[Any] = []
    _recorded()  # start the count: what an earlier check recorded is not this one's
    try:
        isolation.reseed(request.seed)
        check = load(request.target)
        with (
            patching.applied(request.patches),
            marks.watch(request.trace) as seen,
            _capturing(request.capture) as captured,
        ):
            try:
                value = check(ctx, **request.kwargs)
            finally:
                executed = set(seen)
        _ensure_picklable(value, request.target)
        result = RankResult(rank=ctx.rank, ok=True, value=value)
    except BaseException as exc:  # a check's SystemExit or KeyboardInterrupt is still its failure
        result = _failed(ctx.rank, exc)
    finally:
        isolation.restore(state)
    try:
        isolation.destroy_groups_created_since(groups_before)
        isolation.collect()
    except Exception as exc:  # cleanup failing means the next check cannot trust this rank
        result = _failed(ctx.rank, exc, prefix="cleanup after the check failed:\n")
    result.executed = frozenset(executed)
    result.recorded = _recorded()
    result.captured = [_sendable(log) for log in captured]  # a failed check's logs too: they show how far it got
    result.duration = time.perf_counter() - started
    return result


@contextmanager
def _capturing(on: bool) -> Iterator[list[Any]]:
    """The probe logs the check records when ``on`` (`checks.ranks.capture`), else an empty list. Imported only
    when asked for."""
    if not on:
        yield []
        return
    with capture.collecting() as logs:
        yield logs


def _recorded() -> frozenset[str]:
    """The kinds of probe recording finished since the last call (none when no probe module was ever loaded)."""
    return capture.recorded_since_reset()


def _sendable(log: object) -> object:
    """A captured log as it is if it pickles, else its repr (a log must never stop the result coming back)."""
    try:
        pickle.dumps(log)
    except Exception as exc:
        return f"unpicklable {type(log).__name__}: {exc}"
    return log


def _ensure_picklable(value: object, target: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(
            f"{target} returned a {type(value).__name__} that cannot be sent back from the rank ({exc}); "
            "return plain data (numbers, strings, lists, dicts, dataclasses), not tensors bound to a group "
            "or modules"
        ) from exc


def _failed(rank: int, exc: BaseException, prefix: str = "") -> RankResult:
    """A failed result with the exception rendered for people and described for programs."""
    kind = type(exc)
    details = getattr(exc, "details", None) if isinstance(exc, Violation) else None
    return RankResult(
        rank=rank,
        ok=False,
        error=prefix + "".join(traceback.format_exception(exc)),
        error_type=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc),
        reason=exc.reason if isinstance(exc, Violation) and not prefix else None,
        details=_plain(details) if details else None,
        expect_rows=tuple(exc.expect_rows) if isinstance(exc, Violation) and not prefix else (),
    )


def _plain(details: dict[str, object]) -> dict[str, object]:
    """Details that survive the trip back: each value as it is if it pickles, else its repr."""
    out: dict[str, object] = {}
    for key, value in details.items():
        try:
            pickle.dumps(value)
            out[key] = value
        except Exception:
            out[key] = repr(value)
    return out
