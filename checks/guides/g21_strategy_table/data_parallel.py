"""The data-parallel rows: DDP, torch's and the reference ZeRO-1, ZeRO-2, SHARD_GRAD_OP, ZeRO-3, FULL_SHARD and
FSDP2 on mini_gpt tiny, each steady step's collectives and ring bytes against `checks.models.cost`, the bytes each
rank holds by category against `checks.models.zero_memory`, and the guide's ``data-parallel-rows`` mapping."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from functools import partial
from typing import Any

from checks.expected import Expected
from checks.guides.g21_strategy_table.ratios import ratio
from checks.models.cost import Plan, collectives
from checks.models.zero_memory import per_rank
from checks.probes.comm import CommLog, record_comm
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.data_parallel import CATEGORIES, Trained, build, held_bytes
from checks.workloads.gpt import batch, parameters_of_tiny

# The cost model's name for each implementation guide 13 builds (its FSDP2 keeps the default reshard_after_forward).
COST_NAME = {"fsdp2": "fsdp2-default"}
PHASES = ("forward", "backward", "step")
SHARE_TOLERANCE = Fraction(1, 50)  # a category is "1/N" within 2% of DDP's bytes / N (padding, step scalars, greedy)
SHARED = ("params", "grads", "optim")  # the categories a row's memory names


def _steady_step(trained: Trained, ctx: RankContext, warmup: int = 2) -> dict[str, CommLog]:
    """``warmup`` steps (DDP's bucket rebuild happens in the second forward), then one step recorded phase by
    phase: the collectives of its forward, its backward and its optimizer step."""
    for step in range(warmup):
        _, loss = trained.forward(*batch(ctx, step=step))
        loss.backward()
        trained.step_fn()
        trained.zero_grad_fn()
    logs: dict[str, CommLog] = {}
    with record_comm() as logs["forward"]:
        _, loss = trained.forward(*batch(ctx, step=warmup))
    with record_comm() as logs["backward"]:
        loss.backward()
    with record_comm() as logs["step"]:
        trained.step_fn()
    return logs


def _phase_counts(logs: dict[str, CommLog]) -> list[tuple[str, str, int, int]]:
    """(phase, op, count, elements) in phase order, ops in first-seen order."""
    out = []
    for phase in PHASES:
        totals: dict[str, list[int]] = {}
        for c in logs[phase]:
            entry = totals.setdefault(c.op, [0, 0])
            entry[0] += 1
            entry[1] += c.numel
        out += [(phase, op, count, numel) for op, (count, numel) in totals.items()]
    return out


def _model_counts(impl: str, world_size: int) -> tuple[Counter[tuple[str, bool]], Counter[tuple[str, bool]], Fraction]:
    """The cost model's step for ``impl`` on mini_gpt tiny: counts and elements per (op, in backward), ring bytes."""
    volume = collectives(Plan(tuple(parameters_of_tiny()), world_size, COST_NAME.get(impl, impl)))
    counts: Counter[tuple[str, bool]] = Counter()
    numels: Counter[tuple[str, bool]] = Counter()
    for o in volume.ops:
        counts[(o.op, o.backward)] += 1
        numels[(o.op, o.backward)] += o.numel
    return counts, numels, volume.ring


def _observed_counts(logs: dict[str, CommLog]) -> tuple[Counter[tuple[str, bool]], Counter[tuple[str, bool]]]:
    counts: Counter[tuple[str, bool]] = Counter()
    numels: Counter[tuple[str, bool]] = Counter()
    for phase, log in logs.items():
        for c in log:
            counts[(c.op, phase == "backward")] += 1
            numels[(c.op, phase == "backward")] += c.numel
    return counts, numels


def _comm_values(impl: str, counts: list[tuple[str, str, int, int]], of_ddp: Fraction) -> dict[str, str]:
    """A row per phase that communicates (its ops and counts), then the ring bytes as a multiple of DDP's:
    short rows, so each fits the 78 cells a reader's terminal shows."""
    values = {}
    for phase in PHASES:
        parts = [f"{count} {op.replace('_', '-')}{'s' if count > 1 else ''}"
                 for p, op, count, _ in counts if p == phase]  # fmt: skip
        if parts:
            values[f"{impl} {phase}"] = ", ".join(parts)
    return values | {f"{impl} ring bytes": f"{ratio(of_ddp)} × DDP's"}


def _share(held: int, ddp: int, world_size: int) -> str:
    """``whole`` or ``1/N`` for a category, against DDP's bytes of it (see `SHARE_TOLERANCE`)."""
    share = Fraction(held, ddp)
    if abs(share - 1) <= SHARE_TOLERANCE:
        return "whole"
    if abs(share * world_size - 1) <= SHARE_TOLERANCE:
        return "1/N"
    return f"{float(share):.3f}"


def data_parallel_row(ctx: RankContext, impls: list[str], expected: Expected) -> dict[str, Any]:
    """Each implementation (guide 13's, on mini_gpt tiny) runs a steady step: its collectives per phase are the
    cost model's (count and elements per op, forward / backward / step), its ring-model bytes per rank the model's
    exactly, and what each rank holds after it is `zero_memory`'s, by category, exactly. The guide's rows
    (``expected``, ``<impl> <phase>: <ops>``) say it shorter: the collectives per phase, their ring bytes as a
    multiple of DDP's, and which categories each rank holds whole or 1/N. A model comparison that fails names the
    implementation's rows the same step makes false."""
    n = ctx.world_size
    params = parameters_of_tiny()
    ddp_ring = _model_counts("ddp", n)[2]
    ddp_memory = per_rank("ddp", params, n, ctx.rank).by_category()
    observed: dict[str, str] = {}
    report: dict[str, Any] = {}
    for impl in impls:
        trained = build(impl, ctx)
        logs = _steady_step(trained, ctx)
        ring = Fraction(sum(sum(Fraction(c.ring_bytes) for c in log) for log in logs.values()))
        held = held_bytes(trained)
        got_memory = {c: held[c] for c in CATEGORIES}
        counts = _phase_counts(logs)
        values = _comm_values(impl, counts, ring / ddp_ring)
        values[f"{impl} memory"] = ", ".join(f"{c} {_share(got_memory[c], ddp_memory[c], n)}" for c in SHARED)
        rows = {f"{impl} {what}" for what in (*PHASES, "ring bytes", "memory")}  # the keys of this impl's rows
        with expected.naming_false_rows(partial(expected.differing_values, values, keys=rows)):
            _require_model(impl, logs, ring, got_memory, ctx)
        observed |= values
        report[impl] = {"ring_bytes": float(ring), "of_ddp": ratio(ring / ddp_ring), "memory": got_memory,
                        "memory_of_ddp": float(Fraction(sum(got_memory.values()), sum(ddp_memory.values()))),
                        "collectives": counts}  # fmt: skip
        del trained
    expected.require_values(observed, reason="row-differs-from-guide", what="the row's lines")
    return {"lines": [f"{key}: {value}" for key, value in observed.items()], "impls": report}


def _require_model(impl: str, logs: dict[str, CommLog], ring: Fraction, got_memory: dict[str, int],
                   ctx: RankContext) -> None:  # fmt: skip
    """``impl``'s step against the cost and memory models: collectives and elements per (op, in backward), ring
    bytes per rank, bytes held by category on this rank."""
    want_counts, want_numels, want_ring = _model_counts(impl, ctx.world_size)
    got_counts, got_numels = _observed_counts(logs)
    require_equal(dict(got_counts), dict(want_counts), reason="collectives-differ-from-model",
                  what=f"{impl}: collectives per (op, in backward)", impl=impl)  # fmt: skip
    require_equal(dict(got_numels), dict(want_numels), reason="elements-differ-from-model",
                  what=f"{impl}: elements per (op, in backward)", impl=impl)  # fmt: skip
    require_equal(ring, want_ring, reason="ring-bytes-differ-from-model", what=f"{impl}: ring bytes per rank",
                  impl=impl)  # fmt: skip
    want_memory = per_rank(impl, parameters_of_tiny(), ctx.world_size, ctx.rank).by_category()
    require_equal(got_memory, want_memory, reason="memory-differs-from-model",
                  what=f"{impl}: bytes by category on rank {ctx.rank}", impl=impl)  # fmt: skip
