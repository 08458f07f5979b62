"""2D, FSDP2 over tensor parallelism on a 2 × 2 mesh: each parameter's placements and local tensor against
`checks.models.tensor_parallel`'s (the ``two-d-placements`` block), each dimension's collectives against the
data-parallel and tensor-parallel models (``two-d-collectives``), and three steps against the unsharded block."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g21_strategy_table.unsharded_reference import LR, chunk_of, full, require_close
from checks.models import tensor_parallel as tpm
from checks.models.comm_volume import fsdp2_padded, sharded_step
from checks.probes.comm import CommLog, record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.tensor_parallel_block import (
    D_MODEL,
    DP,
    TP,
    TP_BATCH,
    TP_SEQ,
    block,
    block_linears,
    block_regions,
    fsdp_over_tp,
    mesh_coordinates,
    mesh_dims,
    tp_input,
)


def two_d_placements(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """FSDP2 over tensor parallelism on a 2 × 2 mesh: each Linear parameter's placements and local shape, and
    its local tensor is bitwise the slice the model assigns to this rank's (dp, tp) coordinates (tensor parallel
    first, then FSDP's dim-0 chunk of that). ``expected``: the guide's rows, ``<parameter>: <placements> <local
    shape>``; a model comparison that fails names those the same run makes false."""
    model, _ = fsdp_over_tp(ctx)
    reference = dict(block().named_parameters())
    params = dict(model.named_parameters())
    dp, tp = mesh_coordinates(ctx.rank)
    specs = tpm.shards(block_linears(True), TP)
    placements = {s.name: "(" + ", ".join(repr(p) for p in params[s.name].placements) + ")" for s in specs}
    observed = {s.name: f"{placements[s.name]} {'x'.join(map(str, params[s.name].to_local().shape))}" for s in specs}
    with expected.naming_false_rows(partial(expected.differing_values, observed)):
        for spec in specs:
            local = params[spec.name].to_local()
            require_equal(placements[spec.name], tpm.fsdp_over_tp_placements(spec, TP),
                          reason="placements-differ-from-model", what=f"{spec.name}: placements (dp, tp)",
                          name=spec.name)  # fmt: skip
            require_equal(tuple(local.shape), tpm.fsdp_over_tp_local(spec, DP),
                          reason="local-shape-differs-from-model", what=f"{spec.name}: local shape",
                          name=spec.name)  # fmt: skip
            want = chunk_of(chunk_of(reference[spec.name], spec.placement, tp, TP), "Shard(dim=0)", dp, DP)
            require(torch.equal(local, want), "wrong-slice", f"{spec.name}: rank {ctx.rank} (dp {dp}, tp {tp}) "
                    "holds another slice", name=spec.name)  # fmt: skip
    expected.require_values(observed, reason="placements-differ-from-guide", what="placements and local shapes")
    return {"lines": [f"{name}: {value}" for name, value in observed.items()]}


def _by_group(comm: CommLog, mesh: Any) -> dict[str, list[tuple[str, int, bool]]]:
    groups = {name: tuple(sub.mesh.tolist()) for name, sub in zip(("dp", "tp"), mesh_dims(mesh), strict=True)}
    out: dict[str, list[tuple[str, int, bool]]] = {"dp": [], "tp": [], "other": []}
    for c in comm:
        dim = next((d for d, ranks in groups.items() if c.group_ranks == ranks), "other")
        out[dim].append((c.op, c.numel, c.in_backward))
    return out


def two_d_collectives(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """A steady step of FSDP2 over tensor parallelism: on the ``dp`` group only FSDP2's collectives of the
    tensor-parallel shards (the data-parallel model over the local shapes: the root unit all-gathered in forward,
    kept, reduce-scattered in backward); on the ``tp`` group only the block's all-reduces of activations (the
    tensor-parallel model on this rank's half of the batch); nothing else. ``expected``: the guide's rows, one
    per collective, dp's then tp's; a model comparison that fails names the first the same run makes false."""
    model, mesh = fsdp_over_tp(ctx)
    dp, _ = mesh_coordinates(ctx.rank)
    for step in range(2):
        with record_comm() as comm:
            model(tp_input(ctx, step, batch_size=TP_BATCH * DP).chunk(DP)[dp]).sum().backward()
    seen = _by_group(comm, mesh)
    lines = [
        f"{dim} {op} {numel}{' in backward' if bwd else ''}" for dim in ("dp", "tp") for op, numel, bwd in seen[dim]
    ]
    local_shapes = [s.local_shape for s in tpm.shards(block_linears(True), TP)]
    norms = [(D_MODEL,)] * 4  # the LayerNorms' weights and biases: plain tensors to tp, sharded by FSDP
    dp_model = sharded_step(fsdp2_padded({"root": [*local_shapes, *norms]}, DP), set(), 4, DP)
    want_tp = tpm.collectives(block_regions(True), TP_BATCH * TP_SEQ, TP)
    with expected.naming_false_rows(partial(expected.differing_rows, lines)):
        require_equal(seen["dp"], [(o.op, o.numel, o.backward) for o in dp_model.ops],
                      reason="dp-collectives-differ-from-model",
                      what="collectives on the dp group (op, elements, in backward)")  # fmt: skip
        require_equal(seen["tp"], [(o.op, o.numel, o.backward) for o in want_tp],
                      reason="tp-collectives-differ-from-model",
                      what="collectives on the tp group (op, elements, in backward)")  # fmt: skip
        require_equal(seen["other"], [], reason="collective-on-another-group", what="collectives on neither group")
    expected.require_rows(lines, reason="collectives-differ-from-guide", what="each dimension's collectives")
    return {"lines": lines}


def two_d_equivalence(ctx: RankContext, tolerance: float, steps: int = 3) -> dict[str, Any]:
    """``steps`` SGD steps of FSDP2 over tensor parallelism, each dp rank on its half of the batch, against the
    unsharded block on the whole batch (loss: the mean over the batch): every parameter's gradient and value
    after each step agree within ``tolerance`` of its largest magnitude."""
    model, _ = fsdp_over_tp(ctx)
    reference = block().to(ctx.device)
    dp, _ = mesh_coordinates(ctx.rank)
    optims = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, model)]
    named = dict(reference.named_parameters())
    worst: dict[str, float] = {}
    for step in range(steps):
        x = tp_input(ctx, step, requires_grad=False, batch_size=TP_BATCH * DP)
        reference(x).square().mean().backward()
        model(x.chunk(DP)[dp]).square().mean().backward()  # FSDP2 averages the dp ranks' gradients
        pairs = {f"{n}.grad": (full(p.grad), named[n].grad) for n, p in model.named_parameters()}
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        pairs |= {n: (full(p.detach()), named[n].detach()) for n, p in model.named_parameters()}
        require_close(pairs, tolerance, step + 1, worst)
    return {"worst": max(worst.values()), "worst_by_tensor": worst}
