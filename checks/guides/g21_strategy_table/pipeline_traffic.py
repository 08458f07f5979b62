"""Pipeline parallel, what a stage sends: a steady step's point-to-point messages against
`checks.models.pipeline`'s for the order the stage ran, each receive in time, the functions that communicate in
the first step only (the guide's ``pp-first-step`` list), and each stage's traffic as the ``pp-traffic-*`` blocks
say it."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from checks.expected import Expected
from checks.models import pipeline as pl
from checks.probes.comm import CommLog, record_comm
from checks.probes.stages import actions, record_stage_actions
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.pipeline_stages import ACTIVATION_NUMEL, Pipeline


def _transfer(c: Any) -> tuple[str, int, int, str]:
    return (c.op, c.peer, c.numel, c.dtype.removeprefix("torch."))


def _model_transfer(t: pl.Transfer) -> tuple[str, int, int, str]:
    return (t.direction, t.peer, t.numel, "float32")


def pp_transfers(ctx: RankContext, schedule: str, traffic: Expected, warmup_callers: Expected) -> dict[str, Any]:
    """Two steps of the schedule on a pipeline of one stage per rank. Step 2: every collective is a send or a
    receive, and they are the model's for this stage's recorded order, as a multiset (op, peer, elements, dtype):
    one activation of a microbatch sent forward per forward, one gradient sent back per backward; the k-th
    activation receive is issued before F k runs and the k-th gradient receive before B k. Step 1 also exchanges
    metadata: the functions that communicate in step 1 and not in step 2 are exactly ``warmup_callers`` (the
    guide's list for this torch). ``traffic``: the guide's rows, ``stage <s>: <messages>``; a model comparison
    that fails names this stage's row when the same step makes it false."""
    pipe = Pipeline(ctx, schedule)
    with record_comm() as first:
        pipe.step(0)
    with record_comm() as comm, record_stage_actions(label=f"{schedule} step 2") as stage_log:
        pipe.step(1)
    extra = sorted({c.caller.rsplit(":", 1)[-1] for c in first} - {c.caller.rsplit(":", 1)[-1] for c in comm})
    order = [pl.Action(a[0], int(a[1:])) for a in actions(stage_log)]
    counts = Counter((c.op, "activation" if _is_activation(c, ctx.rank) else "gradient") for c in comm)
    messages = "; ".join(_traffic_part(what, counts[("recv", what)], counts[("send", what)])
                        for what in ("activation", "gradient")
                        if counts[("recv", what)] or counts[("send", what)])  # fmt: skip
    messages += f"; {ACTIVATION_NUMEL} elements each"
    row = f"stage {ctx.rank}"

    def local_checks() -> None:
        _require_first_step_callers(warmup_callers, extra, ctx.rank)
        with traffic.naming_false_rows(partial(traffic.differing_values, {row: messages}, keys={row})):
            want = pl.step_transfers(order, ctx.rank, ctx.world_size, ACTIVATION_NUMEL)
            require_equal(
                Counter(_transfer(c) for c in comm),
                Counter(_model_transfer(t) for t in want),
                reason="transfers-differ-from-model",
                what=f"stage {ctx.rank}: (op, peer, elements, dtype) of step 2's point-to-point traffic",
                stage=ctx.rank,
            )
            _require_received_in_time(comm, stage_log, ctx.rank)

    ctx.agreed(local_checks)  # a stage's finding fails every rank, so none waits alone in the next collective
    observed = {f"stage {stage}": value for stage, value in enumerate(ctx.gather(messages))}
    traffic.require_values(observed, reason="transfers-differ-from-guide", what="every stage's traffic per step")
    return {"lines": [f"{key}: {value}" for key, value in observed.items()], "first_step_extra": extra,
            "sent_bytes": sum(c.nbytes for c in comm if c.op == "send"), "order": [str(a) for a in order]}  # fmt: skip


def _require_first_step_callers(warmup_callers: Expected, extra: list[str], stage: int) -> None:
    """The functions that communicate in step 1 only are the guide's, as a set: a failure names each row that
    no longer communicates only then."""
    stated = sorted(warmup_callers.texts)
    if extra != stated:
        gone = [row for row in warmup_callers if row.text not in extra]
        warmup_callers.fail(gone, "first-step-traffic-differs", f"stage {stage}: the callers that communicate in "
                            f"step 1 only: {extra!r}, expected {stated!r}", observed=extra, expected=stated,
                            stage=stage)  # fmt: skip


def _traffic_part(what: str, received: int, sent: int) -> str:
    """``4 activations in, 4 out``: how many of ``what`` a stage receives (in) and sends (out), zeros left out."""
    (n, way), *rest = [(n, way) for n, way in ((received, "in"), (sent, "out")) if n]
    return ", ".join([f"{n} {what}s {way}", *(f"{n} {way}" for n, way in rest)])


def _is_activation(c: Any, stage: int) -> bool:
    """An activation goes forward: sent to the next stage, received from the previous one."""
    return c.peer == stage + 1 if c.op == "send" else c.peer == stage - 1


def _require_received_in_time(comm: CommLog, stage_log: Any, stage: int) -> None:
    """The k-th activation received (gradient received) is issued before this stage's F k (B k) begins."""
    starts = {(e.kind, int(e.unit.removeprefix("microbatch "))): e.seq for e in stage_log.events}
    for what, kind in (("activation", "forward"), ("gradient", "backward")):
        recvs = [c for c in comm if c.op == "recv" and _is_activation(c, stage) == (what == "activation")]
        late = [k for k, c in enumerate(recvs) if c.seq > starts[(kind, k)]]
        require(not late, "received-too-late", f"stage {stage}: {what}s of microbatches {late} were received after "
                f"the {kind} that needs them began", stage=stage, microbatches=late)  # fmt: skip
