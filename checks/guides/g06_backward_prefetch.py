"""Checks for guide 06, backward prefetch: which unit each backward hook unshards ahead of time, and when.

Expected orders come from the guide's expect blocks and from the torch-free rule model
(`checks.models.prefetch`: `backward_sequence`, `post_forward_record`, `backward_sequence_of_uses`), fed the
post-forward order the model's structure implies, never the order torch recorded. Sizes come from the
flat-parameter model (`checks.workloads.gpt.padded_sizes`).

A unit's backward *compute* is marked by `checks.probes.compute_marks.ComputeMarks`: right after FSDP's
pre-backward hook, before autograd computes the unit's gradients.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch

from checks.breakit.exercises import Exercise
from checks.breakit.patches import returning, wrapping
from checks.models.prefetch import backward_sequence, backward_sequence_of_uses, post_forward_record
from checks.models.unit_counts import unit_counts
from checks.naming import ROOT
from checks.probes import EventLog, assert_sequence, record_comm, record_events
from checks.probes.compute_marks import ComputeMarks
from checks.probes.memory_series import record_memory_series
from checks.ranks import tracing
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import Violation, require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import batch, fsdp1_gpt, padded_sizes, units
from checks.workloads.reorderable import ReorderableGPT

MODES: tuple[str | None, ...] = ("BACKWARD_PRE", "BACKWARD_POST", None)
# Post-forward order implied by each workload's structure: the blocks (or the toy's children) in forward order, the
# root, whose forward ends last and whose own layers produce the output, last.
POST_FORWARD = {"gpt": ("blocks.0", "blocks.1", "blocks.2", ROOT), "toy": ("0", "1", ROOT)}
HOOK_KINDS = ("pre_backward", "post_backward", "prefetch")
_EOU = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


def label(mode: str | None) -> str:
    return mode or "None"


def _policy(mode: str | None) -> BackwardPrefetch | None:
    return BackwardPrefetch[mode] if mode else None


def _build(ctx: RankContext, workload: str, mode: str | None, **kwargs: Any) -> nn.Module:
    if workload == "gpt":
        return fsdp1_gpt(ctx, backward_prefetch=_policy(mode), **kwargs)
    return toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, backward_prefetch=mode, **kwargs)


def _loss(ctx: RankContext, workload: str, model: nn.Module) -> torch.Tensor:
    if workload == "gpt":
        return model(*batch(ctx))[1]
    return model(toy.toy_batch(ctx)).sum()


def _handle_names(model: nn.Module) -> dict[int, str]:
    return {id(unit._handle): name for name, unit in units(model).items() if unit._handle is not None}


def recorded_post_forward(model: nn.Module) -> tuple[list[str], dict[str, int | None]]:
    """Torch's post-forward record now: the root's ``handles_post_forward_order`` as unit names, and each unit's
    ``_post_forward_index``."""
    names = _handle_names(model)
    eod = model._exec_order_data
    order = [names[id(handle)] for handle in eod.handles_post_forward_order]
    index = {names[id(handle)]: handle._post_forward_index for handle in eod.all_handles}
    return order, index


@contextmanager
def asked_candidates(model: nn.Module) -> Iterator[list[list[str]]]:
    """Every ``get_handle_to_backward_prefetch`` call in the block as ``[issuer, candidate, verdict]``: the
    candidate is ``-`` when the record has none; the verdict is what ``_get_handle_to_prefetch`` then decides
    from the candidate's flags (``taken``, ``unsharded already`` when its pre-backward hook already ran,
    ``prefetched already``)."""
    names = _handle_names(model)
    asked: list[list[str]] = []
    (code,) = code_objects(f"{_EOU}.get_handle_to_backward_prefetch")

    def on_call(frame: Any) -> tracing.ReturnHook:
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

    with tracing.subscribed({code: on_call}) as subscription:
        yield asked
    if subscription.errors:
        raise RuntimeError(f"the candidate recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def hook_sequence(events: EventLog) -> list[str]:
    return [e.describe() for e in events if e.kind in HOOK_KINDS]


def _pairs(lines: list[str]) -> list[str]:
    """``root → blocks.2`` lines (any spacing) as ``root→blocks.2``."""
    return ["".join(line.split()) for line in lines]


def _model_prefetches(post_forward: tuple[str, ...], mode: str | None) -> list[str]:
    return [
        line.removeprefix("prefetch ") for line in backward_sequence(post_forward, mode) if line.startswith("prefetch")
    ]


def _stated_against_model(stated: list[str], post_forward: tuple[str, ...], mode: str) -> list[str]:
    expected = _model_prefetches(post_forward, mode)
    what = f"the {mode} prefetches the rule model gives, against the guide's"
    require_equal(_pairs(stated), expected, reason="order-differs-from-guide", what=what)
    return expected


def _first(events: EventLog, kind: str, unit: str) -> int:
    """The clock tick of ``unit``'s first ``kind`` event. A missing event is a violation, never a tick of 0: an
    order such as "free before prefetch" would otherwise hold with no free at all."""
    found = [e.seq for e in events.select(kind, unit=unit)]
    require(bool(found), "missing-event", f"{unit} has no {kind} event in this backward", kind=kind, unit=unit)
    return found[0]


def _own_unshards(events: EventLog) -> list[str]:
    """Units unsharded in backward by their own pre-backward hook, with whether an all-gather ran."""
    return [f"{e.unit} ({e.detail})" for e in events.select("unshard")]


def backward_pre_prefetches(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """Under BACKWARD_PRE each unit's pre-backward hook prefetches the unit before it in post-forward order:
    every prefetch lies between the issuer's pre-backward event and the start of its gradient computation (so
    before its post-backward too); the prefetches are the guide's, which the rule model also gives; and every
    block arrives prefetched, so only the root (still allocated from forward) is unsharded by its own hook."""
    expected = _stated_against_model(stated, POST_FORWARD["gpt"], "BACKWARD_PRE")
    model = _build(ctx, "gpt", "BACKWARD_PRE")
    marks = ComputeMarks(units(model))
    loss = _loss(ctx, "gpt", model)
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
    assert_sequence(observed, expected, what="BACKWARD_PRE prefetches", reason="prefetch-order")
    own = _own_unshards(events)
    require_equal(own, [f"{ROOT} (no all-gather)"], reason="unsharded-again", what="units unsharded by their own hook")
    return {"prefetches": observed, "own_unshards": own, "windows": windows}


def backward_post_prefetches(ctx: RankContext, stated: list[str], candidates: list[str]) -> dict[str, Any]:
    """Under BACKWARD_POST each unit's post-backward hook frees the unit's parameters and then prefetches the unit
    before it in post-forward order, before the unit's gradient is reduced; the prefetches are the guide's (and
    the rule model's); and what the record offers each issuer is the guide's candidate table: blocks.0 has no
    candidate, the root's candidate blocks.2 was unsharded by its own pre-backward hook already."""
    expected = _stated_against_model(stated, POST_FORWARD["gpt"], "BACKWARD_POST")
    model = _build(ctx, "gpt", "BACKWARD_POST")
    loss = _loss(ctx, "gpt", model)
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
    assert_sequence(observed, expected, what="BACKWARD_POST prefetches", reason="prefetch-order")
    stated_table = [line.split(maxsplit=2) for line in candidates]
    require_equal(asked, stated_table, reason="candidates-differ", what="what the record offered each issuer")
    targets = {e.target for e in events.select("prefetch")}
    never = [unit for unit in POST_FORWARD["gpt"][:-1] if unit not in targets]
    own = _own_unshards(events)
    return {"prefetches": observed, "candidates": asked, "never_prefetched": ", ".join(never), "own_unshards": own}


def none_prefetches_nothing(ctx: RankContext) -> dict[str, Any]:
    """With ``backward_prefetch=None`` a backward issues no prefetch and never asks the record for a candidate:
    every block is all-gathered by its own pre-backward hook. The same model under BACKWARD_PRE does prefetch, so
    the absence is the setting's."""
    control = _build(ctx, "gpt", "BACKWARD_PRE")
    loss = _loss(ctx, "gpt", control)
    with record_events(control) as events:
        loss.backward()
    require(events.select("prefetch"), "never-prefetched", "BACKWARD_PRE did not prefetch either: nothing is live")
    model = _build(ctx, "gpt", None)
    loss = _loss(ctx, "gpt", model)
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


def model_predicts_backward(ctx: RankContext, workload: str) -> dict[str, dict[str, list[str]]]:
    """For each mode, the backward's pre_backward / post_backward / prefetch sequence equals what the rule model
    (`backward_sequence`) predicts from the workload's structural post-forward order; torch's own record of that
    order is checked first, so the model's input is right."""
    post_forward = POST_FORWARD[workload]
    out = {}
    for mode in MODES:
        model = _build(ctx, workload, mode)
        loss = _loss(ctx, workload, model)
        order, _ = recorded_post_forward(model)
        what = f"{workload} {label(mode)}: torch's post-forward record"
        require_equal(order, list(post_forward), reason="post-forward-order", what=what, mode=label(mode))
        with record_events(model) as events:
            loss.backward()
        observed = hook_sequence(events)
        expected = backward_sequence(post_forward, mode)
        what = f"{workload} {label(mode)}: backward hooks and prefetches"
        try:
            assert_sequence(observed, expected, what=what, reason="sequence-differs")
        except Violation as failure:
            failure.details["mode"] = label(mode)
            raise
        out[label(mode)] = {"sequence": observed, "prefetches": [e.removeprefix("prefetch ") for e in observed
                                                                 if e.startswith("prefetch")]}  # fmt: skip
    return out


def _table(lines: list[str]) -> tuple[list[str], dict[str, dict[str, int]]]:
    """An expect table: a header ``moment MODE MODE ...``, then rows ``<two-word moment> n n ...``."""
    header = lines[0].split()[1:]
    rows: dict[str, dict[str, int]] = {}
    for line in lines[1:]:
        words = line.split()
        rows[" ".join(words[:2])] = dict(zip(header, (int(w) for w in words[2:]), strict=True))
    return header, rows


def units_alive(ctx: RankContext, stated: list[str], peaks: list[str]) -> dict[str, Any]:
    """Unsharded units alive at each unit's backward compute start and after each post-backward hook, by mode: the
    bytes of the ``unsharded`` category over the layout model's padded unit sizes must be whole units, as many as
    the guide's table says; the peak bytes are the guide's."""
    header, table = _table(stated)
    stated_peaks = {line.split()[0]: int(line.split()[1]) for line in peaks}
    sizes = {unit: 4 * numel for unit, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    observed: dict[str, Any] = {}
    series: dict[str, Any] = {}
    for mode in MODES:
        model = _build(ctx, "gpt", mode)
        marks = ComputeMarks(units(model))
        x, y = batch(ctx)
        with record_memory_series(model) as recorder:
            marks.on_mark = lambda unit, recorder=recorder: recorder.mark(f"compute {unit}")
            _, loss = model(x, y)
            loss.backward()
        points = [(m.replace("backward ", "post-backward ", 1), b["unsharded"])
                  for m, b in recorder.series.points if not m.startswith("forward ")]  # fmt: skip
        counts = {}
        for moment, nbytes in points:
            found = unit_counts(nbytes, sizes)
            message = f"{label(mode)} at {moment}: {nbytes} unsharded bytes are not a whole number of units {sizes}"
            require(len(found) == 1, "not-whole-units", message, moment=moment, nbytes=nbytes, mode=label(mode))
            counts[moment] = found.pop()
        moments = list(table)
        require_equal(list(counts), moments, reason="moments-differ", what=f"{label(mode)}: moments measured")
        want = {moment: table[moment][label(mode)] for moment in moments}
        require_equal(counts, want, reason="units-alive", what=f"{label(mode)}: units alive", mode=label(mode))
        peak = max(nbytes for _, nbytes in points)
        what = f"{label(mode)}: peak unsharded bytes"
        require_equal(peak, stated_peaks[label(mode)], reason="peak-bytes", what=what, mode=label(mode))
        observed[label(mode)] = {**counts, "peak bytes": peak}
        series[label(mode)] = recorder.series.points  # `fsdp-readings memory 06-backward-prefetch units-alive`
    require_equal(header, [label(m) for m in MODES], reason="table-header", what="the table's modes")
    return {**observed, "series": series}


def collective_order(ctx: RankContext, stated: list[str]) -> dict[str, str]:
    """The order in which one backward issues its all-gathers (AG) and reduce-scatters (RS), by mode, is the
    guide's."""
    want = {line.split()[0]: " ".join(line.split()[1:]) for line in stated}
    observed = {}
    for mode in MODES:
        model = _build(ctx, "gpt", mode)
        loss = _loss(ctx, "gpt", model)
        with record_comm() as comm:
            loss.backward()
        short = {"all_gather": "AG", "reduce_scatter": "RS"}
        got = " ".join(short[c.op] for c in comm if c.op in short)
        what = f"{label(mode)}: collectives in issue order"
        require_equal(got, want[label(mode)], reason="collective-order", what=what, mode=label(mode))
        observed[label(mode)] = got
    return observed


REUSE_ORDERS = {"first unit reused": [0, 1, 0, 2], "another unit reused": [0, 1, 2, 1]}


def first_unit_reused(ctx: RankContext) -> dict[str, Any]:
    """A forward that runs a block twice: torch's post-forward record and indices are `post_forward_record`'s,
    where the unit at index 0 takes the index of its second use and any other unit keeps its first; each mode's
    backward is `backward_sequence_of_uses`'s. With blocks 0, 1, 0, 2 under BACKWARD_PRE that differs from what
    an ``is not None`` test would give: blocks.0 prefetches blocks.1."""
    out: dict[str, Any] = {}
    for scenario, blocks in REUSE_ORDERS.items():
        uses = [*(f"blocks.{i}" for i in blocks), ROOT]
        record, index = post_forward_record(uses)
        for mode in MODES:
            model = fsdp1_gpt(ctx, backward_prefetch=_policy(mode), model_class=ReorderableGPT)
            model._fsdp_wrapped_module.blocks.order = blocks
            _, loss = model(*batch(ctx))
            got_record, got_index = recorded_post_forward(model)
            where = {"scenario": scenario, "mode": label(mode)}
            require_equal(
                {"record": got_record, "index": got_index}, {"record": record, "index": index},
                reason="record-differs", what=f"{scenario}: torch's post-forward record", **where,
            )  # fmt: skip
            with record_events(model) as events:
                loss.backward()
            observed = hook_sequence(events)
            try:
                assert_sequence(
                    observed, backward_sequence_of_uses(uses, mode), what=scenario, reason="sequence-differs"
                )
            except Violation as failure:
                failure.details.update(where)
                raise
            first_use_rule = backward_sequence_of_uses(uses, mode, zero_is_falsy=False)
            prefetches = [e.removeprefix("prefetch ") for e in observed if e.startswith("prefetch")]
            out[f"{scenario} {label(mode)}"] = {"prefetches": prefetches, "as_is_not_none": observed != first_use_rule}
        out[scenario] = {"record": record, "index": index}
    differs = out[f"first unit reused {label('BACKWARD_PRE')}"]["as_is_not_none"]
    require(differs, "quirk-not-visible", "blocks 0, 1, 0, 2 under BACKWARD_PRE behave as an `is not None` test would")
    return out


def eval_record_grows(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """Forwards in eval under no_grad, with no backward: every forward appends each unit to
    ``handles_post_forward_order`` again, so its length after k forwards is the guide's (4k), as
    `post_forward_record` gives for k forwards without a reset. A training step then clears it at the final
    callback, and its backward prefetches as usual."""
    lengths_stated = {line.split()[0]: int(line.split()[1]) for line in stated}
    forwards = max(int(k) for k in lengths_stated)
    model = fsdp1_gpt(ctx)
    model.eval()
    lengths: dict[str, int] = {}
    with torch.no_grad():
        for k in range(1, forwards + 1):
            model(batch(ctx, step=k)[0])
            order, index = recorded_post_forward(model)
            record, want_index = post_forward_record(list(POST_FORWARD["gpt"]) * k)
            require_equal(len(order), len(record), reason="record-length", what=f"the record after {k} forwards")
            require_equal(index, want_index, reason="index-differs", what=f"the indices after {k} forwards")
            lengths[str(k)] = len(order)
    require_equal(lengths, lengths_stated, reason="record-length", what="the record's length by forwards, vs the guide")
    indices_after_eval = recorded_post_forward(model)[1]
    model.train()
    _, loss = model(*batch(ctx))
    with record_events(model) as events:
        loss.backward()
    after = len(model._exec_order_data.handles_post_forward_order)
    require_equal(after, 0, reason="not-cleared", what="the record's length after a training step")
    prefetches = [f"{e.unit}→{e.target}" for e in events.select("prefetch")]
    expected = _model_prefetches(POST_FORWARD["gpt"], "BACKWARD_PRE")
    require_equal(prefetches, expected, reason="prefetch-order", what="the training step's prefetches after eval")
    return {"lengths": lengths, "indices": indices_after_eval, "after_training_step": after, "prefetches": prefetches}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------

_HELD: list[tuple[Any, Any, Any, Any]] = []


def hold_pre_backward_prefetch(original: Any, state: Any, current_handle: Any, prefetch_mode: Any) -> Any:
    """``_prefetch_handle`` that holds back the prefetch a pre-backward hook asks for; `issue_held_prefetch`
    issues it when the issuer's post-backward hook starts, after its gradient computation."""
    from torch.distributed.fsdp._common_utils import HandleTrainingState

    if current_handle and current_handle._training_state == HandleTrainingState.BACKWARD_PRE:
        _HELD.append((original, state, current_handle, prefetch_mode))
        return None
    return original(state, current_handle, prefetch_mode)


def issue_held_prefetch(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` that first issues the prefetch its unit's pre-backward hook held back (the unit is
    still in BACKWARD_PRE there), then runs as usual."""
    for held in [h for h in _HELD if h[2] is handle]:
        _HELD.remove(held)
        prefetch, unit_state, issuer, mode = held
        prefetch(unit_state, issuer, mode)
    return original(state, handle, *args)


def prefetch_two_back(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` with a limit of 2: the unit two before the issuer."""
    eod._backward_prefetch_limit = 2
    try:
        return original(eod, current_handle)
    finally:
        eod._backward_prefetch_limit = 1


def prefetch_forward_neighbour(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` that looks the wrong way: the unit *after* the issuer in post-forward
    order."""
    index = current_handle._post_forward_index
    order = eod.handles_post_forward_order
    return order[index + 1] if index is not None and index + 1 < len(order) else None


def prefetch_before_free(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that prefetches first and frees the unit's own parameters after."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._prefetch_handle(state, handle, ru._PrefetchMode.BACKWARD)
    ru._reshard(state, handle, ru._should_free_in_backward(state, handle))


def keep_then_prefetch(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that reshards without freeing, then prefetches: no free precedes the prefetch."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._reshard(state, handle, False)
    ru._prefetch_handle(state, handle, ru._PrefetchMode.BACKWARD)


def candidate_always_needed(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` whose candidate always counts as still needing its pre-backward
    unshard: under BACKWARD_POST the root's post-backward then unshards blocks.2 again at the end of backward."""
    candidate = original(eod, current_handle)
    if candidate is not None:
        candidate._needs_pre_backward_unshard = True
    return candidate


def wrap_around_to_last(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` that wraps around: the unit at index 0 reads the record as if it came
    after the last entry, so its candidate is the last unit recorded (the root)."""
    if current_handle._post_forward_index != 0:
        return original(eod, current_handle)
    current_handle._post_forward_index = len(eod.handles_post_forward_order)
    try:
        return original(eod, current_handle)
    finally:
        current_handle._post_forward_index = 0


def wrap_around_needed(original: Any, eod: Any, current_handle: Any) -> Any:
    """`wrap_around_to_last`, and the root it offers counts as still needing its unshard: blocks.0's hook prefetches
    the root, which is still unsharded from forward."""
    candidate = wrap_around_to_last(original, eod, current_handle)
    if candidate is not None and current_handle._post_forward_index == 0:
        candidate._needs_pre_backward_unshard = True
    return candidate


def reshard_without_prefetch(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that reshards and never prefetches."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._reshard(state, handle, ru._should_free_in_backward(state, handle))


def pre_even_with_none(original: Any, state: Any, backward_prefetch: Any, forward_prefetch: bool) -> Any:
    """``_init_prefetching_state`` that turns ``backward_prefetch=None`` into BACKWARD_PRE."""
    return original(state, backward_prefetch or BackwardPrefetch.BACKWARD_PRE, forward_prefetch)


def post_prefetch_after_reduce(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` whose prefetch is issued after the gradient's reduce-scatter instead of before."""
    from torch.distributed.fsdp import _runtime_utils as ru

    prefetch = ru._prefetch_handle
    ru._prefetch_handle = lambda *a, **k: None
    try:
        result = original(state, handle, *args)
    finally:
        ru._prefetch_handle = prefetch
    prefetch(state, handle, ru._PrefetchMode.BACKWARD)
    return result


def record_with_is_not_none(original: Any, eod: Any, handle: Any) -> None:
    """``record_post_forward`` with ``is not None`` for the truth test: index 0 counts as recorded."""
    if not handle:
        return
    if handle._post_forward_index is None:
        handle._post_forward_index = len(eod.handles_post_forward_order)
    eod.handles_post_forward_order.append(handle)


def record_first_use_only(original: Any, eod: Any, handle: Any) -> None:
    """``record_post_forward`` that does what its comment says: only a unit's first use is recorded."""
    if handle and handle._post_forward_index is not None:
        return
    original(eod, handle)


def next_iter_keeping_order(original: Any, eod: Any) -> None:
    """``next_iter`` that no longer clears the post-forward record."""
    kept = list(eod.handles_post_forward_order)
    original(eod)
    eod.handles_post_forward_order.extend(kept)


# -- exercises: recipes above as puzzles (fsdp-readings exercise 06-backward-prefetch) ---------------------------
_RU = "torch.distributed.fsdp._runtime_utils"

EXERCISES = (
    Exercise(
        "two-back",
        claim="pre-prefetches-reverse-post-forward",
        patches=(wrapping(f"{_EOU}.get_handle_to_backward_prefetch", prefetch_two_back),),
        puzzle="`get_handle_to_backward_prefetch` looks two units back in the post-forward record instead of one.",
        reason="prefetch-order",
    ),
    Exercise(
        "prefetch-then-free",
        claim="post-prefetches-after-free",
        patches=(wrapping(f"{_RU}:_post_backward_reshard", prefetch_before_free),),
        puzzle="`_post_backward_reshard` prefetches the next unit before it frees the current one.",
        reason="prefetch-before-free",
    ),
    Exercise(
        "no-candidates",
        claim="model-predicts-toy",
        patches=(returning(f"{_EOU}.get_handle_to_backward_prefetch", None),),
        puzzle="`get_handle_to_backward_prefetch` never finds a candidate. What does the rule model then miss?",
        reason="sequence-differs",
    ),
)
