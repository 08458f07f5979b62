"""Checks for guide 21, the seeds' strategy table row by row: DDP, ZeRO-1/2/3 and FSDP, tensor parallel, pipeline
parallel and FSDP over tensor parallel, each row's communication per step and memory, measured.

Expected values come from the torch-free models, never from the runs: `checks.models.cost` (the collectives of a
data-parallel step, built on `checks.models.comm_volume`), `checks.models.zero_memory` (bytes per category),
`checks.models.tensor_parallel` (shards and all-reduces of a Megatron block), `checks.models.pipeline` (stage
orders, slots, transfers); the guide's expect blocks hold the numbers it states; references for numerics are the
unsharded module or one process on the whole batch.

What the probes see: every collective at the dispatcher (`record_comm`; DTensor's all-reduces are
``_c10d_functional::all_reduce``, pipelining's sends and receives ``c10d::send`` / ``c10d::recv_`` with their
peer), witnessed by gloo's own profiler events; each pipeline stage's forwards and backwards in call order
(`checks.probes.stages`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from checks.models import pipeline as pl
from checks.models import tensor_parallel as tpm
from checks.models.comm_volume import fsdp2_padded, sharded_step
from checks.models.cost import Plan, collectives
from checks.models.zero_memory import per_rank
from checks.probes import clock
from checks.probes.comm import CommLog, record_comm
from checks.probes.stages import actions, held_at_most, record_stage_actions
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.data_parallel import CATEGORIES, Trained, build, held_bytes
from checks.workloads.gpt import batch, parameters_of_tiny

# -- data-parallel rows: DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP ---------------------------------------------------------
# The cost model's name for each implementation guide 13 builds (its FSDP2 keeps the default reshard_after_forward).
COST_NAME = {"fsdp2": "fsdp2-default"}
PHASES = ("forward", "backward", "step")
SHARE_TOLERANCE = Fraction(1, 50)  # a category is "1/N" within 2% of DDP's bytes / N (padding, step scalars, greedy)


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


def _ratio(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _comm_lines(impl: str, counts: list[tuple[str, str, int, int]], of_ddp: Fraction) -> list[str]:
    """One line per phase that communicates (its ops and counts), then the ring bytes as a multiple of DDP's:
    short rows, so each fits the 78 cells a reader's terminal shows."""
    lines = []
    for phase in PHASES:
        parts = [f"{count} {op.replace('_', '-')}{'s' if count > 1 else ''}"
                 for p, op, count, _ in counts if p == phase]  # fmt: skip
        if parts:
            lines.append(f"{impl} {phase}: {', '.join(parts)}")
    return [*lines, f"{impl} ring bytes: {_ratio(of_ddp)} × DDP's"]


def _share(held: int, ddp: int, world_size: int) -> str:
    """``whole`` or ``1/N`` for a category, against DDP's bytes of it (see `SHARE_TOLERANCE`)."""
    ratio = Fraction(held, ddp)
    if abs(ratio - 1) <= SHARE_TOLERANCE:
        return "whole"
    if abs(ratio * world_size - 1) <= SHARE_TOLERANCE:
        return "1/N"
    return f"{float(ratio):.3f}"


def data_parallel_row(ctx: RankContext, impls: list[str], expected: list[str]) -> dict[str, Any]:
    """Each implementation (guide 13's, on mini_gpt tiny) runs a steady step: its collectives per phase are the
    cost model's (count and elements per op, forward / backward / step), its ring-model bytes per rank the model's
    exactly, and what each rank holds after it is `zero_memory`'s, by category, exactly. The guide's lines
    (``expected``) say it shorter: the collectives per phase, their ring bytes as a multiple of DDP's, and which
    categories each rank holds whole or 1/N."""
    n = ctx.world_size
    params = parameters_of_tiny()
    ddp_ring = _model_counts("ddp", n)[2]
    ddp_memory = per_rank("ddp", params, n, ctx.rank).by_category()
    lines: list[str] = []
    report: dict[str, Any] = {}
    for impl in impls:
        trained = build(impl, ctx)
        logs = _steady_step(trained, ctx)
        want_counts, want_numels, want_ring = _model_counts(impl, n)
        got_counts, got_numels = _observed_counts(logs)
        require_equal(dict(got_counts), dict(want_counts), reason="collectives-differ-from-model",
                      what=f"{impl}: collectives per (op, in backward)", impl=impl)  # fmt: skip
        require_equal(dict(got_numels), dict(want_numels), reason="elements-differ-from-model",
                      what=f"{impl}: elements per (op, in backward)", impl=impl)  # fmt: skip
        ring = Fraction(sum(sum(Fraction(c.ring_bytes) for c in log) for log in logs.values()))
        require_equal(ring, want_ring, reason="ring-bytes-differ-from-model", what=f"{impl}: ring bytes per rank",
                      impl=impl)  # fmt: skip
        held = held_bytes(trained)
        want_memory = per_rank(impl, params, n, ctx.rank).by_category()
        got_memory = {c: held[c] for c in CATEGORIES}
        require_equal(got_memory, want_memory, reason="memory-differs-from-model",
                      what=f"{impl}: bytes by category on rank {ctx.rank}", impl=impl)  # fmt: skip
        counts = _phase_counts(logs)
        lines += _comm_lines(impl, counts, ring / ddp_ring)
        shares = [f"{c} {_share(got_memory[c], ddp_memory[c], n)}" for c in ("params", "grads", "optim")]
        lines.append(f"{impl} memory: {', '.join(shares)}")
        report[impl] = {"ring_bytes": float(ring), "of_ddp": _ratio(ring / ddp_ring), "memory": got_memory,
                        "memory_of_ddp": float(Fraction(sum(got_memory.values()), sum(ddp_memory.values()))),
                        "collectives": counts}  # fmt: skip
        del trained
    require_equal(lines, expected, reason="row-differs-from-guide", what="the row's lines")
    return {"lines": lines, "impls": report}


# -- tensor parallel: a Megatron block of our own -----------------------------------------------------------------
D_MODEL, HEADS, HIDDEN = 16, 4, 64
LR_TP = 0.1  # SGD: AdamW would turn the key bias's rounding-noise gradient into full-size steps (m/√v)
# 2 sequences of 8 tokens per tensor-parallel group (2D: 2 of 4 per dp rank): every all-reduce is 16 tokens ×
# D_MODEL = 256 elements, as many as a q/k/v/o weight, so size cannot tell a payload from a parameter:
# `PayloadWitness` matches each collective's storage instead.
TP_BATCH, TP_SEQ = 2, 8


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v projections (mini_gpt's fused ``qkv`` cannot be split
    column-wise without mixing q, k and v on one rank); heads taken from the width it is given (``-1``), so the
    same code runs on a rank's share of them."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.head_dim = d_model // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int = D_MODEL, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A pre-LN transformer block: the residual stream plus attention, plus an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(D_MODEL), Attention()
        self.ln_2, self.mlp = nn.LayerNorm(D_MODEL), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def block(seed: int = 0) -> Block:
    """The block with weights from ``seed`` alone (the same on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Block()


def block_regions(prepared: bool) -> list[tpm.Region]:
    """The block as the tensor-parallel model sees it: attention, then the MLP."""
    return [tpm.attention(D_MODEL, prepared_input=prepared), tpm.mlp(D_MODEL, HIDDEN)]


def _tp_plan(prepared: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    plan: dict[str, Any] = {f"attn.{p}": ColwiseParallel() for p in "qkv"}
    plan |= {"attn.o": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    if prepared:  # one DTensor for q, k and v: their three partial input gradients add up before one all-reduce
        plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                          use_local_output=False)  # fmt: skip
    return plan


def tp_block(ctx: RankContext, prepared: bool = False, seed: int = 0, mesh: Any = None) -> Block:
    """The block under ``parallelize_module`` on a 1-D mesh of every rank (or ``mesh``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    model = block(seed).to(ctx.device)
    mesh = mesh if mesh is not None else init_device_mesh(ctx.device.type, (ctx.world_size,))
    plan = _tp_plan(prepared)
    if "attn" in plan:  # the region's input first, so q, k and v receive the DTensor it makes
        parallelize_module(model.attn, mesh, plan.pop("attn"))
    return parallelize_module(model, mesh, plan)


def tp_input(ctx: RankContext, step: int = 0, requires_grad: bool = True, batch_size: int = TP_BATCH) -> torch.Tensor:
    """The same input on every tensor-parallel rank (each sees the whole batch)."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch_size, TP_SEQ, D_MODEL, generator=generator).to(ctx.device)
    return x.requires_grad_(requires_grad)


class PayloadWitness:
    """The storages the tensor-parallel all-reduces must move, seen from outside torch's code: the local tensor of
    each row-wise layer's ``Partial`` output (a forward hook that runs before the style's own output hook), and of
    each ``Partial`` gradient arriving at a column-wise input (a tensor hook on the DTensor the style's input hook
    made, or the ``PrepareModuleInput``'s). Each sighting is stamped on the probes' clock: a freed storage's
    address is reused, so a collective is matched with the latest sighting of its storage before it."""

    def __init__(self, model: Block, prepared: bool) -> None:
        self.seen: list[tuple[int, int, str, str]] = []  # (seq, storage, layer, "output" | "input gradient")
        self._handles = [m.register_forward_hook(self._output(name), prepend=True)
                         for name, m in (("attn.o", model.attn.o), ("mlp.proj", model.mlp.proj))]  # fmt: skip
        entries = [("attn", model.attn)] if prepared else [(f"attn.{p}", getattr(model.attn, p)) for p in "qkv"]
        for name, module in [*entries, ("mlp.fc", model.mlp.fc)]:
            self._handles.append(module.register_forward_pre_hook(self._input(name)))

    def _note(self, tensor: Any, layer: str, kind: str) -> None:
        local = getattr(tensor, "_local_tensor", tensor)  # a plain tensor where no style made a DTensor
        self.seen.append((clock.tick(), local.untyped_storage().data_ptr(), layer, kind))

    def _output(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._note(output, name, "output")

        return hook

    def _input(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            args[0].register_hook(lambda grad: self._note(grad, name, "input gradient"))

        return hook

    def moved(self, collective: Any) -> tuple[str, str]:
        """(layer, what) whose tensor ``collective`` moved, or ("", "another tensor")."""
        before = [s for s in self.seen if s[0] < collective.seq and s[1] == collective.storages[0]]
        return (before[-1][2], before[-1][3]) if before else ("", "another tensor")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def tp_collectives(ctx: RankContext, prepared: bool, expected: list[str]) -> dict[str, Any]:
    """One forward and one backward of the block under tensor parallelism: its collectives are the model's, in
    order (each an fp32 all-reduce of tokens × d_model elements on the tensor-parallel group), and each moves the
    tensor the model names: in forward the row-wise layer's partial output, in backward the partial gradient of
    a column-wise input, never a parameter. ``expected``: the guide's lines, one per collective."""
    model = tp_block(ctx, prepared)
    witness = PayloadWitness(model, prepared)
    with record_comm() as comm:
        loss = model(tp_input(ctx)).sum()
        loss.backward()
    witness.remove()
    tokens = TP_BATCH * TP_SEQ
    want = tpm.collectives(block_regions(prepared), tokens, ctx.world_size)
    got = [(c.op, c.numel, c.dtype.removeprefix("torch."), c.in_backward) for c in comm]
    require_equal(got, [(o.op, o.numel, "float32", o.backward) for o in want], reason="collectives-differ-from-model",
                  what="(op, elements, dtype, in backward) of every collective, in order")  # fmt: skip
    moved = [witness.moved(c) for c in comm]
    require_equal([(layer.split(".")[0], what) for layer, what in moved], [(o.region, o.tensor) for o in want],
                  reason="wrong-tensor-all-reduced", what="(region, tensor) each all-reduce moved",
                  moved=moved)  # fmt: skip
    groups = {c.group_ranks for c in comm}
    require_equal(groups, {tuple(range(ctx.world_size))}, reason="wrong-group", what="the groups all-reduced over")
    lines = [f"{'backward' if c.in_backward else 'forward'}: all-reduce {c.numel} of the {layer} {what}"
             for c, (layer, what) in zip(comm, moved, strict=True)]  # fmt: skip
    require_equal(lines, expected, reason="collectives-differ-from-guide", what="the collectives, as the guide says")
    ring = tpm.step_ring_bytes(want, 4, ctx.world_size)
    require_equal(Fraction(sum(Fraction(c.ring_bytes) for c in comm)), ring, reason="ring-bytes-differ-from-model",
                  what="ring bytes per rank")  # fmt: skip
    return {"lines": lines, "count": len(got), "backward_count": sum(c.in_backward for c in comm),
            "ring_bytes": float(ring), "callers": sorted({c.caller for c in comm})}  # fmt: skip


def tp_shards(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """After ``parallelize_module`` every Linear parameter is a DTensor with the model's placement and local
    shape, and its local tensor is, bit for bit, this rank's ``torch.chunk`` of the unsharded parameter along the
    placement's dimension (all of it when replicated); LayerNorms stay plain tensors. Bytes per rank are the
    model's. ``expected``: the guide's lines, one per parameter."""
    from torch.distributed.tensor import DTensor

    reference = dict(block().named_parameters())
    model = tp_block(ctx)
    linears = [lin for region in block_regions(False) for lin in region.linears]
    want = {s.name: s for s in tpm.shards(linears, ctx.world_size)}
    lines, held = [], 0
    for name, param in model.named_parameters():
        if name not in want:
            require(not isinstance(param, DTensor), "not-a-linear-sharded", f"{name} is a DTensor", name=name)
            require(torch.equal(param, reference[name]), "replica-differs", f"{name} differs", name=name)
            continue
        spec = want[name]
        placement = repr(param.placements[0])
        local = param.to_local()
        require_equal((placement, tuple(param.shape), tuple(local.shape)), (spec.placement, spec.shape,
                      spec.local_shape), reason="shard-differs-from-model", what=f"{name}: placement, global and "
                      "local shape", name=name)  # fmt: skip
        expected_local = _chunk_of(reference[name], placement, ctx.rank, ctx.world_size)
        require(torch.equal(local, expected_local), "wrong-slice", f"{name}: rank {ctx.rank} holds another slice of "
                "the unsharded parameter", name=name)  # fmt: skip
        held += local.numel() * local.element_size()
        lines.append(f"{name}: {placement} {'x'.join(map(str, local.shape))}")
    want_bytes = 4 * sum(s.local_numel for s in want.values())
    require_equal(held, want_bytes, reason="bytes-differ-from-model", what="bytes of the Linear shards on this rank")
    require_equal(lines, expected, reason="shards-differ-from-guide", what="the shards, as the guide says")
    full = 4 * sum(p.numel() for name, p in reference.items() if name in want)
    return {"lines": lines, "bytes": held, "unsharded_bytes": full}


def _chunk_of(full: torch.Tensor, placement: str, rank: int, world_size: int) -> torch.Tensor:
    if placement.startswith("Shard"):
        dim = int(placement.split("dim=")[1].rstrip(")"))
        return full.chunk(world_size, dim=dim)[rank]
    return full


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _relative_errors(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Each tensor's largest element difference, relative to its own largest magnitude; a gradient's relative to
    the largest gradient element of the whole block, since some gradients are zero but for rounding (a key's bias:
    softmax ignores a constant added to every score of a row)."""
    grad_scale = max((float(w.abs().max()) for k, (_, w) in pairs.items() if k.endswith(".grad")), default=0.0)
    out = {}
    for what, (got, want) in pairs.items():
        scale = grad_scale if what.endswith(".grad") else float(want.abs().max())
        out[what] = float((got.double() - want.double()).abs().max()) / scale
    return out


def _require_close(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], tolerance: float, step: int,
                   worst: dict[str, float]) -> None:  # fmt: skip
    for what, error in _relative_errors(pairs).items():
        worst[what] = max(worst.get(what, 0.0), error)
        require(error <= tolerance, "not-equivalent", f"step {step}: {what} differs from the unsharded block's by "
                f"{error:.3g} of its scale", step=step, what=what, error=error, tolerance=tolerance)  # fmt: skip


def tp_equivalence(ctx: RankContext, tolerance: float, steps: int = 3, prepared: bool = True) -> dict[str, Any]:
    """``steps`` SGD steps of the block under tensor parallelism against the unsharded block, same inputs: the
    output, the input's gradient, every parameter's gradient and every parameter after the step agree within
    ``tolerance`` (of each tensor's largest magnitude; of the block's largest gradient element for gradients); the
    worst relative error is reported."""
    reference, model = block().to(ctx.device), tp_block(ctx, prepared)
    optims = [torch.optim.SGD(m.parameters(), lr=LR_TP) for m in (reference, model)]
    named = dict(reference.named_parameters())
    worst: dict[str, float] = {}
    for step in range(steps):
        x_ref, x_tp = tp_input(ctx, step), tp_input(ctx, step)
        y_ref, y_tp = reference(x_ref), model(x_tp)
        y_ref.square().mean().backward()
        y_tp.square().mean().backward()
        pairs = {"output": (y_tp.detach(), y_ref.detach()), "input.grad": (x_tp.grad, x_ref.grad)}
        pairs |= {f"{n}.grad": (_full(p.grad), named[n].grad) for n, p in model.named_parameters()}
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        pairs |= {n: (_full(p.detach()), named[n].detach()) for n, p in model.named_parameters()}
        _require_close(pairs, tolerance, step + 1, worst)
    return {"worst": max(worst.values()), "worst_by_tensor": worst}


# -- pipeline parallel ----------------------------------------------------------------------------------------------
PP_WIDTH, PP_LAYERS, PP_BATCH, MICROBATCHES = 16, 8, 8, 4  # a microbatch is 2 × 16: 32 elements per activation


def pp_layers(seed: int = 0) -> nn.Sequential:
    """Eight Linear(16, 16) + Tanh layers, weights from ``seed`` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(*(nn.Sequential(nn.Linear(PP_WIDTH, PP_WIDTH), nn.Tanh()) for _ in range(PP_LAYERS)))


def _pp_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().mean()


def pp_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2000 + step)
    return torch.randn(PP_BATCH, PP_WIDTH, generator=generator), torch.randn(PP_BATCH, PP_WIDTH, generator=generator)


def stage_slice(stage: int, stages: int) -> slice:
    per = PP_LAYERS // stages
    return slice(stage * per, (stage + 1) * per)


class Pipeline:
    """This rank's stage of the eight layers, one stage per rank, under ``schedule`` with m microbatches."""

    def __init__(self, ctx: RankContext, schedule: str, microbatches: int = MICROBATCHES) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.ctx, self.stages = ctx, ctx.world_size
        self.module = pp_layers()[stage_slice(ctx.rank, self.stages)].to(ctx.device)
        self.stage = PipelineStage(self.module, ctx.rank, self.stages, ctx.device)
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = kind(self.stage, n_microbatches=microbatches, loss_fn=_pp_loss)

    def step(self, step: int) -> list[float]:
        """One pipeline step on batch ``step``: the first stage feeds the input, the last the target; the last
        returns each microbatch's loss."""
        x, y = pp_data(step)
        losses: list[torch.Tensor] = []
        if self.ctx.rank == 0:
            self.schedule.step(x.to(self.ctx.device))
        elif self.ctx.rank == self.stages - 1:
            self.schedule.step(target=y.to(self.ctx.device), losses=losses)
        else:
            self.schedule.step()
        return [float(v.detach()) for v in losses]


def _transfer(c: Any) -> tuple[str, int, int, str]:
    return (c.op, c.peer, c.numel, c.dtype.removeprefix("torch."))


def _model_transfer(t: pl.Transfer) -> tuple[str, int, int, str]:
    return (t.direction, t.peer, t.numel, "float32")


def _on_every_rank(ctx: RankContext, local_checks: Callable[[], Any]) -> Any:
    """Run this rank's checks, then fail on every rank with the lowest failing rank's `Violation`: a stage's
    finding is its own, and a rank that raised alone would leave the others waiting in the next collective."""
    try:
        value, failure = local_checks(), None
    except Violation as violation:
        value, failure = None, (violation.reason, str(violation), violation.details)
    first = next((f for f in ctx.gather(failure) if f is not None), None)
    if first is not None:
        reason, message, details = first
        raise Violation(reason, message, **details)
    return value


def pp_transfers(ctx: RankContext, schedule: str, expected: list[str], warmup_callers: list[str]) -> dict[str, Any]:
    """Two steps of the schedule on a pipeline of one stage per rank. Step 2: every collective is a send or a
    receive, and they are the model's for this stage's recorded order, as a multiset (op, peer, elements, dtype):
    one activation of a microbatch sent forward per forward, one gradient sent back per backward; the k-th
    activation receive is issued before F k runs and the k-th gradient receive before B k. Step 1 also exchanges
    metadata: the functions that communicate in step 1 and not in step 2 are exactly ``warmup_callers`` (the
    guide's list for this torch). ``expected``: the guide's per-stage lines."""
    pipe = Pipeline(ctx, schedule)
    with record_comm() as first:
        pipe.step(0)
    with record_comm() as comm, record_stage_actions(label=f"{schedule} step 2") as stage_log:
        pipe.step(1)
    extra = sorted({c.caller.rsplit(":", 1)[-1] for c in first} - {c.caller.rsplit(":", 1)[-1] for c in comm})
    order = [pl.Action(a[0], int(a[1:])) for a in actions(stage_log)]
    numel = (PP_BATCH // MICROBATCHES) * PP_WIDTH

    def local_checks() -> None:
        require_equal(
            extra,
            sorted(warmup_callers),
            reason="first-step-traffic-differs",
            what=f"stage {ctx.rank}: the callers that communicate in step 1 only",
            stage=ctx.rank,
        )
        want = pl.step_transfers(order, ctx.rank, ctx.world_size, numel)
        got = [_transfer(c) for c in comm]
        require_equal(
            Counter(got),
            Counter(_model_transfer(t) for t in want),
            reason="transfers-differ-from-model",
            what=f"stage {ctx.rank}: (op, peer, elements, dtype) of step 2's point-to-point traffic",
            stage=ctx.rank,
        )
        _require_received_in_time(comm, stage_log, ctx.rank)

    _on_every_rank(ctx, local_checks)  # fmt: skip
    counts = Counter((c.op, "activation" if _is_activation(c, ctx.rank) else "gradient") for c in comm)
    line = f"stage {ctx.rank}: " + "; ".join(_traffic_part(what, counts[("recv", what)], counts[("send", what)])
                                             for what in ("activation", "gradient")
                                             if counts[("recv", what)] or counts[("send", what)])  # fmt: skip
    line += f"; {numel} elements each"
    lines = ctx.gather(line)
    require_equal(lines, expected, reason="transfers-differ-from-guide", what="every stage's traffic per step")
    return {"lines": lines, "first_step_extra": extra, "sent_bytes": sum(c.nbytes for c in comm if c.op == "send"),
            "order": [str(a) for a in order]}  # fmt: skip


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


def pp_schedule(ctx: RankContext, schedule: str, torch_ir: list[str], expected: list[str]) -> dict[str, Any]:
    """The stages' recorded orders (the probes' record of their forwards and backwards), run one slot each,
    leave the bubble (p − 1)/(m + p − 1): every stage idle 2(p − 1) of 2(m + p − 1) slots. Each stage's order is
    exactly the model's for ``schedule``, and it holds at most the model's microbatches in flight. Torch's own
    ``pipeline_order`` has no idle (``None``) entry; without its REDUCE_GRAD (and 2.15's WAIT_REDUCE_GRAD) it is
    the guide's ``torch_ir``. ``expected``: the guide's lines on slots and bubble."""
    pipe = Pipeline(ctx, schedule)
    pipe.step(0)
    with record_stage_actions(label=f"{schedule} step 2") as stage_log:
        pipe.step(1)
    order = actions(stage_log)
    orders = ctx.gather(order)
    p, m = ctx.world_size, MICROBATCHES
    # The bubble first, from what ran: a schedule that runs another order may still leave the textbook bubble
    # (GPipe's and 1F1B's orders both do), and one that leaves another bubble is caught as such.
    slots = pl.simulate({r: [pl.Action(a[0], int(a[1:])) for a in o] for r, o in enumerate(orders)})
    written = {r: [str(a or ".") for a in row] for r, row in slots.items()}
    bubble = pl.bubble(slots)
    require_equal(bubble, pl.bubble_formula(p, m), reason="bubble-differs-from-formula",
                  what="idle slots over all slots", slots=written)  # fmt: skip
    model_orders = pl.orders(schedule, p, m)
    for stage, stage_order in enumerate(orders):
        require_equal(stage_order, [str(a) for a in model_orders[stage]], reason="order-differs-from-model",
                      what=f"stage {stage}: the order of its forwards and backwards", stage=stage)  # fmt: skip
    ir = pipe.schedule.pipeline_order or {}
    idle = {r: sum(1 for a in entries if a is None) for r, entries in ir.items()}  # every rank holds every rank's
    require(not any(idle.values()), "ir-has-idle-slots", f"pipeline_order holds None entries: {idle}",
            observed=idle)  # fmt: skip
    ir_lines = [f"rank {r}: " + " ".join(str(a).removeprefix(str(r)) for a in ir.get(r, [])
                                         if a is not None and "REDUCE_GRAD" not in str(a))
                for r in range(p)]  # fmt: skip
    require_equal(ir_lines, torch_ir, reason="ir-differs-from-guide", what="torch's pipeline_order, per rank")
    held = dict(enumerate(ctx.gather(held_at_most(stage_log))))
    want_held = {r: pl.in_flight(o) for r, o in model_orders.items()}
    require_equal(held, want_held, reason="in-flight-differs-from-model", what="microbatches held at once, by stage")
    lines = [f"{schedule}, p={p}, m={m}: {len(slots[0])} slots; bubble {_ratio(bubble)}",
             f"{schedule} idle slots: " + " ".join(str(pl.idle_slots(slots[r])) for r in sorted(slots)),
             f"{schedule} in flight: " + " ".join(str(held[r]) for r in sorted(held))]  # fmt: skip
    require_equal(lines, expected, reason="schedule-differs-from-guide", what="slots, bubble and microbatches held")
    return {"lines": lines, "order": order, "ir": ir_lines, "bubble": _ratio(bubble), "slots": written, "held": held}


def pp_equivalence(ctx: RankContext, steps: int = 2) -> dict[str, Any]:
    """GPipe and 1F1B against one process that accumulates the same microbatches' gradients and divides by m,
    ``steps`` SGD steps: each microbatch's loss is the one process's on that microbatch, and each stage's gradients
    and updated parameters are its layers' in the one process, bit for bit; so GPipe and 1F1B agree bitwise."""
    reference = pp_layers().to(ctx.device)
    mine = stage_slice(ctx.rank, ctx.world_size)
    report: dict[str, Any] = {}
    ref_optim = torch.optim.SGD(reference.parameters(), lr=0.1)
    pipes = {s: Pipeline(ctx, s) for s in pl.SCHEDULES}
    optims = {s: torch.optim.SGD(pipe.module.parameters(), lr=0.1) for s, pipe in pipes.items()}
    for step in range(steps):
        x, y = (t.to(ctx.device) for t in pp_data(step))
        ref_losses = []
        for xc, yc in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True):
            ref_losses.append(_pp_loss(reference(xc), yc))
            ref_losses[-1].backward()  # accumulated microbatch by microbatch, as a stage does ...
        for param in reference.parameters():
            param.grad.div_(MICROBATCHES)  # ... then divided by m, as `scale_grads` does
        want_grads = [p.grad.clone() for p in reference[mine].parameters()]
        ref_optim.step()
        ref_optim.zero_grad(set_to_none=True)
        want_params = [p.detach().clone() for p in reference[mine].parameters()]
        for schedule, pipe in pipes.items():
            losses = pipe.step(step)
            if ctx.rank == ctx.world_size - 1:
                require_equal(losses, [float(v) for v in ref_losses], reason="losses-differ",
                              what=f"{schedule} step {step + 1}: each microbatch's loss", schedule=schedule,
                              step=step + 1)  # fmt: skip
            grads = [p.grad for p in pipe.module.parameters()]
            differing = sum(int((g != w).sum()) for g, w in zip(grads, want_grads, strict=True))
            require(differing == 0, "gradients-differ", f"{schedule} step {step + 1}: {differing} gradient elements "
                    "differ from one process's", schedule=schedule, step=step + 1, observed=differing)  # fmt: skip
            optims[schedule].step()
            optims[schedule].zero_grad(set_to_none=True)
            after = [p.detach() for p in pipe.module.parameters()]
            differing = sum(int((a != w).sum()) for a, w in zip(after, want_params, strict=True))
            require(differing == 0, "parameters-differ", f"{schedule} step {step + 1}: {differing} parameter "
                    "elements differ", schedule=schedule, step=step + 1, observed=differing)  # fmt: skip
            report.setdefault(schedule, []).append(losses)
    return {"losses": report, "stage_parameters": sum(p.numel() for p in pipes["gpipe"].module.parameters())}


# -- 2D: FSDP2 over tensor parallel --------------------------------------------------------------------------------
DP, TP = 2, 2


_mesh_builds = itertools.count()


def _mesh_2d(ctx: RankContext) -> Any:
    """A fresh 2 × 2 mesh whose dimension names (``dp<k>``, ``tp<k>``) are this build's own. DTensor caches
    sharding decisions keyed by specs, and ``DeviceMesh.__eq__`` compares layouts, ranks and dimension names, not
    process groups: a spec cached by an earlier check on an equal mesh (whose groups the pool has destroyed since)
    would be handed to this one, and its collectives would name a destroyed group."""
    from torch.distributed.device_mesh import init_device_mesh

    build = next(_mesh_builds)
    return init_device_mesh(ctx.device.type, (DP, TP), mesh_dim_names=(f"dp{build}", f"tp{build}"))


def _dims(mesh: Any) -> tuple[Any, Any]:
    """(dp, tp) sub-meshes of a `_mesh_2d` mesh."""
    dp, tp = mesh.mesh_dim_names
    return mesh[dp], mesh[tp]


def fsdp_over_tp(ctx: RankContext, prepared: bool = True) -> tuple[Block, Any]:
    """The block under tensor parallelism on the mesh's ``tp`` dimension, then ``fully_shard`` on its ``dp``."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh_2d(ctx)
    dp_mesh, tp_mesh = _dims(mesh)
    model = tp_block(ctx, prepared, mesh=tp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model, mesh


def _ranks(rank: int) -> tuple[int, int]:
    """(dp, tp) coordinates of a global rank on the row-major 2 × 2 mesh."""
    return rank // TP, rank % TP


def two_d_placements(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """FSDP2 over tensor parallelism on a 2 × 2 mesh: each Linear parameter's placements and local shape, and
    its local tensor is bitwise the slice the model assigns to this rank's (dp, tp) coordinates (tensor parallel
    first, then FSDP's dim-0 chunk of that). ``expected``: the guide's lines."""
    model, _ = fsdp_over_tp(ctx)
    reference = dict(block().named_parameters())
    dp, tp = _ranks(ctx.rank)
    linears = [lin for region in block_regions(True) for lin in region.linears]
    lines = []
    for spec in tpm.shards(linears, TP):
        param = dict(model.named_parameters())[spec.name]
        want_local = tpm.fsdp_over_tp_local(spec, DP)
        placements = "(" + ", ".join(repr(p) for p in param.placements) + ")"
        require_equal(placements, tpm.fsdp_over_tp_placements(spec, TP), reason="placements-differ-from-model",
                      what=f"{spec.name}: placements (dp, tp)", name=spec.name)  # fmt: skip
        lines.append(f"{spec.name}: {placements} {'x'.join(map(str, param.to_local().shape))}")
        require_equal(tuple(param.to_local().shape), want_local, reason="local-shape-differs-from-model",
                      what=f"{spec.name}: local shape", name=spec.name)  # fmt: skip
        full = reference[spec.name]
        want = _chunk_of(_chunk_of(full, spec.placement, tp, TP), "Shard(dim=0)", dp, DP)
        require(torch.equal(param.to_local(), want), "wrong-slice", f"{spec.name}: rank {ctx.rank} (dp {dp}, tp {tp}) "
                "holds another slice", name=spec.name)  # fmt: skip
    require_equal(lines, expected, reason="placements-differ-from-guide", what="placements and local shapes")
    return {"lines": lines}


def _by_group(comm: CommLog, mesh: Any) -> dict[str, list[tuple[str, int, bool]]]:
    groups = {name: tuple(sub.mesh.tolist()) for name, sub in zip(("dp", "tp"), _dims(mesh), strict=True)}
    out: dict[str, list[tuple[str, int, bool]]] = {"dp": [], "tp": [], "other": []}
    for c in comm:
        dim = next((d for d, ranks in groups.items() if c.group_ranks == ranks), "other")
        out[dim].append((c.op, c.numel, c.in_backward))
    return out


def two_d_collectives(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """A steady step of FSDP2 over tensor parallelism: on the ``dp`` group only FSDP2's collectives of the
    tensor-parallel shards (the data-parallel model over the local shapes: the root unit all-gathered in forward,
    kept, reduce-scattered in backward); on the ``tp`` group only the block's all-reduces of activations (the
    tensor-parallel model on this rank's half of the batch); nothing else. ``expected``: the guide's lines."""
    model, mesh = fsdp_over_tp(ctx)
    dp, _ = _ranks(ctx.rank)
    for step in range(2):
        with record_comm() as comm:
            model(tp_input(ctx, step, batch_size=TP_BATCH * DP).chunk(DP)[dp]).sum().backward()
    seen = _by_group(comm, mesh)
    linears = [lin for region in block_regions(True) for lin in region.linears]
    local_shapes = [s.local_shape for s in tpm.shards(linears, TP)]
    norms = [(D_MODEL,)] * 4  # the LayerNorms' weights and biases: plain tensors to tp, sharded by FSDP
    padded = fsdp2_padded({"root": [*local_shapes, *norms]}, DP)
    dp_model = sharded_step(padded, set(), 4, DP)
    want_dp = [(o.op, o.numel, o.backward) for o in dp_model.ops]
    require_equal(seen["dp"], want_dp, reason="dp-collectives-differ-from-model",
                  what="collectives on the dp group (op, elements, in backward)")  # fmt: skip
    tokens = TP_BATCH * TP_SEQ
    want_tp = [(o.op, o.numel, o.backward) for o in tpm.collectives(block_regions(True), tokens, TP)]
    require_equal(seen["tp"], want_tp, reason="tp-collectives-differ-from-model",
                  what="collectives on the tp group (op, elements, in backward)")  # fmt: skip
    require_equal(seen["other"], [], reason="collective-on-another-group", what="collectives on neither group")
    lines = [f"dp {op} {numel}{' in backward' if bwd else ''}" for op, numel, bwd in seen["dp"]]
    lines += [f"tp {op} {numel}{' in backward' if bwd else ''}" for op, numel, bwd in seen["tp"]]
    require_equal(lines, expected, reason="collectives-differ-from-guide", what="each dimension's collectives")
    return {"lines": lines}


def two_d_equivalence(ctx: RankContext, tolerance: float, steps: int = 3) -> dict[str, Any]:
    """``steps`` SGD steps of FSDP2 over tensor parallelism, each dp rank on its half of the batch, against the
    unsharded block on the whole batch (loss: the mean over the batch): every parameter's gradient and value
    after each step agree within ``tolerance`` of its largest magnitude."""
    model, _ = fsdp_over_tp(ctx)
    reference = block().to(ctx.device)
    dp, _ = _ranks(ctx.rank)
    optims = [torch.optim.SGD(m.parameters(), lr=LR_TP) for m in (reference, model)]
    named = dict(reference.named_parameters())
    worst: dict[str, float] = {}
    for step in range(steps):
        x = tp_input(ctx, step, requires_grad=False, batch_size=TP_BATCH * DP)
        reference(x).square().mean().backward()
        model(x.chunk(DP)[dp]).square().mean().backward()  # FSDP2 averages the dp ranks' gradients
        pairs = {f"{n}.grad": (_full(p.grad), named[n].grad) for n, p in model.named_parameters()}
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        pairs |= {n: (_full(p.detach()), named[n].detach()) for n, p in model.named_parameters()}
        _require_close(pairs, tolerance, step + 1, worst)
    return {"worst": max(worst.values()), "worst_by_tensor": worst}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ------------------------
def colwise_bias_replicated(original: Callable[..., Any], self: Any, name: str, module: nn.Module,
                            device_mesh: Any) -> None:  # fmt: skip
    """``ColwiseParallel._partition_linear_fn`` that replicates the bias instead of sharding it."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    original(self, name, module, device_mesh)
    full = module.bias.full_tensor().detach()
    module.register_parameter("bias", nn.Parameter(distribute_tensor(full, device_mesh, [Replicate()])))


def colwise_neighbours_rows(original: Callable[..., Any], self: Any, name: str, module: nn.Module,
                            device_mesh: Any) -> None:  # fmt: skip
    """``ColwiseParallel._partition_linear_fn`` whose ranks hold the next rank's rows: same placement and shape,
    another slice."""
    from torch.distributed.tensor import DTensor, Shard

    original(self, name, module, device_mesh)
    n, rank = device_mesh.size(), device_mesh.get_local_rank()
    full = module.weight.full_tensor().detach()
    local = full.chunk(n, dim=0)[(rank + 1) % n].contiguous()
    module.register_parameter("weight", nn.Parameter(DTensor.from_local(local, device_mesh, [Shard(0)])))


def rowwise_scatter_then_gather(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output is reduce-scattered then all-gathered (a hook before the style's
    own): the bytes of an all-reduce, in two collectives."""
    from torch.distributed.tensor import Shard

    applied = original(self, module, device_mesh)
    module.register_forward_hook(lambda mod, args, output: output.redistribute(placements=(Shard(-1),)), prepend=True)
    return applied


def rowwise_reduces_a_copy(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output hook all-reduces a copy of the partial output and hands on a
    replicated DTensor with its values: the same values, count and size, another tensor moved."""
    from torch.distributed.tensor import DTensor, Replicate

    applied = original(self, module, device_mesh)

    def hook(mod: nn.Module, args: Any, output: Any) -> Any:
        local = output.to_local()
        with torch.no_grad():
            reduced = local.clone()
            dist.all_reduce(reduced, group=device_mesh.get_group())
        return DTensor.from_local(local + (reduced - local).detach(), device_mesh, [Replicate()], run_check=False)

    module.register_forward_hook(hook, prepend=True)
    return applied


def rowwise_never_reduced(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output is declared replicated without its all-reduce: each rank goes on
    with its own partial sum."""
    from torch.distributed.tensor import DTensor, Replicate

    applied = original(self, module, device_mesh)

    def hook(mod: nn.Module, args: Any, output: Any) -> Any:
        return DTensor.from_local(output.to_local(), device_mesh, [Replicate()], run_check=False)

    module.register_forward_hook(hook, prepend=True)
    return applied


def input_left_plain(original: Callable[..., Any], self: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
    """``PrepareModuleInput._prepare_input_arg`` that leaves the input a plain tensor."""
    return input


def doubled_sends(original: Callable[..., Any], self: Any, chunk: int) -> list[Any]:
    """``get_fwd_send_ops`` that sends each activation twice (`doubled_receives` takes the copy): a schedule that
    moves twice the bytes."""
    ops = original(self, chunk)
    return ops + [dist.P2POp(op.op, op.tensor, op.peer, op.group) for op in ops]


def doubled_receives(original: Callable[..., Any], self: Any, chunk: int) -> list[Any]:
    """``get_fwd_recv_ops`` that also receives `doubled_sends`'s copy, into a buffer nobody reads."""
    ops = original(self, chunk)
    return ops + [dist.P2POp(op.op, torch.empty_like(op.tensor), op.peer, op.group) for op in ops]


def initialized_every_step(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``_initialize_stage`` that forgets the stage was initialized: every step exchanges the shapes again."""
    self._stage_forward_initialized = self._stage_backward_initialized = False
    return original(self, *args, **kwargs)


def runs_gpipe(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Schedule1F1B._step_microbatches`` that runs GPipe's order."""
    from torch.distributed.pipelining import ScheduleGPipe

    return ScheduleGPipe._step_microbatches(self, *args, **kwargs)


def runs_1f1b(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``ScheduleGPipe._step_microbatches`` that runs 1F1B's order."""
    from torch.distributed.pipelining import Schedule1F1B

    return Schedule1F1B._step_microbatches(self, *args, **kwargs)


def keeps_idle_slots(original: Callable[..., Any], actions: list[Any], n_microbatches: int) -> list[Any]:
    """``_add_reduce_grad`` that keeps the idle ``None`` entries, as the IR's docstring says."""
    kept = original(actions, n_microbatches)
    return [None] * sum(1 for a in actions if a is None) + kept


def last_stage_from_zero(original: Callable[..., Any], self: Any) -> Any:
    """``Schedule1F1B._get_pipeline_order`` with the last stage's off-by-one fixed: its forwards named F0 …"""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    order = original(self)
    last = self._num_stages - 1
    order[last] = [_Action(a.stage_index, a.computation_type, a.microbatch_index - 1)
                   if a is not None and a.computation_type == _ComputationType.FORWARD else a
                   for a in order[last]]  # fmt: skip
    return order


def keeps_activations(original: Callable[..., Any], self: Any, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
    """``backward_one_chunk`` that puts the microbatch's forward state back after its backward: a stage that
    never frees activations within a step."""
    from checks.probes.stages import _forward_cache

    cache = _forward_cache(self)
    entry = cache.get(bwd_chunk_id)
    result = original(self, bwd_chunk_id, *args, **kwargs)
    if entry is not None:
        cache[-1 - bwd_chunk_id] = entry  # under another key: the schedule never asks for it again
    return result


def strided_as_plain(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FSDPParam._init_sharding_spec_tp`` that places a tensor-parallel parameter ``Shard`` on dp where it
    would be ``_StridedShard``: the same local rows, described as contiguous ones."""
    import dataclasses

    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out = original(self, *args, **kwargs)
    plain = tuple(Shard(p.dim) if isinstance(p, _StridedShard) else p for p in self._spmd_placements)
    self._spmd_placements = plain
    self._sharding_spec = dataclasses.replace(self._sharding_spec, placements=plain)
    return out


def first_stage_warms_up_less(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Schedule1F1B._step_microbatches`` whose first stage forwards one microbatch fewer before its first
    backward (its warm-up reads ``p − 1`` stages): it then waits on the whole pipeline for every backward."""
    if self._stage.stage_index != 0:
        return original(self, *args, **kwargs)
    self._num_stages -= 1
    try:
        return original(self, *args, **kwargs)
    finally:
        self._num_stages += 1
