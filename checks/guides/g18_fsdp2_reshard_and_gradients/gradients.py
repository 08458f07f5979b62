"""Gradient reduction: AVG in fp32, bitwise DDP's slices; the SUM paths (a forced sum, an fp16 reduce dtype),
bitwise the formula's; and the tied weight's two gradients under fp16, rounded as the release's rule says."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import torch
from torch import nn

from checks.expected import Expected, Row
from checks.guides.g18_fsdp2_reshard_and_gradients.reductions import (
    DTYPES,
    compare_to_slices,
    divide_factors_seen,
    grads_by_name,
    rank_slices,
)
from checks.guides.g18_fsdp2_reshard_and_gradients.units import UNITS
from checks.models import fsdp2_precision
from checks.models.divide_factors import fsdp2_factors
from checks.models.fsdp2_shards import row_range
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp2_gpt
from mini_gpt import GPT, preset


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
    result = compare_to_slices(fsdp, rank_slices(grads_by_name(ddp), fsdp, ctx), ctx, "fp32")
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
    compared = compare_to_slices(forced, rank_slices(grads_by_name(ddp), forced, ctx), ctx, "force-sum")
    out["force-sum"] = {"factors": list(seen[0]), **compared}

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
                   **compare_to_slices(half, rank_slices(formula, half, ctx), ctx, "fp16")}  # fmt: skip
    return out


ORDERS = {"float16": "round-each", "float32": "sum-then-round"}  # the tied weight's uses added in fp16, or in fp32


def _tied_figures(formulas: dict[str, torch.Tensor], ctx: RankContext, element: tuple[int, int]) -> list[str]:
    """The guide's figures for the two orders, from the formulas alone, as its rows' values: how many elements they
    differ on, in all and in each rank's rows, and both values of one element."""
    first, second = formulas["sum-then-round"], formulas["round-each"]
    differ = first != second
    rows = [row_range(tuple(first.shape), ctx.world_size, r) for r in range(ctx.world_size)]
    per_rank = ", ".join(
        f"{int(differ[lo:hi].sum()):,} in rank {r}'s" + (" rows" if r == 0 else "") for r, (lo, hi) in enumerate(rows)
    )
    i, j = element
    return [
        f"{first.numel():,} elements, {int(differ.sum()):,} differ: {per_rank}",
        f"sum-then-round {first[i, j].item()!r}  round-each {second[i, j].item()!r}",
    ]


def require_counts_near(seen: str, expected: Expected, row: Row, slack: int) -> None:
    """The counts against the guide's ``row`` (its value): the same words, the same element count, and each count
    of differing elements within ``slack`` of the guide's. The counts rest on the last bits of fp32 gradients,
    which the CPU's matrix kernels set (one element apart between two machines here; the guide says so and gives
    the slack)."""
    number = re.compile(r"\d[\d,]*")
    words = [" ".join(number.sub("#", line).split()) for line in (seen, row.value)]
    got, want = ([int(n.replace(",", "")) for n in number.findall(line)] for line in (seen, row.value))
    expected.require(words[0] == words[1], row, "figures-differ", f"the two orders' counts line (its words): "
                     f"{words[0]!r}, expected {words[1]!r}", observed=words[0], expected=words[1])  # fmt: skip
    far = [(g, w) for g, w in zip(got[1:], want[1:], strict=True) if abs(g - w) > slack]
    expected.require(got[0] == want[0] and not far, row, "figures-differ", f"the two orders' counts: {seen!r}, the "
                     f"guide's {row.value!r} (counts may differ by {slack})", observed=got, expected=want,
                     slack=slack)  # fmt: skip


def tied_fp16(ctx: RankContext, release: str, expected: Expected, count_slack: int) -> dict[str, Any]:
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
    counts_row = expected.row("counts")
    (element_row,) = [row for row in expected if row is not counts_row]  # its key is the element, `[i, j]`
    i, j = json.loads(element_row.key)
    counts, values = _tied_figures(formulas, ctx, (i, j))
    require_counts_near(counts, expected, counts_row, count_slack)
    stated = " ".join(element_row.value.split())
    expected.require(" ".join(values.split()) == stated, element_row, "figures-differ", f"the two orders' values of "
                     f"{element_row.key}: {values!r}, the guide's {stated!r}", observed=" ".join(values.split()),
                     expected=stated)  # fmt: skip
    want = ORDERS[fsdp2_precision.stages("float32", None, "float16", release=release).uses_added_in]
    lo, hi = row_range(tuple(formulas[want].shape), ctx.world_size, ctx.rank)
    matches = sorted(order for order, f in formulas.items() if torch.equal(local, f[lo:hi]))
    differ = {order: int((local != f[lo:hi]).sum()) for order, f in formulas.items()}
    require_equal(matches, [want], reason="tied-order-differs", what=f"rank {ctx.rank}: the orders FSDP's "
                  "tok_emb.weight shard equals bitwise", differ=differ)  # fmt: skip
    value = local[i - lo, j].item() if lo <= i < hi else None
    return {"order": want, "differ": differ, "element": value}
