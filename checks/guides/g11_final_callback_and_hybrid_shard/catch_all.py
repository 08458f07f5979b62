"""Guide 11's catch-all reshard: a model whose units get no post-backward hook (one with a parameter-free output
that reaches the loss, one whose output is dropped), and what the final callback frees per backward-prefetch mode
(expect `catch-all`)."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.expected import Expected, Row
from checks.guides.g11_final_callback_and_hybrid_shard.observing import FINAL_CALLBACK, RU, observing
from checks.naming import ROOT
from checks.probes import calls
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import units


class TwoOutputs(nn.Module):
    """A unit returning its layer's output and a parameter-free function of its input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(h), h * 2.0


class CatchAllModel(nn.Module):
    """``first`` (root) → ``split`` (a unit; only its parameter-free output reaches the loss) → ``head`` (root);
    ``dropped`` (a unit) runs in forward but its output is thrown away."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.first = nn.Linear(3, width)
            self.split = TwoOutputs(width)
            self.dropped = nn.Linear(width, width)
            self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        _, doubled = self.split(h)  # the output that depends on split's parameters is dropped
        self.dropped(h)  # a whole unit's output dropped
        return self.head(doubled)


def _catch_all_model(ctx: RankContext, **kwargs: Any) -> FSDP:
    model = CatchAllModel().to(ctx.device)
    options = {"device_id": ctx.device, "use_orig_params": True, **kwargs}
    model.split = FSDP(model.split, **options)
    model.dropped = FSDP(model.dropped, **options)
    return FSDP(model, **options)


def _reshard_observer(model: FSDP, log: list[str]) -> dict[str, calls.CallHook]:
    """Hooks that log the final callback's start and every `_reshard` with the function that called it (event
    sources are attributed only in captured runs; this reads the caller's frame directly)."""
    names = {id(u._handle): name for name, u in units(model).items()}

    def on_final(frame: types.FrameType) -> None:
        log.append("final_callback")

    def on_reshard(frame: types.FrameType) -> None:
        kind = "free" if frame.f_locals["free_unsharded_flat_param"] else "reshard"
        caller = frame.f_back.f_code.co_name if frame.f_back is not None else "?"
        log.append(f"{kind} {names.get(id(frame.f_locals['handle']), '?')} from {caller}")

    return {FINAL_CALLBACK: on_final, f"{RU}:_reshard": on_reshard}


def _is_sharded(unit: FSDP) -> dict[str, Any]:
    flat = unit._handle.flat_param
    padded = flat._full_param_padded
    return {
        "on_local_shard": flat.data_ptr() == flat._local_shard.data_ptr(),
        "numel": flat.numel(),
        "unsharded_bytes": padded.untyped_storage().size(),
    }


def _frees(row: Row) -> list[str]:
    """What a row says the final callback frees: ``free <unit>, free <unit>``, or ``nothing``."""
    return [] if row.value == "nothing" else [free.strip() for free in row.value.split(",")]


def catch_all_reshards(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """`split`'s parameter-free output reaches the loss: its pre-backward hook unshards it and no post-backward
    hook follows. `dropped`'s output never reaches the loss. For each backward-prefetch mode, the events inside
    the final callback are the frees of the guide's expect block (``<mode>: <frees>``), each issued by
    `_catch_all_reshard`; after backward every non-root unit is back on its local shard with its unsharded storage
    freed."""
    seen: dict[str, Any] = {}
    for row in expected:
        mode = row.key
        prefetch = None if mode == "None" else mode
        model = _catch_all_model(ctx, backward_prefetch=BackwardPrefetch[prefetch] if prefetch else None)
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(ctx.rank))
        loss = model(x).sum()
        observed: list[str] = []
        with record_events(model) as events, observing(_reshard_observer(model, observed)):
            loss.backward()
        timeline = [e.describe() for e in events]
        state = {name: _is_sharded(u) for name, u in units(model).items() if name != ROOT}
        for name, s in state.items():
            require(s["on_local_shard"], "unsharded-after-backward", f"{mode}: {name}'s flat parameter is not its "
                    f"local shard after backward: {s}", unit=name, mode=mode, **s)  # fmt: skip
            require_equal(s["unsharded_bytes"], 0, reason="unsharded-storage-kept", what=f"{mode}: {name}'s "
                          "unsharded storage bytes", unit=name, mode=mode)  # fmt: skip
        for kind, units_with in (("pre_backward", [ROOT, "split"]), ("post_backward", [ROOT])):
            ran = sorted({e.unit for e in events if e.kind == kind})
            require_equal(ran, sorted(units_with), reason=f"{kind.replace('_', '-')}-units", mode=mode,
                          what=f"{mode}: units with a {kind} event", events=timeline)  # fmt: skip
        require("final_callback" in observed, "no-final-callback", f"{mode}: no final callback", events=timeline)
        in_callback = observed[observed.index("final_callback") + 1 :]
        want = [f"{free} from _catch_all_reshard" for free in _frees(row)]
        expected.require(in_callback == want, row, "not-freed-by-catch-all", f"{mode}: reshards inside the final "
                         f"callback: {in_callback!r}, expected {want!r}", observed=in_callback, expected=want,
                         mode=mode, reshards=observed)  # fmt: skip
        seen[mode] = {"timeline": timeline, "reshards": observed, "in_final_callback": in_callback, "after": state}
    return seen
