"""Checks for guide 13, ZeRO-1/2/3 side by side: the reference ZeRO (`checks.zero`), torch's
ZeroRedundancyOptimizer, FSDP1's three strategies, FSDP2 and DDP, by memory and by numbers.

Expected values come from outside the implementations: bytes per category from the torch-free model
`checks.models.zero_memory` over the model's parameter shapes; peak differences from the flat-parameter layout
model; numerics from DDP, each reduced gradient from the ranks' local gradients (an unwrapped replica's, gathered),
and the tolerances from the guide's own prose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from checks.expected import Expected
from checks.models.flat_param import layout
from checks.models.zero_memory import (
    IMPLEMENTATIONS,
    Memory,
    owned_elements,
    per_rank,
)
from checks.naming import ROOT
from checks.numerics import pairwise_sums
from checks.probes.memory import account_memory
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.data_parallel import (
    BLOCKS,
    CATEGORIES,
    LR,
    Trained,
    build,
    gpt_replica,
    held_bytes,
)
from checks.workloads.gpt import batch, fsdp1_gpt, parameters_of_tiny
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, preset
from mini_gpt.train import make_optimizer


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


# -- numerics: every implementation against DDP ---------------------------------------------------------------------
def _trajectory(trained: Trained, ctx: RankContext, steps: int) -> dict[str, Any]:
    """Train ``steps`` steps; the losses, the whole parameters after each step, and the reduced gradients of the
    first backward."""
    losses, params, first = [], [], {}
    for step in range(steps):
        _, loss = trained.forward(*batch(ctx, step=step))
        loss.backward()
        if step == 0:
            first = {n: g.flatten().cpu() for n, g in trained.grads_fn().items()}
        trained.step_fn()
        trained.zero_grad_fn()
        losses.append(loss.detach().clone())
        params.append(trained.params_fn())
    return {"losses": losses, "params": params, "grads": first}


def _local_grads(ctx: RankContext, names: list[str]) -> list[torch.Tensor]:
    """Every rank's local gradient of step 1 (an unwrapped replica on the rank's own batch), flattened in
    ``names`` order, gathered."""
    replica = gpt_replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    grads = dict(replica.named_parameters())
    local = torch.cat([grads[n].grad.detach().flatten().cpu() for n in names])
    everyone = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, local)
    return everyone


def against_ddp(ctx: RankContext, impls: list[str] | None = None, steps: int = 5,
                bound: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Each implementation and DDP train from the same weights on the same batches. ``bound=None``: the losses
    and every parameter after every step equal DDP's, bit for bit. Otherwise every step-1 reduced gradient times
    N is one of the fp32 pairwise sums of the N local gradients (a summation order, nothing else), and losses and
    parameters stay within ``bound`` of DDP's."""
    impls = [i for i in impls or IMPLEMENTATIONS if i != "ddp"]
    reference = _trajectory(build("ddp", ctx), ctx, steps)
    names = list(reference["params"][0])
    sums = None
    if bound is not None:
        n = ctx.world_size
        if n & (n - 1):
            raise ValueError(f"{n} ranks: multiplying the mean back by N is exact only for a power of two")
        sums = torch.stack(pairwise_sums(_local_grads(ctx, names)))
    report: dict[str, Any] = {}
    for impl in ["ddp", *impls]:
        run = reference if impl == "ddp" else _trajectory(build(impl, ctx), ctx, steps)
        require_equal(sorted(run["params"][0]), sorted(names), reason="parameter-names", what=f"{impl}: names")
        param_diff = [max(float((p[k] - q[k]).abs().max()) for k in names)
                      for p, q in zip(run["params"], reference["params"], strict=True)]  # fmt: skip
        loss_diff = [abs(float(a) - float(b)) for a, b in zip(run["losses"], reference["losses"], strict=True)]
        grads = torch.cat([run["grads"][k] for k in names])
        entry = {"param_diff": param_diff, "loss_diff": max(loss_diff)}
        if sums is not None:
            unexplained = int((~(sums == grads * ctx.world_size).any(dim=0)).sum())
            require(unexplained == 0, "not-a-summation-order", f"{impl}: {unexplained} step-1 gradient elements "
                    f"× {ctx.world_size} are no fp32 sum of the local gradients", impl=impl,
                    observed=unexplained)  # fmt: skip
            ddp_grads = torch.cat([reference["grads"][k] for k in names])
            entry["grads_differing"] = int((grads != ddp_grads).sum())
        if bound is None:
            for step, (a, b) in enumerate(zip(run["losses"], reference["losses"], strict=True), start=1):
                require(torch.equal(a, b), "loss-differs", f"{impl}, step {step}: loss {float(a)} vs DDP's "
                        f"{float(b)}", impl=impl, step=step)  # fmt: skip
                differing = [k for k in names if not torch.equal(run["params"][step - 1][k],
                                                                 reference["params"][step - 1][k])]  # fmt: skip
                require(not differing, "differs-from-ddp", f"{impl}, after step {step}: {len(differing)} parameters "
                        f"differ from DDP's, by up to {param_diff[step - 1]}", impl=impl, step=step,
                        differing=differing, max_abs_diff=param_diff[step - 1])  # fmt: skip
        else:
            for step, diff in enumerate(param_diff, start=1):
                require(diff <= bound, "beyond-bound", f"{impl}, after step {step}: max |param - DDP's| = {diff} > "
                        f"{bound}", impl=impl, step=step, observed=diff, bound=bound)  # fmt: skip
            require(max(loss_diff) <= bound, "loss-beyond-bound", f"{impl}: max |loss - DDP's| = {max(loss_diff)}",
                    impl=impl, observed=max(loss_diff), bound=bound)  # fmt: skip
        report[impl] = entry
    worst = max(max(e["param_diff"]) for e in report.values())
    return {
        "verdict": "bitwise equal"
        if worst == 0 and all(e["loss_diff"] == 0 for e in report.values())
        else "not bitwise equal",
        "worst_param_diff": worst,
        "by_impl": report,
        "losses": [float(v) for v in reference["losses"]],
    }


# -- peaks: SHARD_GRAD_OP against FULL_SHARD ------------------------------------------------------------------------
def _unsharded_unit_bytes(world_size: int) -> dict[str, int]:
    """Each unit's padded unsharded flat parameter in bytes (fp32, use_orig_params=True), by the layout model."""
    from checks.workloads.gpt import unit_numels

    return {unit: 4 * layout(numels, 4, world_size).padded_numel for unit, numels in unit_numels().items()}


def _peak_of(ctx: RankContext, strategy: str, backward_prefetch: str | None) -> dict[str, Any]:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[strategy],
                      backward_prefetch=BackwardPrefetch[backward_prefetch] if backward_prefetch not in (None, "None")
                      else None)  # fmt: skip
    optim = make_optimizer(model, LR)
    for step in range(2):  # step 1 outside: lazy initialisation and the optimizer's state are one-time
        with account_memory(model, optim, peaks=step == 1) as mem:
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
    require(mem.peak is not None, "no-peaks", f"no peak report: {mem.peak_unavailable}", observed=mem.peak_unavailable)
    return {"before": mem.before.by_category, "after": mem.after.by_category, "peak": dict(mem.peak.peak)}


def shard_grad_op_peak(ctx: RankContext, backward_prefetch: str | None, held_blocks: int,
                       temp_blocks: int) -> dict[str, Any]:  # fmt: skip
    """SHARD_GRAD_OP and FULL_SHARD hold the same bytes between steps; SHARD_GRAD_OP's unsharded peak is larger by
    exactly the blocks it keeps unsharded beyond the ``held_blocks`` FULL_SHARD holds at its peak (the root is
    unsharded at both peaks). Every other category's peak is the same, except torch's tracker's ``temp``, which may
    differ by up to ``temp_blocks`` blocks' unsharded bytes (when a unit's gradient temporaries die is not
    deterministic); the total peaks differ by the unsharded difference within that same bound."""
    units = _unsharded_unit_bytes(ctx.world_size)
    blocks = [units[b] for b in BLOCKS]
    expected = {
        "FULL_SHARD": units[ROOT] + sum(sorted(blocks, reverse=True)[:held_blocks]),
        "SHARD_GRAD_OP": units[ROOT] + sum(blocks),
    }
    temp_bound = temp_blocks * units["blocks.0"]
    runs = {s: _peak_of(ctx, s, backward_prefetch) for s in expected}
    fs, sgo = runs["FULL_SHARD"], runs["SHARD_GRAD_OP"]
    for moment in ("before", "after"):
        require_equal(sgo[moment], fs[moment], reason="persistent-state-differs",
                      what=f"bytes by category {moment} the step, SHARD_GRAD_OP vs FULL_SHARD",
                      moment=moment)  # fmt: skip
    observed = {s: r["peak"].get("unsharded", 0) for s, r in runs.items()}
    require_equal(observed, expected, reason="unsharded-peak", what="peak unsharded bytes")
    difference = observed["SHARD_GRAD_OP"] - observed["FULL_SHARD"]
    others = {k: sgo["peak"].get(k, 0) - fs["peak"].get(k, 0) for k in sorted(set(sgo["peak"]) | set(fs["peak"]))
              if k not in ("unsharded", "total")}  # fmt: skip
    bounds = {k: temp_bound if k == "temp" else 0 for k in others}
    beyond = {k: v for k, v in others.items() if abs(v) > bounds[k]}
    require(not beyond, "other-peaks-differ", f"peaks other than unsharded differ beyond {bounds}: {beyond}",
            observed=others, bound=temp_bound)  # fmt: skip
    total = sgo["peak"]["total"] - fs["peak"]["total"]
    require(abs(total - difference) <= temp_bound, "total-peak-difference", f"total peaks differ by {total}, the "
            f"unsharded peaks by {difference}: more than {temp_bound} apart", observed=total, expected=difference,
            bound=temp_bound)  # fmt: skip
    return {
        "unsharded_peak": observed,
        "difference": difference,
        "difference_in_blocks": difference / units["blocks.0"],
        "total_peak": {s: r["peak"]["total"] for s, r in runs.items()},
        "total_difference": total,
        "other_differences": others,
        "peaks": {s: r["peak"] for s, r in runs.items()},
        "persistent": fs["after"],
    }


# -- DDP against one process: the seeds' 1e-5 on logits, and the logit scale ------------------------------------------
def _scaled_gpt(ctx: RankContext, scale: float) -> GPT:
    """mini_gpt tiny with its tied embedding / head matrix multiplied by ``scale``: the logits scale with it."""
    model = gpt_replica(ctx)
    with torch.no_grad():
        model.tok_emb.weight.mul_(scale)
    return model


def ddp_vs_single_logits(ctx: RankContext, *, scales: list[float], tolerance: float, holds_up_to: float,
                         relative_bound: float, steps: int = 5) -> dict[str, Any]:  # fmt: skip
    """For each logit scale: one process trains on the global batch, DDP on each rank's share of it, from the same
    weights, ``steps`` AdamW steps; then both compute logits on an unseen batch. The largest difference stays
    within ``tolerance`` for every scale up to ``holds_up_to`` and exceeds it above; relative to the largest logit
    it stays within ``relative_bound`` at every scale."""
    from mini_gpt import BatchSampler, corpus_tokens

    sampler = BatchSampler(corpus_tokens(), preset("tiny").block_size, 8)
    probe = sampler.global_batch(steps)[0].to(ctx.device)
    rows: list[dict[str, float]] = []
    for scale in scales:
        single, ddp = _scaled_gpt(ctx, scale), wrap_ddp(_scaled_gpt(ctx, scale), ctx)
        optims = make_optimizer(single, LR), make_optimizer(ddp, LR)
        with torch.no_grad():
            start = single(probe)[0].abs().max().item()
        for step in range(steps):
            for model, optim, (x, y) in zip((single, ddp), optims, (sampler.global_batch(step), batch(ctx, step)),
                                            strict=True):  # fmt: skip
                _, loss = model(x.to(ctx.device), y.to(ctx.device))
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
        with torch.no_grad():
            a, b = single(probe)[0], ddp.module(probe)[0]
        drift = (a - b).abs().max().item()
        rows.append({"scale": scale, "max_logit_at_init": start, "max_logit": a.abs().max().item(), "drift": drift,
                     "relative": drift / a.abs().max().item()})  # fmt: skip
    for row in rows:
        if row["scale"] <= holds_up_to:
            require(row["drift"] <= tolerance, "drift-beyond-tolerance", f"scale {row['scale']}: logits drift "
                    f"{row['drift']} > {tolerance}", scale=row["scale"], observed=row["drift"],
                    bound=tolerance)  # fmt: skip
        else:
            require(row["drift"] > tolerance, "drift-within-tolerance", f"scale {row['scale']}: logits drift only "
                    f"{row['drift']} <= {tolerance}", scale=row["scale"], observed=row["drift"],
                    bound=tolerance)  # fmt: skip
    worst = max(r["relative"] for r in rows)
    require(worst <= relative_bound, "relative-drift", f"drift / max |logit| reaches {worst} > {relative_bound}",
            observed=worst, bound=relative_bound)  # fmt: skip
    return {"rows": rows, "worst_relative": worst, "breaks_at": min((r["scale"] for r in rows
            if r["drift"] > tolerance), default=None)}  # fmt: skip


# -- break-it recipes: the reference ZeRO and torch bent on purpose (tests/break_it/ applies them) ------------------
def neighbours_range(original: Callable[..., tuple[int, int]]) -> Callable[..., tuple[int, int]]:
    """`checks.zero.groups.shard_range` that gives each rank its neighbour's slice: the reduced gradient lands in,
    and the optimizer updates, a slice the rank does not own."""

    def shifted(padded: int, world_size: int, rank: int) -> tuple[int, int]:
        return original(padded, world_size, (rank + 1) % world_size)

    return shifted


def ddp_without_all_reduce(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """`DistributedDataParallel.__init__` followed by a communication hook that all-reduces nothing: every rank
    keeps its own gradient, as if the reducer's bucket all-reduce were missing."""
    original(self, *args, **kwargs)

    def local_only(state, bucket):  # unannotated: DDP refuses any annotation but dist.GradBucket
        done: Any = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    self.register_comm_hook(None, local_only)


_EXTRA: list[torch.Tensor] = []
EXTRA_TEMP_BYTES = 100_000  # between one block (64,080 bytes) and two (128,160): what the old bound let through


def extra_temp_in_shard_grad_op(original: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
    """``_pre_backward_hook`` that, under SHARD_GRAD_OP, allocates a 100,000-byte temporary in the root's hook and
    keeps it through backward (`drop_extra_temp` frees it): memory FULL_SHARD's run does not hold."""
    from torch.distributed.fsdp import ShardingStrategy

    if state._is_root and state.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and not _EXTRA:
        _EXTRA.append(torch.ones(EXTRA_TEMP_BYTES // 4))
    return original(state, *args, **kwargs)


def drop_extra_temp(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``_post_backward_final_callback`` that frees `extra_temp_in_shard_grad_op`'s temporary first."""
    _EXTRA.clear()
    return original(*args, **kwargs)


def sgd_keeping_momentum_always(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """`SGD.step`, then a momentum buffer for every parameter with a gradient, whatever its momentum: SGD as if
    ``group["momentum"] != 0`` were not asked."""
    loss = original(self, *args, **kwargs)
    for group in self.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                self.state[p].setdefault("momentum_buffer", p.grad.detach().clone())
    return loss


def adam_forgetting_amsgrad(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """`Adam.step`, then each parameter's ``max_exp_avg_sq`` dropped: an Adam whose amsgrad keeps no third buffer."""
    loss = original(self, *args, **kwargs)
    for state in self.state.values():
        state.pop("max_exp_avg_sq", None)
    return loss


def adam_keeping_an_extra_buffer(original: Any, self: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
    """`Adam._init_group`, then one more zero buffer per parameter with a gradient: state a third larger."""
    out = original(self, group, *args, **kwargs)
    for p in group["params"]:
        if p.grad is not None:
            self.state[p].setdefault("extra", torch.zeros_like(p))
    return out
