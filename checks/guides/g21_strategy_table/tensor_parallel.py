"""Tensor parallel: the block's shards after ``parallelize_module``, the all-reduces of one forward and backward
(which storage each moves, as `checks.probes.payload_witness` saw it), against `checks.models.tensor_parallel` and
the guide's ``tp-shards-*`` and ``tp-all-reduces*`` blocks; the sharded block against the unsharded one."""

from __future__ import annotations

from fractions import Fraction
from functools import partial
from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g21_strategy_table.unsharded_reference import LR, chunk_of, full, require_close
from checks.models import tensor_parallel as tpm
from checks.probes.comm import record_comm
from checks.probes.payload_witness import PayloadWitness
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.tensor_parallel_block import (
    TP_BATCH,
    TP_SEQ,
    Block,
    block,
    block_linears,
    block_regions,
    tp_block,
    tp_input,
)


def tp_shards(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """After ``parallelize_module`` every Linear parameter is a DTensor with the model's placement and local
    shape, and its local tensor is, bit for bit, this rank's ``torch.chunk`` of the unsharded parameter along the
    placement's dimension (all of it when replicated); LayerNorms stay plain tensors. Bytes per rank are the
    model's. ``expected``: the guide's rows, ``<parameter>: <placement> <local shape>``."""
    from torch.distributed.tensor import DTensor

    reference = dict(block().named_parameters())
    model = tp_block(ctx)
    want = {s.name: s for s in tpm.shards(block_linears(), ctx.world_size)}
    sharded = {name: param for name, param in model.named_parameters() if name in want}
    observed = {name: f"{param.placements[0]!r} {'x'.join(map(str, param.to_local().shape))}"
                for name, param in sharded.items()}  # fmt: skip
    held = 0
    with expected.naming_false_rows(partial(expected.differing_values, observed)):
        for name, param in model.named_parameters():
            if name not in want:
                require(not isinstance(param, DTensor), "not-a-linear-sharded", f"{name} is a DTensor", name=name)
                require(torch.equal(param, reference[name]), "replica-differs", f"{name} differs", name=name)
                continue
            spec = want[name]
            placement = repr(param.placements[0])
            local = param.to_local()
            require_equal((placement, tuple(param.shape), tuple(local.shape)), (spec.placement, spec.shape,
                          spec.local_shape), reason="shard-differs-from-model", what=f"{name}: placement, global "
                          "and local shape", name=name)  # fmt: skip
            require(torch.equal(local, chunk_of(reference[name], placement, ctx.rank, ctx.world_size)), "wrong-slice",
                    f"{name}: rank {ctx.rank} holds another slice of the unsharded parameter", name=name)  # fmt: skip
            held += local.numel() * local.element_size()
        want_bytes = 4 * sum(s.local_numel for s in want.values())
        require_equal(
            held, want_bytes, reason="bytes-differ-from-model", what="bytes of the Linear shards on this rank"
        )
    expected.require_values(observed, reason="shards-differ-from-guide", what="the shards, as the guide says")
    unsharded = 4 * sum(p.numel() for name, p in reference.items() if name in want)
    return {"lines": [f"{name}: {value}" for name, value in observed.items()], "bytes": held,
            "unsharded_bytes": unsharded}  # fmt: skip


def _witness(model: Block, prepared: bool) -> PayloadWitness:
    """Watch the row-wise layers' partial outputs, and the partial gradients of the column-wise layers' inputs:
    the attention's one input when ``PrepareModuleInput`` made it a DTensor, else q's, k's and v's each."""
    attn, mlp = model.attn, model.mlp
    inputs = {"attn": attn} if prepared else {f"attn.{p}": getattr(attn, p) for p in "qkv"}
    return PayloadWitness({"attn.o": attn.o, "mlp.proj": mlp.proj}, inputs | {"mlp.fc": mlp.fc})


def _collective_row(c: Any, layer: str, what: str) -> str:
    """``backward: all-reduce 256 of the mlp.fc input gradient``: a collective as the guide's rows say it."""
    moved = f"the {layer} {what}" if layer else what
    return f"{'backward' if c.in_backward else 'forward'}: {c.op.replace('_', '-')} {c.numel} of {moved}"


def tp_collectives(ctx: RankContext, prepared: bool, expected: Expected) -> dict[str, Any]:
    """One forward and one backward of the block under tensor parallelism: its collectives are the model's, in
    order (each an fp32 all-reduce of tokens × d_model elements on the tensor-parallel group), and each moves the
    tensor the model names: in forward the row-wise layer's partial output, in backward the partial gradient of
    a column-wise input, never a parameter. ``expected``: the guide's rows, one per collective, in order."""
    model = tp_block(ctx, prepared)
    witness = _witness(model, prepared)
    with record_comm() as comm:
        loss = model(tp_input(ctx)).sum()
        loss.backward()
    witness.remove()
    moved = [witness.moved(c) for c in comm]
    lines = [_collective_row(c, layer, what) for c, (layer, what) in zip(comm, moved, strict=True)]
    want = tpm.collectives(block_regions(prepared), TP_BATCH * TP_SEQ, ctx.world_size)
    got = [(c.op, c.numel, c.dtype.removeprefix("torch."), c.in_backward) for c in comm]
    ring = tpm.step_ring_bytes(want, 4, ctx.world_size)
    with expected.naming_false_rows(partial(expected.differing_rows, lines)):
        require_equal(got, [(o.op, o.numel, "float32", o.backward) for o in want],
                      reason="collectives-differ-from-model",
                      what="(op, elements, dtype, in backward) of every collective, in order")  # fmt: skip
        require_equal([(layer.split(".")[0], what) for layer, what in moved], [(o.region, o.tensor) for o in want],
                      reason="wrong-tensor-all-reduced", what="(region, tensor) each all-reduce moved",
                      moved=moved)  # fmt: skip
        groups = {c.group_ranks for c in comm}
        require_equal(groups, {tuple(range(ctx.world_size))}, reason="wrong-group", what="the groups all-reduced over")
    expected.require_rows(lines, reason="collectives-differ-from-guide", what="the collectives, as the guide says")
    require_equal(Fraction(sum(Fraction(c.ring_bytes) for c in comm)), ring, reason="ring-bytes-differ-from-model",
                  what="ring bytes per rank")  # fmt: skip
    return {"lines": lines, "count": len(got), "backward_count": sum(c.in_backward for c in comm),
            "ring_bytes": float(ring), "callers": sorted({c.caller for c in comm})}  # fmt: skip


def tp_equivalence(ctx: RankContext, tolerance: float, steps: int = 3, prepared: bool = True) -> dict[str, Any]:
    """``steps`` SGD steps of the block under tensor parallelism against the unsharded block, same inputs: the
    output, the input's gradient, every parameter's gradient and every parameter after the step agree within
    ``tolerance`` (of each tensor's largest magnitude; of the block's largest gradient element for gradients); the
    worst relative error is reported."""
    reference, model = block().to(ctx.device), tp_block(ctx, prepared)
    optims = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, model)]
    named = dict(reference.named_parameters())
    worst: dict[str, float] = {}
    for step in range(steps):
        x_ref, x_tp = tp_input(ctx, step), tp_input(ctx, step)
        y_ref, y_tp = reference(x_ref), model(x_tp)
        y_ref.square().mean().backward()
        y_tp.square().mean().backward()
        pairs = {"output": (y_tp.detach(), y_ref.detach()), "input.grad": (x_tp.grad, x_ref.grad)}
        pairs |= {f"{n}.grad": (full(p.grad), named[n].grad) for n, p in model.named_parameters()}
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        pairs |= {n: (full(p.detach()), named[n].detach()) for n, p in model.named_parameters()}
        require_close(pairs, tolerance, step + 1, worst)
    return {"worst": max(worst.values()), "worst_by_tensor": worst}
