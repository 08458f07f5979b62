"""``reshard_after_forward`` and what each setting does and costs: which groups are resharded after forward (to
all ranks, to a smaller mesh, or not at all), the all-gathers of forward and backward, ``fully_shard``'s warning,
the bytes held between forward and backward, the unsharded peak and the ring-model bytes sent; on two ranks and,
for an int, on four."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from checks.expected import Expected, Row
from checks.guides.g18_fsdp2_reshard_and_gradients.units import BLOCKS, UNITS, groups, padded
from checks.models import fsdp2_reshard
from checks.models.fsdp2_prefetch import step_sequence
from checks.naming import ROOT
from checks.probes.comm import record_comm
from checks.probes.memory import account_memory, snapshot
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import batch, fsdp2_gpt

_LOGGER = "torch.distributed.fsdp.fully_shard"


def _setting(text: str) -> bool | int | None:
    """A setting as the guide's tables write it: ``True``, ``False``, ``None`` or an int."""
    if text.isdigit():
        return int(text)
    return {"True": True, "False": False, "None": None}[text]


@contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The warnings ``fully_shard`` logs inside the block. ``torch._logging.warning_once`` caches per process,
    so its cache is cleared first: a pool worker that saw the warning in an earlier check logs it again."""
    from torch._logging import warning_once

    warning_once.cache_clear()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    handler, logger = Keep(), logging.getLogger(_LOGGER)
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def _one_step(ctx: RankContext, setting: bool | int | None, *, peaks: bool = False) -> dict[str, Any]:
    """Build mini_gpt under ``setting`` (warnings logged meanwhile), run one forward and backward, and say what
    was where after forward and which all-gathers ran (unit, group size); with ``peaks``, also the most bytes of
    unsharded parameters alive at once over the step (torch's FSDP memory tracker, `account_memory`)."""
    with logged_warnings() as warned:
        model = fsdp2_gpt(ctx, setting)
    x, y = batch(ctx)
    with account_memory(model, peaks=peaks) as memory:
        step = _forward_backward(model, x, y)
    peak = memory.peak.peak.get("unsharded") if memory.peak is not None else None
    return {**step, "warnings": warned, "peak": peak}


def _forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Forward and backward, each under the collective recorder; between them, the memory snapshot, each group's
    sharded state and what the module holds as ``blocks.0.attn.qkv.weight``."""
    with record_comm() as forward:
        loss = model(x, y)[1]
    after = snapshot(model)
    states = {u: g._sharded_state.name for u, g in groups(model).items()}
    param = model.get_parameter("blocks.0.attn.qkv.weight")
    registered = {"type": type(param).__name__, "placements": [str(p) for p in getattr(param, "placements", ())],
                  "mesh": list(param.device_mesh.mesh.shape) if hasattr(param, "device_mesh") else []}  # fmt: skip
    with record_comm() as backward:
        loss.backward()
    gathers = {
        phase: [(c.numel, c.group_size) for c in log.select("all_gather")]
        for phase, log in (("forward", forward), ("backward", backward))
    }
    ring = {"forward": sum(c.ring_bytes for c in forward), "backward": sum(c.ring_bytes for c in backward)}
    return {"states": states, "all_gathers": gathers,
            "held": after.by_category["unsharded"], "ring": ring, "registered": registered}  # fmt: skip


def _state_name(size: int | None, world_size: int) -> str:
    return "UNSHARDED" if size is None else "SHARDED" if size == world_size else "SHARDED_POST_FORWARD"


def modelled_settings(setting: bool | int | None, world_size: int) -> dict[str, Any]:
    """What `checks.models.fsdp2_reshard` says one step under ``setting`` looks like."""
    sizes = {u: fsdp2_reshard.post_forward_world_size(setting, world_size, is_root=u == ROOT) for u in UNITS}
    gathers = fsdp2_reshard.all_gathers(UNITS, ROOT, setting, world_size)
    numel = padded(world_size)
    _, warns = fsdp2_reshard.resolve(setting, world_size)
    return {
        "states": {u: _state_name(s, world_size) for u, s in sizes.items()},
        "warned": warns,
        "all_gathers": {phase: [(numel[u], n) for u, n in pairs] for phase, pairs in gathers.items()},
    }


def _require_row(expected: Expected, row: Row, observed: dict[str, str], **where: Any) -> None:
    """A table row read from the run (header cell → cell) against the guide's row."""
    stated = expected.cells(row)
    expected.require(observed == stated, row, "table-differs", f"{row.key}: the run's row {observed!r}, the "
                     f"guide's {stated!r}", observed=observed, expected=stated, **where)  # fmt: skip


def reshard_settings(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Each setting of the guide's table: the groups' states after forward, the all-gathers of forward and of
    backward (unit sizes and group sizes), and the warning ``fully_shard`` logs, as the model says and as the
    table says."""
    out: dict[str, Any] = {}
    for row in expected:
        label = row.key
        setting = _setting(label)
        seen = _one_step(ctx, setting)
        want = modelled_settings(setting, ctx.world_size)
        where = {"setting": label}
        require_equal(seen["states"], want["states"], reason="states-differ", what=f"{label}: states after forward",
                      **where)  # fmt: skip
        require_equal(seen["all_gathers"], want["all_gathers"], reason="all-gathers-differ",
                      what=f"{label}: all-gathers (elements, group size)", **where)  # fmt: skip
        warned = any("reshard_after_forward=1" in w for w in seen["warnings"])
        require_equal(warned, want["warned"], reason="warning-differs", what=f"{label}: warning logged", **where)
        observed = {
            "setting": label,
            "root": seen["states"][ROOT],
            "blocks": "/".join(sorted({seen["states"][b] for b in BLOCKS})),
            **{phase: str(len(gathers)) for phase, gathers in seen["all_gathers"].items()},
            "warning": "warns" if warned else "silent",
        }
        _require_row(expected, row, observed, **where)
        out[label] = {"states": seen["states"], "backward_all_gathers": len(seen["all_gathers"]["backward"]),
                      "warnings": seen["warnings"]}  # fmt: skip
    return out


def reshard_cost(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Each setting's cost on this world size: the bytes of unsharded (or post-forward-resharded) parameters a
    rank holds between forward and backward; the most bytes of unsharded parameters alive at once over the step
    (guide 17's event sequence for the setting walked by `unsharded_peak`; an int k < N drops its unsharded
    parameters where True frees them, and what it keeps is in the held bytes); and the ring-model bytes it sends
    in forward, in backward and in all; against the model and the guide's table."""
    n, out = ctx.world_size, {}
    for row in expected:
        label = row.key
        setting = _setting(label)
        seen = _one_step(ctx, setting, peaks=True)
        held = fsdp2_reshard.held_after_forward(padded(n), ROOT, setting, n, element_bytes=4)
        ring = fsdp2_reshard.ring_step_bytes(padded(n), ROOT, setting, n, element_bytes=4)
        where = {"setting": label}
        require_equal(seen["held"], held, reason="held-differs", what=f"{label}: bytes held after forward", **where)
        observed_ring = {"forward": seen["ring"]["forward"], "backward": seen["ring"]["backward"]}
        require_equal(observed_ring, {k: ring[k] for k in ("forward", "backward")}, reason="ring-bytes-differ",
                      what=f"{label}: ring-model bytes per rank", **where)  # fmt: skip
        sequence = step_sequence(BLOCKS, ROOT, reshard_after_forward=setting, world_size=n)
        peak = fsdp2_reshard.unsharded_peak(sequence, padded(n), element_bytes=4)
        require_equal(seen["peak"], peak, reason="peak-differs", what=f"{label}: unsharded peak", **where)
        sent = {**observed_ring, "step": sum(observed_ring.values())}
        observed = {"setting": label, "held": f"{seen['held']:,}", **{k: f"{int(v):,}" for k, v in sent.items()},
                    "peak": f"{peak:,}"}  # fmt: skip
        _require_row(expected, row, observed, **where)
        out[label] = {"held": seen["held"], "peak": seen["peak"], "ring_step": int(sum(observed_ring.values())),
                      "states": seen["states"], "registered": seen["registered"],
                      "all_gathers": seen["all_gathers"]}  # fmt: skip
    # `fsdp-readings memory 18-...`: per setting, the unsharded bytes held after forward and at the step's peak.
    series = {label: [("held after forward", {"unsharded": seen["held"]}), ("peak of the step",
                                                                          {"unsharded": seen["peak"]})]
              for label, seen in out.items()}  # fmt: skip
    return {**out, "series": series}


def int_at_four(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``reshard_after_forward=2`` on four ranks: every group SHARDED_POST_FORWARD after forward, its registered
    parameters DTensors (Replicate(), Shard(0)) on a 2x2 mesh; backward all-gathers each unit over 2 ranks; the
    bytes held and sent are the model's and the table's (the costs of `reshard_cost`)."""
    out = reshard_cost(ctx, expected)
    for label, seen in out.items():
        if label == "series":  # the memory view's, not a setting
            continue
        setting = _setting(label)
        want = modelled_settings(setting, ctx.world_size)
        where = {"setting": label}
        require_equal(seen["states"], want["states"], reason="states-differ", what=f"{label}: states after forward",
                      **where)  # fmt: skip
        require_equal(seen["all_gathers"], want["all_gathers"], reason="all-gathers-differ",
                      what=f"{label}: all-gathers (elements, group size)", **where)  # fmt: skip
        if fsdp2_reshard.resolve(setting, ctx.world_size)[0] not in (True, False):
            k = int(setting)  # type: ignore[arg-type]
            registered = {"type": "DTensor", "placements": ["R", "S(0)"], "mesh": [ctx.world_size // k, k]}
            require_equal(seen["registered"], registered, reason="registered-differs",
                          what=f"{label}: blocks.0.attn.qkv.weight after forward", **where)  # fmt: skip
    return out
