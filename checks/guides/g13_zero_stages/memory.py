"""Guide 13's memory claims: each implementation's distinct live storages by category after one step, against
the torch-free memory model (`checks.models.zero_memory`), per optimizer too."""

from __future__ import annotations

from typing import Any

import torch

from checks.expected import Expected
from checks.models.zero_memory import (
    IMPLEMENTATIONS,
    Memory,
    owned_elements,
    per_rank,
)
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.data_parallel import (
    CATEGORIES,
    Trained,
    build,
    held_bytes,
)
from checks.workloads.gpt import batch, parameters_of_tiny


# -- memory: distinct live storages by category (the implementations: `checks.workloads.data_parallel`) ----------
def _one_step(trained: Trained, ctx: RankContext, step: int = 0) -> torch.Tensor:
    _, loss = trained.forward(*batch(ctx, step=step))
    loss.backward()
    trained.step_fn()
    return loss.detach()


def memory_per_rank(
    ctx: RankContext, precision: str = "fp32", impls: list[str] | None = None, use_orig_params: bool = True
) -> dict[str, Any]:
    """After one step (gradients kept), every implementation holds on every rank exactly the bytes per category
    of `checks.models.zero_memory`, padding included, and no unsharded parameters (FSDP1's with
    ``use_orig_params``)."""
    params = parameters_of_tiny()
    measured: dict[str, dict[str, int]] = {}
    padding: dict[str, dict[str, int]] = {}
    for impl in impls or IMPLEMENTATIONS:
        trained = build(impl, ctx, precision, use_orig_params=use_orig_params)
        _one_step(trained, ctx)
        held = held_bytes(trained)
        want: Memory = per_rank(impl, params, ctx.world_size, ctx.rank, precision, use_orig_params=use_orig_params)
        got = {c: held[c] for c in CATEGORIES}
        require_equal(got, want.by_category(), reason="memory-mismatch",
                      what=f"{impl} ({precision}) rank {ctx.rank} of {ctx.world_size}: bytes by category",
                      impl=impl, precision=precision)  # fmt: skip
        require(held["unsharded"] == 0, "unsharded-after-step", f"{impl}: {held['unsharded']} unsharded bytes after "
                "the step", impl=impl, observed=held["unsharded"])  # fmt: skip
        measured[impl] = got
        padding[impl] = want.padding_bytes()
        del trained
    totals = {impl: sum(m.values()) for impl, m in measured.items()}
    # `fsdp-readings memory 13-zero-stages ...`: one bar per implementation (the master copy drawn with optim).
    bars = [(impl, {"params": m["params"], "grads": m["grads"], "optim": m["optim"] + m["master"]})
            for impl, m in measured.items()]  # fmt: skip
    return {
        "series": {f"bytes per rank after a step ({precision})": bars},
        "bytes": measured,
        "totals": totals,
        "padding": padding,
        "of_ddp": {impl: round(t / totals["ddp"], 4) for impl, t in totals.items()} if "ddp" in totals else {},
        "owned": owned_elements(params, ctx.world_size),
        "psi": sum(p.numel for p in params),
    }


def memory_per_optimizer(
    ctx: RankContext, optimizers: list[str], impls: list[str], expected: Expected
) -> dict[str, Any]:
    """With each optimizer, every implementation holds after one step exactly `zero_memory`'s bytes by category
    for that optimizer; DDP's state per optimizer, on every rank, is the guide's row for it (``expected``, optimizer
    → its state), which the guide works out from the optimizer's state tensors."""
    params = parameters_of_tiny()
    state: dict[str, dict[str, int]] = {}
    for name in optimizers:
        for impl in impls:
            trained = build(impl, ctx, optim_name=name)
            _one_step(trained, ctx)
            held = held_bytes(trained)
            want = per_rank(impl, params, ctx.world_size, ctx.rank, optim=name)
            got = {c: held[c] for c in CATEGORIES}
            require_equal(got, want.by_category(), reason="memory-mismatch",
                          what=f"{impl} with {name}, rank {ctx.rank} of {ctx.world_size}: bytes by category",
                          impl=impl, optimizer=name)  # fmt: skip
            state.setdefault(name, {})[impl] = got["optim"]
            del trained
    ddp_state = {name: f"{state[name]['ddp']:,} bytes of optimizer state on a DDP rank" for name in optimizers}
    expected.require_values(ddp_state, reason="state-differs-from-guide", what="DDP's optimizer state per optimizer")
    lines = [f"{name}: {said}" for name, said in ddp_state.items()]
    return {"state": state, "lines": lines, "psi": sum(p.numel for p in params), "tensors": len(params)}
