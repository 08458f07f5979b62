"""Checks for guide 18, FSDP2's ``reshard_after_forward``, the root, mixed precision and gradients.

Expected values never come from FSDP: counts, group sizes and bytes from `checks.models.fsdp2_reshard` over the
model's parameter shapes (`checks.models.comm_volume.fsdp2_padded`); divide factors and reduce ops from
`checks.models.divide_factors.fsdp2_factors`; dtypes from `checks.models.fsdp2_precision`; gradients and trained
parameters from DDP (and FSDP1) on the same data, or from a plain replica's per-rank gradients combined by the
formula the guide derives. Every comparison is exact.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from checks.models import comm_volume as cv
from checks.models import fsdp2_precision, fsdp2_reshard
from checks.models.divide_factors import fsdp2_factors
from checks.models.fsdp2_prefetch import step_sequence
from checks.models.fsdp2_shards import row_range
from checks.naming import ROOT, unit_name
from checks.probes import account_memory, record_comm, snapshot
from checks.ranks import tracing
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp1_gpt, fsdp2_gpt, tiny_shapes
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, preset

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
UNITS = (ROOT, *BLOCKS)
_LOGGER = "torch.distributed.fsdp.fully_shard"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _setting(text: str) -> bool | int | None:
    """A setting as the guide's tables write it: ``True``, ``False``, ``None`` or an int."""
    if text.isdigit():
        return int(text)
    return {"True": True, "False": False, "None": None}[text]


def padded(world_size: int) -> dict[str, int]:
    """Each unit's padded unsharded size (elements), root first: the model's input."""
    return cv.fsdp2_padded(tiny_shapes(), world_size)


def groups(model: nn.Module) -> dict[str, Any]:
    """Every ``FSDPParamGroup`` of the model by unit name (one per unit here)."""
    from torch.distributed.fsdp import FSDPModule

    found = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                found[unit_name(group._module_fqn)] = group
    return found


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


def _op_name(op: Any) -> str:
    return getattr(op, "name", None) or str(op).split(".")[-1]


@contextmanager
def divide_factors_seen() -> Iterator[list[tuple[Any, ...]]]:
    """What every ``_get_gradient_divide_factors`` call inside the block returned, (pre, post, rs op, ar op) with
    ops by name: observed at return through the rank's trace multiplexer, nothing patched."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    seen: list[tuple[Any, ...]] = []

    def on_call(frame: types.FrameType) -> tracing.ReturnHook:
        def on_return(frame: types.FrameType, value: Any) -> None:
            if value is not None:
                pre, post, rs_op, ar_op = value
                seen.append((pre, post, _op_name(rs_op), _op_name(ar_op)))

        return on_return

    with tracing.subscribed({_fsdp_collectives._get_gradient_divide_factors.__code__: on_call}):
        yield seen


# -- reshard_after_forward: what each setting does ---------------------------------------------------------------
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


def _settings_line(setting: str, states: dict[str, str], gathers: dict[str, list], warned: bool) -> str:
    blocks = sorted({states[b] for b in BLOCKS})
    return (f"{setting:<6} root {states[ROOT]:<10} blocks {'/'.join(blocks):<10} forward {len(gathers['forward'])} "
            f"backward {len(gathers['backward'])}  {'warns' if warned else 'silent'}")  # fmt: skip


def reshard_settings(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """Each setting of the guide's table: the groups' states after forward, the all-gathers of forward and of
    backward (unit sizes and group sizes), and the warning ``fully_shard`` logs, as the model says and as the
    table says."""
    out: dict[str, Any] = {}
    for line in stated:
        label = line.split()[0]
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
        observed = _settings_line(label, seen["states"], seen["all_gathers"], warned)
        require_equal(" ".join(observed.split()), " ".join(line.split()), reason="table-differs",
                      what=f"{label}: the guide's line", **where)  # fmt: skip
        out[label] = {"states": seen["states"], "backward_all_gathers": len(seen["all_gathers"]["backward"]),
                      "warnings": seen["warnings"]}  # fmt: skip
    return out


def _cost_line(label: str, held: int, ring: dict[str, Any], peak: str) -> str:
    parts = [f"{label:<5}", f"held {f'{held:,}':<7}", *(f"{k} {int(v):,}" for k, v in ring.items()), peak]
    return " ".join(parts).rstrip()


def reshard_cost(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """Each setting's cost on this world size: the bytes of unsharded (or post-forward-resharded) parameters a
    rank holds between forward and backward; the most bytes of unsharded parameters alive at once over the step
    (guide 17's event sequence for the setting walked by `unsharded_peak`; an int k < N drops its unsharded
    parameters where True frees them, and what it keeps is in the held bytes); and the ring-model bytes it sends
    in forward, in backward and in all; against the model and the guide's table."""
    n, out = ctx.world_size, {}
    for line in stated:
        label = line.split()[0]
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
        peak_text = f"peak {peak:,}"
        observed = _cost_line(label, seen["held"], {**observed_ring, "step": sum(observed_ring.values())}, peak_text)
        require_equal(" ".join(observed.split()), " ".join(line.split()), reason="table-differs",
                      what=f"{label}: the guide's line", **where)  # fmt: skip
        out[label] = {"held": seen["held"], "peak": seen["peak"], "ring_step": int(sum(observed_ring.values())),
                      "states": seen["states"], "registered": seen["registered"],
                      "all_gathers": seen["all_gathers"]}  # fmt: skip
    # `fsdp-readings memory 18-...`: per setting, the unsharded bytes held after forward and at the step's peak.
    series = {label: [("held after forward", {"unsharded": seen["held"]}), ("peak of the step",
                                                                          {"unsharded": seen["peak"]})]
              for label, seen in out.items()}  # fmt: skip
    return {**out, "series": series}


def int_at_four(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """``reshard_after_forward=2`` on four ranks: every group SHARDED_POST_FORWARD after forward, its registered
    parameters DTensors (Replicate(), Shard(0)) on a 2x2 mesh; backward all-gathers each unit over 2 ranks; the
    bytes held and sent are the model's and the table's (the costs of `reshard_cost`)."""
    out = reshard_cost(ctx, stated)
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
            expected = {"type": "DTensor", "placements": ["R", "S(0)"], "mesh": [ctx.world_size // k, k]}
            require_equal(seen["registered"], expected, reason="registered-differs",
                          what=f"{label}: blocks.0.attn.qkv.weight after forward", **where)  # fmt: skip
    return out


# -- gradients ----------------------------------------------------------------------------------------------------


def _by_name(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): p.grad for n, p in model.named_parameters() if p.grad is not None}


def _slices(full: dict[str, torch.Tensor], model: nn.Module, ctx: RankContext) -> dict[str, torch.Tensor]:
    """This rank's rows of each full gradient, by the dim-0 chunk rule (`checks.models.fsdp2_shards`)."""
    out = {}
    for name, param in model.named_parameters():
        lo, hi = row_range(tuple(param.shape), ctx.world_size, ctx.rank)
        out[name] = full[name].detach()[lo:hi]
    return out


def _compare(model: nn.Module, expected: dict[str, torch.Tensor], ctx: RankContext, case: str) -> dict[str, Any]:
    """Every sharded gradient (its DTensor's local tensor) equal to ``expected``'s slice, bitwise."""
    differs: dict[str, float] = {}
    for name, param in model.named_parameters():
        require(param.grad is not None, "no-gradient", f"{case}: {name} has no gradient", case=case, name=name)
        local = param.grad.to_local()
        want = expected[name].reshape(local.shape).to(local.dtype)
        if not torch.equal(local, want):
            differs[name] = (local.double() - want.double()).abs().max().item()
    require(not differs, "not-bitwise", f"{case}: rank {ctx.rank}'s sharded gradients differ from the expected "
            f"slices: {differs}", case=case, differs=differs)  # fmt: skip
    return {"parameters": len(expected), "bitwise": True}


def _check_factors(seen: list[tuple[Any, ...]], want: tuple[Any, ...], case: str) -> None:
    require_equal(len(seen), len(UNITS), reason="reductions-differ", what=f"{case}: reductions", case=case)
    for got in seen:
        require_equal(got, want, reason="divide-factors-differ", what=f"{case}: (pre, post, rs op, ar op)", case=case)


def grads_are_ddp_slice(ctx: RankContext) -> dict[str, Any]:
    """fp32, the default: every reduction takes ``AVG`` with no divide factor (the model's), four fp32
    reduce-scatters, and each rank's sharded gradients are bitwise its rows of DDP's averaged gradients."""
    fsdp, ddp = fsdp2_gpt(ctx), ddp_gpt(ctx)
    x, y = batch(ctx)
    loss = fsdp(x, y)[1]
    with divide_factors_seen() as seen, record_comm() as comm:
        loss.backward()
    ddp(x, y)[1].backward()
    want = fsdp2_factors("float32", ctx.world_size)
    _check_factors(seen, want, "fp32")
    dtypes = [c.dtype for c in comm.select("reduce_scatter")]
    require_equal(dtypes, ["torch.float32"] * len(UNITS), reason="reduce-scatters-differ", what="reduce-scatters")
    result = _compare(fsdp, _slices(_by_name(ddp), fsdp, ctx), ctx, "fp32")
    return {"factors": list(seen[0]), "op": seen[0][2], **result}


TIED = {"tok_emb.weight": ("tok_emb.weight", "lm_head.weight")}  # the tied weight: its uses, in an untied replica


def _per_use_grads(ctx: RankContext) -> list[dict[str, list[torch.Tensor]]]:
    """Each rank's batch through a plain replica whose ``lm_head`` has its own copy of the tied weight (every rank
    computes all of them; no collective): each parameter's gradient per use, the tied weight's two uses apart
    (embedding, head). Untying changes no operation of either use, only where autograd adds them."""
    out = []
    for rank in range(ctx.world_size):
        model = GPT(preset("tiny"), seed=0).to(ctx.device)
        model.lm_head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
        model(*batch(dataclasses.replace(ctx, rank=rank)))[1].backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        out.append(
            {name: [grads[use] for use in TIED.get(name, (name,))] for name in grads if name != "lm_head.weight"}
        )
    return out


def _rank_gradient(uses: list[torch.Tensor], added_in: str, reduce_dtype: torch.dtype) -> torch.Tensor:
    """One rank's gradient of a parameter as the reduction receives it, in ``reduce_dtype``: its uses added in
    fp32 and then rounded ("sum-then-round", 2.13), or each use rounded and the roundings added
    ("round-each", 2.15), as the precision model's ``uses_added_in`` says. One use rounds the same either way."""
    if DTYPES[added_in] == reduce_dtype:
        total = uses[0].to(reduce_dtype)
        for use in uses[1:]:
            total = total + use.to(reduce_dtype)
        return total
    return sum(uses[1:], uses[0]).to(reduce_dtype)


def _fp16_formula(per_use: list[dict[str, list[torch.Tensor]]], added_in: str, pre: Any, post: Any) -> dict:
    """The fp16 reduction by hand: every rank's gradient (`_rank_gradient`) divided by the pre-factor, summed over
    ranks in fp16 in rank order, divided by the post-factor, cast to fp32."""
    formula = {}
    for name in per_use[0]:
        parts = [_rank_gradient(g[name], added_in, torch.float16) / pre for g in per_use]
        total = sum(parts[1:], parts[0])
        formula[name] = (total / post if post != 1 else total).float()
    return formula


def sum_paths(ctx: RankContext, release: str) -> dict[str, Any]:
    """The SUM paths. ``set_force_sum_reduction_for_comms(True)``: SUM, nothing before, N after; the gradients are
    still DDP's slices bitwise. ``reduce_dtype=float16``: SUM, 2 before and 1 after on two ranks, fp16
    reduce-scatters, and each sharded gradient is the formula's: every rank's gradient rounded to fp16 (the tied
    weight's two uses added before or after the rounding, as `checks.models.fsdp2_precision` says for
    ``release``), divided by the pre-factor, summed in fp16, divided by the post-factor, cast to fp32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    out: dict[str, Any] = {}
    ddp = ddp_gpt(ctx)
    x, y = batch(ctx)
    ddp(x, y)[1].backward()
    forced = fsdp2_gpt(ctx)
    for module in forced.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    loss = forced(x, y)[1]
    with divide_factors_seen() as seen:
        loss.backward()
    _check_factors(seen, fsdp2_factors("float32", ctx.world_size, force_sum=True), "force-sum")
    out["force-sum"] = {"factors": list(seen[0]), **_compare(forced, _slices(_by_name(ddp), forced, ctx), ctx,
                                                            "force-sum")}  # fmt: skip

    half = fsdp2_gpt(ctx, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float16))
    loss = half(x, y)[1]
    with divide_factors_seen() as seen, record_comm() as comm:
        loss.backward()
    pre, post, _, _ = want = fsdp2_factors("float16", ctx.world_size)
    _check_factors(seen, want, "fp16")
    dtypes = sorted({c.dtype for c in comm.select("reduce_scatter")})
    require_equal(dtypes, ["torch.float16"], reason="reduce-scatters-differ", what="fp16: reduce-scatter dtypes")
    added_in = fsdp2_precision.stages("float32", None, "float16", release=release).uses_added_in
    formula = _fp16_formula(_per_use_grads(ctx), added_in, pre, post)
    out["fp16"] = {"factors": list(seen[0]), "tied_added_in": added_in,
                   **_compare(half, _slices(formula, half, ctx), ctx, "fp16")}  # fmt: skip
    return out


ORDERS = {"float16": "round-each", "float32": "sum-then-round"}  # the tied weight's uses added in fp16, or in fp32


def _tied_lines(formulas: dict[str, torch.Tensor], ctx: RankContext, element: tuple[int, int]) -> list[str]:
    """The guide's figures for the two orders, from the formulas alone: how many elements they differ on, in all
    and in each rank's rows, and both values of one element."""
    first, second = formulas["sum-then-round"], formulas["round-each"]
    differ = first != second
    rows = [row_range(tuple(first.shape), ctx.world_size, r) for r in range(ctx.world_size)]
    per_rank = ", ".join(
        f"{int(differ[lo:hi].sum()):,} in rank {r}'s" + (" rows" if r == 0 else "") for r, (lo, hi) in enumerate(rows)
    )
    i, j = element
    return [
        f"{first.numel():,} elements, {int(differ.sum()):,} differ: {per_rank}",
        f"[{i}, {j}]  sum-then-round {first[i, j].item()!r}  round-each {second[i, j].item()!r}",
    ]


def _require_counts_near(seen: str, stated: str, slack: int) -> None:
    """The counts line against the guide's: the same words, the same element count, and each count of differing
    elements within ``slack`` of the guide's. The counts rest on the last bits of fp32 gradients, which the CPU's
    matrix kernels set (one element apart between two machines here; the guide says so and gives the slack)."""
    number = re.compile(r"\d[\d,]*")
    words = [" ".join(number.sub("#", line).split()) for line in (seen, stated)]
    got, want = ([int(n.replace(",", "")) for n in number.findall(line)] for line in (seen, stated))
    require_equal(words[0], words[1], reason="figures-differ", what="the two orders' counts line (its words)")
    far = [(g, w) for g, w in zip(got[1:], want[1:], strict=True) if abs(g - w) > slack]
    require(got[0] == want[0] and not far, "figures-differ", f"the two orders' counts: {seen!r}, the guide's "
            f"{stated!r} (counts may differ by {slack})", observed=got, expected=want, slack=slack)  # fmt: skip


def tied_fp16(ctx: RankContext, release: str, stated: list[str], count_slack: int) -> dict[str, Any]:
    """``reduce_dtype=float16`` on fp32 parameters: the tied ``tok_emb.weight`` takes two gradients per rank, a
    from the embedding and b from the head. Both orders of rounding are computed by hand from an untied replica's
    per-use gradients (`_per_use_grads`): sum-then-round, fp16(a + b), and round-each, fp16(a) + fp16(b), each then
    reduced as `_fp16_formula`. Their figures are the guide's; this rank's shard of FSDP's reduced gradient is
    bitwise the order `checks.models.fsdp2_precision` gives for ``release``, and not the other."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = fsdp2_gpt(ctx, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float16))
    x, y = batch(ctx)
    model(x, y)[1].backward()
    local = model.get_parameter("tok_emb.weight").grad.to_local()
    pre, post, _, _ = fsdp2_factors("float16", ctx.world_size)
    per_use = [{"tok_emb.weight": g["tok_emb.weight"]} for g in _per_use_grads(ctx)]
    formulas = {order: _fp16_formula(per_use, added_in, pre, post)["tok_emb.weight"]
                for added_in, order in ORDERS.items()}  # fmt: skip
    element = tuple(int(v) for v in stated[1].split("]")[0].split("[")[1].split(","))
    counts, values = _tied_lines(formulas, ctx, element)  # type: ignore[arg-type]
    _require_counts_near(counts, stated[0], count_slack)
    require_equal(" ".join(values.split()), " ".join(stated[1].split()), reason="figures-differ",
                  what="the two orders' values of one element against the guide's")  # fmt: skip
    want = ORDERS[fsdp2_precision.stages("float32", None, "float16", release=release).uses_added_in]
    lo, hi = row_range(tuple(formulas[want].shape), ctx.world_size, ctx.rank)
    matches = sorted(order for order, f in formulas.items() if torch.equal(local, f[lo:hi]))
    differ = {order: int((local != f[lo:hi]).sum()) for order, f in formulas.items()}
    require_equal(matches, [want], reason="tied-order-differs", what=f"rank {ctx.rank}: the orders FSDP's "
                  "tok_emb.weight shard equals bitwise", differ=differ)  # fmt: skip
    i, j = element
    value = local[i - lo, j].item() if lo <= i < hi else None
    return {"order": want, "differ": differ, "element": value}


# -- mixed precision and accumulation ----------------------------------------------------------------------------
POLICIES = {"bf16/None": ("bfloat16", None), "bf16/fp32": ("bfloat16", "float32"), "None/fp16": (None, "float16")}


def _policy(param_dtype: str | None, reduce_dtype: str | None) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=DTYPES.get(param_dtype or ""), reduce_dtype=DTYPES.get(reduce_dtype or ""))


def _precision_line(label: str, observed: dict[str, list[str]]) -> str:
    """One line of the guide's table from one policy's observed dtypes (each list holds one)."""
    (gathered,), (reduced,), (grad,), (op,), (waits,) = (observed[k] for k in PRECISION_COLUMNS)
    return f"{label:<10} gather {gathered:<9} reduce {reduced:<9}{op:<4} grads {grad:<8} waits {waits}"


PRECISION_COLUMNS = ("all_gather", "reduce_scatter", "grads", "ops", "waits")


def mixed_precision(ctx: RankContext, stated: list[str], release: str) -> dict[str, Any]:
    """Each policy of the guide's table: one synced step (the all-gathers' and reduce-scatters' dtypes, the reduce
    op, the sharded gradients' dtype), then one backward under ``set_requires_gradient_sync(False)`` (the dtype the
    unsynced gradient waits in), against `checks.models.fsdp2_precision` under ``release``'s rule and the table."""
    out: dict[str, Any] = {}
    for line in stated:
        label = line.split()[0]
        param_dtype, reduce_dtype = POLICIES[label]
        model = fsdp2_gpt(ctx, mp_policy=_policy(param_dtype, reduce_dtype))
        x, y = batch(ctx)
        with record_comm() as comm, divide_factors_seen() as seen:
            model(x, y)[1].backward()
        want = fsdp2_precision.stages("float32", param_dtype, reduce_dtype, release=release)
        gathered = sorted({c.dtype.removeprefix("torch.") for c in comm.select("all_gather")})
        reduced = sorted({c.dtype.removeprefix("torch.") for c in comm.select("reduce_scatter")})
        grads = sorted({str(p.grad.dtype).removeprefix("torch.") for p in model.parameters()})
        ops = sorted({s[2] for s in seen})
        model.set_requires_gradient_sync(False)
        model(x, y)[1].backward()
        waits = _unsharded_grads(model)["dtypes"]
        observed = {"all_gather": gathered, "reduce_scatter": reduced, "grads": grads, "ops": ops, "waits": waits}
        op = fsdp2_factors(want.reduce_scatter, ctx.world_size)[2]
        expected = {"all_gather": [want.all_gather], "reduce_scatter": [want.reduce_scatter],
                    "grads": [want.sharded_grad], "ops": [op], "waits": [want.accumulated]}  # fmt: skip
        require_equal(observed, expected, reason="dtypes-differ", what=f"{label}: dtypes", policy=label)
        text = _precision_line(label, observed)
        require_equal(" ".join(text.split()), " ".join(line.split()), reason="table-differs",
                      what=f"{label}: the guide's line", policy=label)  # fmt: skip
        out[label] = observed
    return out


def _unsharded_grads(model: nn.Module) -> dict[str, Any]:
    """Bytes and dtypes of what waits between micro-batches: the unsharded parameters' gradients and the
    accumulated ones; and how many sharded gradients exist."""
    held, dtypes, places, seen = 0, set(), set(), set()
    for group in groups(model).values():
        for fsdp_param in group.fsdp_params:
            for place, grad in (("unsharded_param.grad", fsdp_param._unsharded_param.grad),
                                ("unsharded_accumulated_grad", fsdp_param.unsharded_accumulated_grad)):  # fmt: skip
                if grad is not None:
                    places.add(place)
                    dtypes.add(str(grad.dtype).removeprefix("torch."))
                    storage = grad.untyped_storage()
                    # Each storage once: in 2.15 `unsharded_accumulated_grad` is a property returning the
                    # unsharded parameter's own `.grad`, so the two places can hold one tensor.
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        held += storage.nbytes()
    sharded = sum(p.grad is not None for p in model.parameters())
    return {"bytes": held, "dtypes": sorted(dtypes), "where": sorted(places), "sharded_grads": sharded}


def accumulate_without_sync(ctx: RankContext) -> dict[str, Any]:
    """Two micro-batches, the first under ``set_requires_gradient_sync(False)``: its backward reduce-scatters
    nothing and leaves every parameter's whole unsharded gradient on the rank (|θ| fp32 elements, no sharded
    gradient yet); the second reduce-scatters four times, and the sharded gradients are bitwise DDP's slices of
    the same two micro-batches under ``no_sync``. Under bf16 compute with fp32 reduction the waiting gradient is
    the model's dtype: fp32."""
    fsdp, ddp = fsdp2_gpt(ctx), ddp_gpt(ctx)
    micro = [batch(ctx, step=0), batch(ctx, step=1)]
    fsdp.set_requires_gradient_sync(False)
    loss = fsdp(*micro[0])[1]
    with record_comm() as first:
        loss.backward()
    waiting = _unsharded_grads(fsdp)
    theta = sum(p.numel() for p in GPT(preset("tiny"), seed=0).parameters())
    want = {"bytes": 4 * theta, "dtypes": ["float32"], "sharded_grads": 0}
    require_equal(len(first.select("reduce_scatter")), 0, reason="reduced-without-sync", what="backward 1's "
                  "reduce-scatters")  # fmt: skip
    held = {k: waiting[k] for k in want}  # `where` is reported, not required (see below)
    require_equal(held, want, reason="waiting-differs", what="gradients held between micro-batches")
    fsdp.set_requires_gradient_sync(True)
    loss = fsdp(*micro[1])[1]
    with record_comm() as second:
        loss.backward()
    require_equal(len(second.select("reduce_scatter")), len(UNITS), reason="not-reduced", what="backward 2's "
                  "reduce-scatters")  # fmt: skip
    with ddp.no_sync():
        ddp(*micro[0])[1].backward()
    ddp(*micro[1])[1].backward()
    result = _compare(fsdp, _slices(_by_name(ddp), fsdp, ctx), ctx, "accumulated")

    mixed = fsdp2_gpt(ctx, mp_policy=_policy("bfloat16", "float32"))
    mixed.set_requires_gradient_sync(False)
    mixed(*micro[0])[1].backward()
    stage = fsdp2_precision.stages("float32", "bfloat16", "float32")
    waiting_mixed = _unsharded_grads(mixed)
    # The dtype is the behaviour; which attribute holds the waiting gradient is torch's bookkeeping (2.13 moves
    # it to `unsharded_accumulated_grad`, 2.15 keeps it on the parameter), returned but not required.
    expected = {"dtypes": [stage.accumulated]}
    require_equal({k: waiting_mixed[k] for k in expected}, expected, reason="accumulated-dtype-differs",
                  what="bf16/fp32: the gradient waiting between micro-batches")  # fmt: skip
    return {"waiting": waiting, "waiting_mixed": waiting_mixed, **result}


# -- a unit used twice ------------------------------------------------------------------------------------------
TWICE = (0, 1, 1, 2)  # blocks.1 runs twice


def _twice_models(ctx: RankContext, setting: bool | None) -> tuple[nn.Module, nn.Module]:
    """mini_gpt whose forward runs blocks 0, 1, 1, 2 (`ReorderableGPT`, guide 04), under FSDP2 and under DDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from checks.workloads.reorderable import ReorderableGPT

    models = []
    for _ in range(2):
        model = ReorderableGPT(preset("tiny"), seed=0).to(ctx.device)
        model.blocks.order = list(TWICE)
        models.append(model)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    kwargs = {} if setting is None else {"reshard_after_forward": setting}
    for block in models[0].blocks._modules.values():
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(models[0], mesh=mesh, **kwargs), wrap_ddp(models[1], ctx)


def unit_used_twice(ctx: RankContext) -> dict[str, Any]:
    """blocks.1 run twice in forward, under True and None: the post-forward order holds it twice; forward
    all-gathers every use, backward every use again (blocks.1's first post-backward, which finds no gradient
    yet, reshards it without reducing), and each unit is reduce-scattered once, as `repeated_use_step` says;
    the sharded gradients are bitwise DDP's slices."""
    from checks.probes import record_events

    uses = [f"blocks.{i}" for i in TWICE]
    sizes = padded(ctx.world_size)
    out: dict[str, Any] = {}
    for label, setting in (("True", True), ("None", None)):
        fsdp, ddp = _twice_models(ctx, setting)
        x, y = batch(ctx)
        with record_events(fsdp) as events:
            with record_comm() as forward:
                loss = fsdp(x, y)[1]
            order = [unit_name(g._module_fqn) for g in fsdp._get_fsdp_state()._comm_ctx.post_forward_order]
            with record_comm() as backward:
                loss.backward()
        ddp(x, y)[1].backward()
        want = fsdp2_reshard.repeated_use_step(uses, ROOT, setting)
        where = {"setting": label}
        require_equal(order, [*uses, ROOT], reason="post-forward-order", what=f"{label}: post-forward order", **where)
        observed = {
            "forward": [c.numel for c in forward.select("all_gather")],
            "backward": [c.numel for c in backward.select("all_gather")],
            "reduce_scatter": [c.numel for c in backward.select("reduce_scatter")],
        }
        expected = {phase: [sizes[u] for u in units] for phase, units in want.items()}
        require_equal(observed, expected, reason="collectives-differ", what=f"{label}: collectives (elements)",
                      **where)  # fmt: skip
        hooks = [e.describe() for e in events if e.kind in ("post_backward", "reduce_grad") and e.unit == "blocks.1"]
        require_equal(hooks, ["post_backward blocks.1", "post_backward blocks.1", "reduce_grad blocks.1"],
                      reason="hooks-differ", what=f"{label}: blocks.1's post-backwards", **where)  # fmt: skip
        result = _compare(fsdp, _slices(_by_name(ddp), fsdp, ctx), ctx, f"used twice, {label}")
        out[label] = {"post_forward": order, **{k: len(v) for k, v in observed.items()}, **result}
    return out


# -- training ------------------------------------------------------------------------------------------------------
def five_adamw_steps(ctx: RankContext, steps: int = 5) -> dict[str, Any]:
    """``steps`` AdamW steps of mini_gpt tiny under FSDP2, FSDP1 FULL_SHARD and DDP, each on the same per-rank
    batches: every loss, and every parameter after the last step, bitwise the same in all three."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    models = {"fsdp2": fsdp2_gpt(ctx), "fsdp1": fsdp1_gpt(ctx), "ddp": ddp_gpt(ctx)}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for step in range(steps):
        x, y = batch(ctx, step=step)
        for key, model in models.items():
            loss = model(x, y)[1]
            loss.backward()
            optims[key].step()
            optims[key].zero_grad()
            losses[key].append(loss.item())
    for key in ("fsdp2", "fsdp1"):
        require_equal(losses[key], losses["ddp"], reason="losses-differ", what=f"{key} losses against DDP's", impl=key)
    full = {"ddp": {n.removeprefix("module."): p.detach().clone() for n, p in models["ddp"].named_parameters()},
            "fsdp2": {n: p.full_tensor().detach() for n, p in models["fsdp2"].named_parameters()}}  # fmt: skip
    with FSDP.summon_full_params(models["fsdp1"]):
        full["fsdp1"] = {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                         for n, p in models["fsdp1"].named_parameters()}  # fmt: skip
    for key in ("fsdp2", "fsdp1"):
        differs = [n for n, p in full["ddp"].items() if not torch.equal(full[key][n], p)]
        require(not differs, "parameters-differ", f"{key}: parameters after {steps} steps differ from DDP's: "
                f"{differs}", impl=key, differs=differs)  # fmt: skip
    return {"losses": losses["ddp"], "parameters": len(full["ddp"])}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ------------------------
def root_resharded_anyway(original: Any, state: Any) -> None:
    """``FSDPState._lazy_init`` that gives the root its post-forward mesh back: the default reshards the root."""
    keep = {id(g): g.post_forward_mesh_info for g in state._fsdp_param_groups}
    original(state)
    for group in state._fsdp_param_groups:
        if group.post_forward_mesh_info is None and keep[id(group)] is not None:
            group.post_forward_mesh_info = keep[id(group)]


def int_n_means_false(original: Any, reshard_after_forward: Any, mesh_info: Any) -> Any:
    """``_get_post_forward_mesh_info`` that reads an int equal to the shard world size as ``False``."""
    if not isinstance(reshard_after_forward, bool) and reshard_after_forward == mesh_info.shard_mesh_size:
        return None
    return original(reshard_after_forward, mesh_info)


def silent_int_one(original: Any, reshard_after_forward: Any, mesh_info: Any) -> Any:
    """``_get_post_forward_mesh_info`` that maps an int 1 to ``False`` without logging."""
    if not isinstance(reshard_after_forward, bool) and reshard_after_forward == 1:
        return None
    return original(reshard_after_forward, mesh_info)


def reshard_fully(original: Any, group: Any) -> None:
    """``FSDPParamGroup._to_sharded_post_forward`` replaced by a full reshard: an int behaves as ``True``."""
    group._to_sharded()


def sum_without_divide(original: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``_get_gradient_divide_factors`` that asks for a plain SUM and divides nowhere: a sum, not a mean."""
    from torch.distributed import ReduceOp

    return None, None, ReduceOp.SUM, ReduceOp.SUM


def never_divide(original: Any, tensor: Any, div_factor: Any) -> None:
    """``_div_if_needed`` that never divides."""


def reduce_dtype_ignored(original: Any, fsdp_param: Any, mp_policy: Any) -> None:
    """``FSDPParam.init_dtype_attrs`` with the policy's ``reduce_dtype`` dropped."""
    original(fsdp_param, dataclasses.replace(mp_policy, reduce_dtype=None))


def reduce_in_bf16(original: Any, fsdp_param: Any, mp_policy: Any) -> None:
    """``FSDPParam.init_dtype_attrs`` that reduces every gradient in bf16 whatever the policy says."""
    original(fsdp_param, dataclasses.replace(mp_policy, reduce_dtype=torch.bfloat16))


def sync_ignored(original: Any, module: Any, requires_gradient_sync: bool, **kwargs: Any) -> None:
    """``set_requires_gradient_sync`` that does nothing: every backward reduce-scatters."""


def keep_unsharded_after_forward(original: Any, group: Any) -> None:
    """``FSDPParamGroup.reshard`` that does nothing in forward: every setting behaves as False."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if group._training_state == TrainingState.FORWARD:
        return None
    return original(group)


def reduce_every_post_backward(original: Any, group: Any, *args: Any) -> None:
    """``FSDPParamGroup.post_backward`` with ``reduce_scatter_unused_params`` on: a post-backward that finds no
    gradient reduce-scatters zeros instead of returning."""
    group.reduce_scatter_unused_params = True
    return original(group, *args)


def keep_unsharded_after_backward(original: Any, group: Any, *args: Any) -> None:
    """``FSDPParamGroup.post_backward`` that does not reshard (``reshard_after_backward`` off)."""
    group.reshard_after_backward = False
    return original(group, *args)


def reduce_in_gradient_dtype(original: Any, group: Any, fsdp_params: Any, grads: Any) -> Any:
    """``FSDPParamGroup._get_reduce_dtype`` (2.15) as 2.13 chose: the policy's reduce dtype, else the gradients'
    own dtype (``reduce_dtype or grad_dtype``), so bf16 compute reduces in bf16 again."""
    return group._reduce_dtype or grads[0].dtype


def upcast_always_deferred(original: Any, group: Any, defer_upcast: bool) -> None:
    """``FSDPParamGroup._set_unsharded_grad_dtypes`` (2.15) always in its deferring branch: it never casts a waiting
    gradient up, and switches autograd's cast off once a gradient exists or the group reduces, so after a synced
    step a gradient computed in bf16 waits in bf16."""
    return original(group, defer_upcast=True)


def grad_dtype_unset(original: Any, fsdp_param: Any) -> None:
    """``FSDPParam.init_unsharded_param`` (2.15) without the ``grad_dtype`` it sets: autograd adds a tied weight's
    gradients in fp32 again, and the copy-in rounds the sum."""
    original(fsdp_param)
    if (param := getattr(fsdp_param, "_unsharded_param", None)) is not None:
        param.grad_dtype = None


def grad_dtype_is_reduce_dtype(original: Any, fsdp_param: Any) -> None:
    """``FSDPParam.init_unsharded_param`` (2.13) that sets 2.15's ``grad_dtype``, the reduce dtype: autograd rounds
    each of a tied weight's gradients before it adds them."""
    original(fsdp_param)
    param = getattr(fsdp_param, "_unsharded_param", None)
    if param is not None and fsdp_param.reduce_dtype is not None:
        param.grad_dtype = fsdp_param.reduce_dtype
