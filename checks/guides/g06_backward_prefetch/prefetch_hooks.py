"""Which hook prefetches what, and when: BACKWARD_PRE from the pre-backward hook, before the issuer's gradient
computation; BACKWARD_POST from the post-backward hook, after the issuer's free and before its reduce-scatter,
with what the record offers each issuer; None, nothing at all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from checks.expected import Expected, Row
from checks.guides.g06_backward_prefetch.backward_runs import (
    POST_FORWARD,
    build,
    handle_names,
    loss_of,
    model_prefetches,
)
from checks.naming import ROOT
from checks.probes import calls
from checks.probes.compute_marks import ComputeMarks
from checks.probes.event_log import EventLog
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import units

_EOU = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


@contextmanager
def asked_candidates(model: nn.Module) -> Iterator[list[list[str]]]:
    """Every ``get_handle_to_backward_prefetch`` call in the block as ``[issuer, candidate, verdict]``: the
    candidate is ``-`` when the record has none; the verdict is what ``_get_handle_to_prefetch`` then decides
    from the candidate's flags (``taken``, ``unsharded already`` when its pre-backward hook already ran,
    ``prefetched already``)."""
    names = handle_names(model)
    asked: list[list[str]] = []
    code = calls.function_code(f"{_EOU}.get_handle_to_backward_prefetch")

    def on_call(frame: Any) -> calls.ReturnHook:
        issuer = names[id(frame.f_locals["current_handle"])]

        def on_return(frame: Any, candidate: Any) -> None:
            if candidate is None:
                asked.append([issuer, "-", "no candidate"])
                return
            if not candidate._needs_pre_backward_unshard:
                verdict = "unsharded already"
            elif candidate._prefetched:
                verdict = "prefetched already"
            else:
                verdict = "taken"
            asked.append([issuer, names[id(candidate)], verdict])

        return on_return

    with calls.subscribed({code: on_call}) as subscription:
        yield asked
    if subscription.errors:
        raise RuntimeError(f"the candidate recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def _arrow(row: Row) -> str:
    """A pairs row as the recorder names a prefetch: ``root → blocks.2`` is ``root→blocks.2``."""
    return f"{row.key}→{row.value}"


def _stated_against_model(expected: Expected, mode: str) -> list[str]:
    modelled = model_prefetches(POST_FORWARD["gpt"], mode)
    what = f"the {mode} prefetches the rule model gives, against the guide's"
    expected.require_rows(modelled, reason="order-differs-from-guide", what=what, text=_arrow)
    return modelled


def _first(events: EventLog, kind: str, unit: str) -> int:
    """The clock tick of ``unit``'s first ``kind`` event. A missing event is a violation, never a tick of 0: an
    order such as "free before prefetch" would otherwise hold with no free at all."""
    found = [e.seq for e in events.select(kind, unit=unit)]
    require(bool(found), "missing-event", f"{unit} has no {kind} event in this backward", kind=kind, unit=unit)
    return found[0]


def _own_unshards(events: EventLog) -> list[str]:
    """Units unsharded in backward by their own pre-backward hook, with whether an all-gather ran."""
    return [f"{e.unit} ({e.detail})" for e in events.select("unshard")]


def backward_pre_prefetches(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Under BACKWARD_PRE each unit's pre-backward hook prefetches the unit before it in post-forward order:
    every prefetch lies between the issuer's pre-backward event and the start of its gradient computation (so
    before its post-backward too); the prefetches are the guide's, which the rule model also gives; and every
    block arrives prefetched, so only the root (still allocated from forward) is unsharded by its own hook."""
    _stated_against_model(expected, "BACKWARD_PRE")
    model = build(ctx, "gpt", "BACKWARD_PRE")
    marks = ComputeMarks(units(model))
    loss = loss_of(ctx, "gpt", model)
    with record_events(model) as events:
        loss.backward()
    windows = []
    for e in events.select("prefetch"):
        pre, compute, post = (
            _first(events, "pre_backward", e.unit),
            marks.seq.get(e.unit, 0),
            _first(events, "post_backward", e.unit),
        )
        window = {"issuer": e.unit, "target": e.target, "pre_backward": pre, "prefetch": e.seq, "compute": compute,
                  "post_backward": post}  # fmt: skip
        require(
            pre < e.seq, "outside-pre-backward-hook", f"{e.describe()} came before {e.unit}'s pre-backward", **window
        )
        message = f"{e.describe()} was issued after {e.unit}'s gradient computation had started"
        require(e.seq < compute and e.seq < post, "prefetch-after-compute", message, **window)
        require(e.seq < _first(events, "pre_backward", e.target or ""), "prefetch-after-need", e.describe(), **window)
        windows.append(window)
    observed = [f"{e.unit}→{e.target}" for e in events.select("prefetch")]
    expected.require_rows(observed, reason="prefetch-order", what="BACKWARD_PRE prefetches", text=_arrow)
    own = _own_unshards(events)
    require_equal(own, [f"{ROOT} (no all-gather)"], reason="unsharded-again", what="units unsharded by their own hook")
    return {"prefetches": observed, "own_unshards": own, "windows": windows}


def backward_post_prefetches(ctx: RankContext, prefetches: Expected, candidates: Expected) -> dict[str, Any]:
    """Under BACKWARD_POST each unit's post-backward hook frees the unit's parameters and then prefetches the unit
    before it in post-forward order, before the unit's gradient is reduced; the prefetches are the guide's (and
    the rule model's); and what the record offers each issuer is the guide's candidate table: blocks.0 has no
    candidate, the root's candidate blocks.2 was unsharded by its own pre-backward hook already."""
    _stated_against_model(prefetches, "BACKWARD_POST")
    model = build(ctx, "gpt", "BACKWARD_POST")
    loss = loss_of(ctx, "gpt", model)
    with record_events(model) as events, asked_candidates(model) as asked:
        loss.backward()
    for e in events.select("prefetch"):
        post, free, reduce = (_first(events, kind, e.unit) for kind in ("post_backward", "free", "reduce_grad"))
        window = {"issuer": e.unit, "target": e.target, "post_backward": post, "free": free, "prefetch": e.seq,
                  "reduce_grad": reduce}  # fmt: skip
        message = f"{e.describe()} is not inside {e.unit}'s post-backward hook"
        require(post < e.seq < reduce, "outside-post-backward-hook", message, **window)
        message = f"{e.describe()} was issued before {e.unit} freed its own unsharded parameters"
        require(free < e.seq, "prefetch-before-free", message, **window)
    observed = [f"{e.unit}→{e.target}" for e in events.select("prefetch")]
    prefetches.require_rows(observed, reason="prefetch-order", what="BACKWARD_POST prefetches", text=_arrow)
    # One row per call, in call order: a call is false on the row at its place (the last row, past the end).
    stated = [list(row.cells) for row in candidates]
    off = [row for row, got in zip(candidates, asked, strict=False) if got != list(row.cells)] or candidates.rows[-1:]
    message = f"what the record offered each issuer: {asked!r}, expected {stated!r}"
    candidates.require(asked == stated, off, "candidates-differ", message, observed=asked, expected=stated)
    targets = {e.target for e in events.select("prefetch")}
    never = [unit for unit in POST_FORWARD["gpt"][:-1] if unit not in targets]
    own = _own_unshards(events)
    return {"prefetches": observed, "candidates": asked, "never_prefetched": ", ".join(never), "own_unshards": own}


def none_prefetches_nothing(ctx: RankContext) -> dict[str, Any]:
    """With ``backward_prefetch=None`` a backward issues no prefetch and never asks the record for a candidate:
    every block is all-gathered by its own pre-backward hook. The same model under BACKWARD_PRE does prefetch, so
    the absence is the setting's."""
    control = build(ctx, "gpt", "BACKWARD_PRE")
    loss = loss_of(ctx, "gpt", control)
    with record_events(control) as events:
        loss.backward()
    require(events.select("prefetch"), "never-prefetched", "BACKWARD_PRE did not prefetch either: nothing is live")
    model = build(ctx, "gpt", None)
    loss = loss_of(ctx, "gpt", model)
    with record_events(model) as events, asked_candidates(model) as asked:
        loss.backward()
    prefetches = [f"{e.unit}→{e.target}" for e in events.select("prefetch")]
    require_equal(prefetches, [], reason="prefetched-with-none", what="prefetches with backward_prefetch=None")
    require_equal(asked, [], reason="asked-for-candidate", what="candidates asked for with backward_prefetch=None")
    reverse = [ROOT, *reversed(POST_FORWARD["gpt"][:-1])]
    expected = [f"{unit} ({'no all-gather' if unit == ROOT else 'all-gather'})" for unit in reverse]
    own = _own_unshards(events)
    require_equal(own, expected, reason="not-unsharded-by-own-hook", what="units unsharded by their own hook")
    return {"prefetches": prefetches, "own_unshards": own}
