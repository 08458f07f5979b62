"""Checks for guide 12, the flat parameter: FSDP1's ``FlatParameter`` against the spec, value by value, through an
all-gather and an optimizer step; its layout drawn from the real metadata; and what CPU offload does on a CPU.

The property checks take one drawn unit (`checks.models.flat_param_draws`, plain data drawn in the pytest
process) and build it here, identically on every rank. Expected values never come from FSDP: layouts from the
spec (`checks.models.flat_param`), parameter values from an unwrapped replica of the same unit built in this
process, and the update from that replica's own backward and SGD step.

Exactness. Every rank feeds the same batch, so every rank computes the same gradient and FSDP's reduction only
averages copies. The values are chosen so that nothing rounds anywhere: parameters are multiples of 1/4 in
[-1/2, 1/2], inputs are -1, 0 or 1, LayerNorm sees rows of ±1 with ``eps=0`` (mean 0, variance 1, so it
normalises exactly), and the loss ``sum(out + out²/2)`` has the gradient ``1 + out``. Gradients are then small
multiples of 1/16 that bf16's 8 significant bits hold exactly, so sums across ranks in any order, the
divisions by 2 of the pre- and post-divide, the casts and ``p - lr * g`` with ``lr = 1/4`` are all exact, and
the comparison is ``torch.equal``, bf16 ``param_dtype`` included.
"""

from __future__ import annotations

import traceback
from functools import partial, reduce
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import _runtime_utils as ru

from checks.models.flat_param import FlatParamSpec
from checks.models.flat_param_diagram import diagram_lines, layout_fields
from checks.models.flat_param_draws import MAX_DIM, describe, spec_of
from checks.naming import clean
from checks.probes import record_comm
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads import toy

PADDING_VALUE = 42.0  # `_construct_padding_tensor` fills padding with `_FLAT_PARAM_PADDING_VALUE`
LR = 0.25
BATCH = 2
LOOKUPS = 2  # embedding indices per row

# The unit the guide draws (its `expect layout-at-4` block): the spec tests' mixed unit, in the draws' naming.
LAYOUT_UNIT: dict[str, Any] = {
    "use_orig_params": True,
    "param_dtype": "float32",
    "root": [{"name": "w0", "shape": [2, 5], "frozen": False}, {"name": "w1", "shape": [0], "frozen": False}],
    "modules": [
        {"kind": "linear", "in": 5, "out": 3, "bias": True, "frozen": False},
        {"kind": "embedding", "num": 7, "dim": 3, "frozen": False},
        {"kind": "tied", "to": "m1.weight"},
    ],
}


# -- building a drawn unit ----------------------------------------------------------------------------------------
class Holder(nn.Module):
    """A child with one parameter ``weight``: a bare parameter, or (tied) an earlier module's weight again."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight


class DrawnUnit(nn.Module):
    """The module a unit description (`checks.models.flat_param_draws`) describes: the root's bare parameters
    ``w0, w1, …`` and children ``m0, m1, …``. Its forward uses every parameter, a tied one twice."""

    def __init__(self, unit: dict[str, Any], generator: torch.Generator) -> None:
        super().__init__()
        self.kinds = [m["kind"] for m in unit["modules"]]

        def value(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randint(-2, 3, shape, generator=generator, dtype=torch.float32) / 4)

        self.root_names = [p["name"] for p in unit["root"]]
        for p in unit["root"]:
            self.register_parameter(p["name"], value(*p["shape"]))
        for i, m in enumerate(unit["modules"]):
            kind = m["kind"]
            if kind == "linear":
                child: nn.Module = nn.Linear(m["in"], m["out"], bias=m["bias"])
            elif kind == "embedding":
                child = nn.Embedding(m["num"], m["dim"])
            elif kind == "layernorm":
                child = nn.LayerNorm(m["dim"], eps=0.0)
            elif kind == "bare":
                child = Holder(value(*m["shape"]))
            else:
                child = Holder(reduce(getattr, m["to"].split("."), self))
            if kind in ("linear", "embedding", "layernorm"):
                for name, param in list(child.named_parameters(recurse=False)):
                    setattr(child, name, value(*param.shape))
            self.add_module(f"m{i}", child)
        for p in unit["root"]:
            getattr(self, p["name"]).requires_grad_(not p["frozen"])
        for i, m in enumerate(unit["modules"]):
            if m.get("frozen"):
                getattr(self, f"m{i}").requires_grad_(False)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        outs = [getattr(self, name).reshape(-1) for name in self.root_names]
        for i, kind in enumerate(self.kinds):
            child = getattr(self, f"m{i}")
            if kind == "linear":
                outs.append(child(x[:, : child.in_features]).reshape(-1))
            elif kind == "embedding":
                outs.append(child(idx % child.num_embeddings).reshape(-1))
            elif kind == "layernorm":
                rows = torch.ones(x.shape[0], child.normalized_shape[0], dtype=x.dtype, device=x.device)
                rows[:, 1::2] = -1  # mean 0, variance 1: normalised exactly with eps=0
                outs.append(child(rows).reshape(-1))
            elif kind == "bare":
                outs.append(child.weight.reshape(-1))
            else:  # a tied weight's second use
                outs.append(0.5 * child.weight.reshape(-1))
        out = torch.cat(outs)
        return (out + 0.5 * out * out).sum()


def build_unit(unit: dict[str, Any], device: torch.device, seed: int = 0) -> DrawnUnit:
    """The drawn unit as a module, with the same values on every rank (its own generator, not the global RNG)."""
    return DrawnUnit(unit, torch.Generator().manual_seed(seed)).to(device)


def unit_batch(device: torch.device, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch, the same on every rank: inputs in {-1, 0, 1} and embedding indices."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (BATCH, MAX_DIM), generator=generator).float()
    idx = torch.randint(0, 64, (BATCH, LOOKUPS), generator=generator)
    return x.to(device), idx.to(device)


def wrap_unit(ctx: RankContext, unit: dict[str, Any], **options: Any) -> FSDP:
    """The unit wrapped whole by FSDP1 (one handle, one flat parameter), FULL_SHARD on all ranks."""
    mixed = MixedPrecision(param_dtype=torch.bfloat16) if unit["param_dtype"] == "bfloat16" else None
    return FSDP(
        build_unit(unit, ctx.device),
        device_id=ctx.device,
        use_orig_params=unit["use_orig_params"],
        mixed_precision=mixed,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        **options,
    )


def _tensor_at(module: nn.Module, fqn: str) -> torch.Tensor:
    return reduce(getattr, fqn.split("."), module)


def _fqns_with_ties(spec: FlatParamSpec) -> list[str]:
    return [*spec.fqns, *(t.fqn for t in spec.shared)]


def expected_flat(spec: FlatParamSpec, replica: nn.Module) -> torch.Tensor:
    """The padded unsharded flat parameter the spec lays out, filled from the replica's parameters: each parameter
    flattened at its offset, alignment and world-size padding 42 (inside the flat parameter), and the padding
    sharding adds beyond it (``use_orig_params=False``) 0, as `_get_shard`'s ``F.pad`` leaves it."""
    return laid_out(spec, {fqn: _tensor_at(replica, fqn) for fqn in spec.fqns}, PADDING_VALUE)


def laid_out(spec: FlatParamSpec, values: dict[str, torch.Tensor], padding: float) -> torch.Tensor:
    """Per-parameter ``values`` (by fqn) in the spec's padded unsharded layout: ``padding`` in every padding segment
    of the flat parameter, zeros past it."""
    pieces, index = [], 0
    for numel, pad in zip(spec.numels_with_padding, spec.is_padding_mask, strict=True):
        if pad:
            pieces.append(torch.full((numel,), padding))
        else:
            pieces.append(values[spec.fqns[index]].detach().float().cpu().reshape(-1))
            index += 1
    flat = torch.cat(pieces) if pieces else torch.zeros(0)
    whole = spec.padded_unsharded_numel if spec.padded_unsharded_numel is not None else spec.flat_numel
    return F.pad(flat, [0, whole - flat.numel()])


def _first_difference(observed: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """Where two tensors first differ, as plain data (shapes, index, the two values)."""
    info: dict[str, Any] = {"observed_shape": list(observed.shape), "expected_shape": list(expected.shape)}
    if observed.shape == expected.shape:
        differ = (observed.float() != expected.float()).reshape(-1).nonzero()
        if len(differ):
            i = int(differ[0])
            info.update(
                index=i, observed_value=float(observed.reshape(-1)[i]), expected_value=float(expected.reshape(-1)[i])
            )
    return info


def require_same_tensor(
    observed: torch.Tensor, expected: torch.Tensor, *, reason: str, what: str, **details: Any
) -> None:
    """``torch.equal`` or a `Violation` naming the first element that differs."""
    observed = observed.detach().cpu()
    if observed.shape == expected.shape and torch.equal(observed.float(), expected.float()):
        return
    info = _first_difference(observed, expected)
    where = (
        f" at element {info['index']}: {info['observed_value']} vs {info['expected_value']}" if "index" in info else ""
    )
    raise Violation(
        reason, f"{what} differs{where} (shape {info['observed_shape']} vs {info['expected_shape']})", **info, **details
    )


# -- (a) the FlatParameter is the spec ------------------------------------------------------------------------------
def _real_fields(model: FSDP) -> list[tuple[str, Any]]:
    """The fields compared, in order, as plain data read off the real handle and its ``FlatParameter``."""
    handle = model._handle
    flat = handle.flat_param
    return [
        ("fqns", list(flat._fqns)),
        ("shapes", [list(s) for s in flat._shapes]),
        ("numels", list(flat._numels)),
        ("numels-with-padding", list(flat._numels_with_padding)),
        ("is-padding-mask", list(flat._is_padding_mask)),
        ("shared-param-infos", _ties(flat)),
        ("aligned-numel", handle._aligned_numel),
        ("unpadded-unsharded-size", flat._unpadded_unsharded_size.numel()),
        ("sharded-size", flat._sharded_size.numel()),
        ("shard-numel-padded", flat._shard_numel_padded),
        ("shard-param-infos", [tuple(i) for i in flat._shard_param_infos]),
        ("requires-grad", flat.requires_grad),
        ("view-shapes", {fqn: list(_tensor_at(model.module, fqn).shape) for fqn in _view_fqns(model)}),
    ]


def _ties(flat: Any) -> list[tuple[str, str]]:
    """``(fqn, primary fqn)`` of each tied parameter, from ``_shared_param_infos``."""
    return [
        (f"{s.module_name}.{s.param_name}".lstrip("."), f"{s.prim_module_name}.{s.prim_param_name}".lstrip("."))
        for s in flat._shared_param_infos
    ]


def _view_fqns(model: FSDP) -> list[str]:
    flat = model._handle.flat_param
    return [*flat._fqns, *(f"{s.module_name}.{s.param_name}".lstrip(".") for s in flat._shared_param_infos)]


def _spec_fields(spec: FlatParamSpec, rank: int) -> dict[str, Any]:
    return {
        "fqns": list(spec.fqns),
        "shapes": [list(s) for s in spec.shapes],
        "numels": list(spec.numels),
        "numels-with-padding": list(spec.numels_with_padding),
        "is-padding-mask": list(spec.is_padding_mask),
        "shared-param-infos": [(t.fqn, t.prim_fqn) for t in spec.shared],
        "aligned-numel": spec.aligned_numel,
        "unpadded-unsharded-size": spec.flat_numel,
        "sharded-size": spec.shard_numel,
        "shard-numel-padded": spec.shard_numel_padded(rank),
        "shard-param-infos": [i.as_tuple() for i in spec.shard_param_infos(rank)],
        "requires-grad": spec.requires_grad,
        "view-shapes": {fqn: list(shape) for fqn, shape in spec.view_shapes(rank).items()},
        "padded-unsharded-size": spec.padded_unsharded_numel,
    }


def _compare_fields(model: FSDP, spec: FlatParamSpec, rank: int) -> dict[str, Any]:
    want = _spec_fields(spec, rank)
    seen: dict[str, Any] = {}
    for field, observed in _real_fields(model):
        seen[field] = observed
        require_equal(observed, want[field], reason=f"{field}-differs", what=f"rank {rank}: {field}", field=field)
    return seen


def _compare_padded_size(model: FSDP, spec: FlatParamSpec, rank: int) -> int:
    padded = model._handle.flat_param._padded_unsharded_size.numel()
    require_equal(
        padded,
        spec.padded_unsharded_numel,
        reason="padded-unsharded-size-differs",
        what=f"rank {rank}: padded-unsharded-size",
        field="padded-unsharded-size",
    )
    return padded


def matches_spec(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (a): the drawn unit's real ``FlatParameter`` equals the spec field by field, padding included: the
    per-parameter tuples, the padding segments and mask, the tied parameters, the alignment, the three sizes, this
    rank's ``_shard_param_infos`` and ``_shard_numel_padded``, ``requires_grad`` and the originals' view shapes."""
    spec = spec_of(example, ctx.world_size)
    model = wrap_unit(ctx, example)
    seen = ctx.agreed(_compare_fields, model, spec, ctx.rank)
    ru._lazy_init(model, model)  # `_padded_unsharded_size` is set only here (the first forward would do it)
    seen["padded-unsharded-size"] = ctx.agreed(_compare_padded_size, model, spec, ctx.rank)
    return {"unit": describe(example), "flat_numel": spec.flat_numel, "shard": seen["sharded-size"]}


# -- (b) each rank holds its slice ----------------------------------------------------------------------------------
def _check_slice(model: FSDP, spec: FlatParamSpec, replica: nn.Module, rank: int, when: str) -> torch.Tensor:
    lo, hi = spec.shard_range(rank)
    want = expected_flat(spec, replica)[lo:hi]
    shard = model._handle.flat_param.detach()
    require_same_tensor(shard, want, reason="local-shard-differs", what=f"rank {rank} {when}: local shard [{lo}, {hi})")
    if spec.use_orig_params:
        for fqn, info in zip(spec.fqns, spec.shard_param_infos(rank), strict=True):
            start = info.intra_param_start_idx or 0
            piece = (
                _tensor_at(replica, fqn).detach().float().cpu().reshape(-1)[start : start + (info.numel_in_shard or 0)]
            )
            require_same_tensor(
                _tensor_at(model.module, fqn),
                piece,
                reason="view-values-differs",
                what=f"rank {rank} {when}: sharded view of {fqn}",
                fqn=fqn,
            )
    return want


def holds_its_slice(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (b): after wrapping, each rank's flat parameter is exactly its slice ``[r*c, (r+1)*c)`` of the
    concatenated original parameters, padding (42 inside, 0 from sharding) included, and with
    ``use_orig_params=True`` each original parameter is the values of its own piece."""
    spec = spec_of(example, ctx.world_size)
    replica = build_unit(example, ctx.device)
    model = wrap_unit(ctx, example)
    want = ctx.agreed(_check_slice, model, spec, replica, ctx.rank, "after wrapping")
    return {
        "unit": describe(example),
        "shard_numel": want.numel(),
        "padding_in_shard": int((want == PADDING_VALUE).sum()),
    }


# -- (c) the all-gather gives the originals back ---------------------------------------------------------------------
def _check_unsharded(model: FSDP, spec: FlatParamSpec, replica: nn.Module, when: str) -> None:
    """Inside ``summon_full_params``: the padded unsharded flat parameter is the spec's layout of the replica's
    values, and every original (tied ones included) is the replica's parameter, shape and values."""
    with FSDP.summon_full_params(model, writeback=False):
        handle = model._handle
        padded = handle._get_padded_unsharded_flat_param()
        require_same_tensor(
            padded,
            expected_flat(spec, replica),
            reason="padded-unsharded-differs",
            what=f"{when}: padded unsharded flat parameter",
        )
        for fqn in _fqns_with_ties(spec):
            require_same_tensor(
                _tensor_at(model.module, fqn),
                _tensor_at(replica, fqn).detach().float().cpu(),
                reason="unsharded-param-differs",
                what=f"{when}: {fqn}",
                fqn=fqn,
            )


def gathers_originals(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (c): ``summon_full_params`` (the unshard path: all-gather into the padded unsharded flat parameter,
    then unflattened views) gives back every original parameter exactly, and the padded flat parameter is the
    spec's layout with its padding."""
    spec = spec_of(example, ctx.world_size)
    replica = build_unit(example, ctx.device)
    model = wrap_unit(ctx, example)
    ctx.agreed(_check_unsharded, model, spec, replica, "summon_full_params")
    return {"unit": describe(example), "padded_numel": spec.padded_unsharded_numel}


# -- (d) one optimizer step ------------------------------------------------------------------------------------------
def _reference_step(example: dict[str, Any], device: torch.device) -> nn.Module:
    """The unwrapped unit after one SGD step on the batch, computing in ``param_dtype`` like FSDP's mixed
    precision (a bf16 copy for forward and backward, its gradients applied to the fp32 parameters)."""
    replica = build_unit(example, device)
    x, idx = unit_batch(device)
    if example["param_dtype"] == "float32":
        replica(x, idx).backward()
        torch.optim.SGD(replica.parameters(), lr=LR).step()
        return replica
    low = build_unit(example, device).to(torch.bfloat16)
    low(x.to(torch.bfloat16), idx).backward()
    with torch.no_grad():
        for master, copy in zip(replica.parameters(), low.parameters(), strict=True):
            if copy.grad is not None:
                master.sub_(LR * copy.grad.float())
    return replica


def step_matches_unwrapped(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (d): one forward, backward and SGD step of the wrapped unit on the same batch on every rank leaves
    each rank's shard as the slice of the unwrapped unit's updated parameters (padding untouched), and unflattens
    to exactly the unwrapped unit's parameters."""
    spec = spec_of(example, ctx.world_size)
    model = wrap_unit(ctx, example)
    x, idx = unit_batch(ctx.device)
    model(x, idx).backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR).step()
    reference = _reference_step(example, ctx.device)
    ctx.agreed(_check_slice, model, spec, reference, ctx.rank, "after one step")
    ctx.agreed(_check_unsharded, model, spec, reference, "after one step")
    moved = sum(
        int(not torch.equal(p, q))
        for p, q in zip(reference.parameters(), build_unit(example, ctx.device).parameters(), strict=True)
    )
    return {"unit": describe(example), "parameters_moved": moved}


def every_property(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """(a) to (d) on one drawn unit: the long run behind the ``slow`` marker."""
    return {
        "fields": matches_spec(ctx, example),
        "slice": holds_its_slice(ctx, example),
        "gather": gathers_originals(ctx, example),
        "step": step_matches_unwrapped(ctx, example),
    }


# -- the layout drawn from the real FlatParameter --------------------------------------------------------------------
def real_layout(model: FSDP, ctx: RankContext, title: str = "") -> dict[str, Any]:
    """`layout_fields` from the real ``FlatParameter``'s metadata, with each rank's shard size gathered (every rank
    must report the same)."""
    flat = model._handle.flat_param
    sizes = ctx.gather(flat._sharded_size.numel())
    require_equal(sorted(set(sizes)), [sizes[0]], reason="shard-sizes-differ", what="shard sizes across ranks")
    return layout_fields(
        fqns=list(flat._fqns),
        shapes=[list(s) for s in flat._shapes],
        numels_with_padding=list(flat._numels_with_padding),
        is_padding_mask=list(flat._is_padding_mask),
        world_size=ctx.world_size,
        shard_numel=sizes[0],
        sharded=model._handle.uses_sharded_strategy,
        shared=[
            (f"{s.module_name}.{s.param_name}", f"{s.prim_module_name}.{s.prim_param_name}")
            for s in flat._shared_param_infos
        ],
        title=title,
    )


ROW_ROOM = 78  # a guide's expect row fits 80 columns with a cell each side


def layout_diagram(ctx: RankContext, expected: list[str], use_orig_params: bool = True) -> dict[str, Any]:
    """The guide's unit wrapped on this world, its diagram drawn from the real metadata and compared line by line
    with the guide's ``expect`` block; returns the fields for ``fsdp-readings layout``."""
    unit = {**LAYOUT_UNIT, "use_orig_params": use_orig_params}
    model = wrap_unit(ctx, unit)
    fields = real_layout(model, ctx, title="the unit")
    lines = [line.rstrip() for line in diagram_lines(fields, width=ROW_ROOM)]  # no row starts blank: compared whole
    # A failure carries the fields too, so `fsdp-readings layout` can draw what the ranks built instead.
    for i, (got, want) in enumerate(zip(lines, expected, strict=False)):
        require_equal(got, want, reason="diagram-differs", what=f"diagram line {i + 1}", line=i + 1, lines=lines,
                      layout=fields)  # fmt: skip
    require_equal(len(lines), len(expected), reason="diagram-length-differs", what="diagram lines", lines=lines,
                  layout=fields)  # fmt: skip
    counts = {kind: sum(s["numel"] for s in fields["segments"] if s["kind"] == kind) for kind in ("align", "tail")}
    rank_params = {
        f"rank{r['rank']}": [
            s["fqn"]
            for s in fields["segments"]
            if s["kind"] == "param" and s["numel"] and s["offset"] < r["end"] and s["offset"] + s["numel"] > r["start"]
        ]
        for r in fields["ranks"]
    }
    return {"layout": fields, "alignment_padding": counts["align"], "tail_padding": counts["tail"], **rank_params}


# -- summon_full_params' arguments: writeback, with_grads, rank0_only -------------------------------------------------
def _shifted(spec: FlatParamSpec, replica: nn.Module, by: float) -> nn.Module:
    """``replica`` with ``by`` added to every flattened parameter (a tied one is the same tensor: once)."""
    with torch.no_grad():
        for fqn in spec.fqns:
            _tensor_at(replica, fqn).add_(by)
    return replica


def _edit(model: FSDP, spec: FlatParamSpec, by: float, grads: bool) -> None:
    """Add ``by`` to every flattened original parameter of the unwrapped view (and to its ``.grad``)."""
    with torch.no_grad():
        for fqn in spec.fqns:
            tensor = _tensor_at(model.module, fqn)
            tensor.add_(by)
            if grads:
                tensor.grad.add_(by)


def _grads_of(spec: FlatParamSpec, replica: nn.Module, plus: float = 0.0) -> dict[str, torch.Tensor]:
    return {fqn: _tensor_at(replica, fqn).grad + plus for fqn in spec.fqns}


def _check_grad_slice(model: FSDP, spec: FlatParamSpec, grads: dict[str, torch.Tensor], rank: int, when: str) -> None:
    """This rank's sharded ``flat_param.grad`` is its slice of ``grads`` laid out (0 in every padding segment:
    padding is never used, so it gets a zero gradient)."""
    lo, hi = spec.shard_range(rank)
    want = laid_out(spec, grads, 0.0)[lo:hi]
    require_same_tensor(model._handle.flat_param.grad, want, reason="local-grad-differs",
                        what=f"rank {rank} {when}: sharded gradient [{lo}, {hi})")  # fmt: skip


def _check_full_grads(inside: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor]) -> None:
    """Inside ``summon_full_params(with_grads=True)`` each original's ``.grad`` is the whole gradient."""
    for fqn, grad in inside.items():
        if grad is None:
            raise Violation("unsharded-grad-differs", f"{fqn}.grad is None inside the context", fqn=fqn)
        require_same_tensor(grad, want[fqn].cpu(), reason="unsharded-grad-differs", what=f"{fqn}.grad inside")


def summon_writeback(ctx: RankContext, with_grads: bool) -> dict[str, Any]:
    """``summon_full_params(writeback=True)`` keeps only each rank's own part of an edit. The unit of the
    layout diagram, after one backward on the same batch everywhere (exact values, so the gradients are the
    unwrapped unit's). First every rank adds 1 to every original parameter (and, ``with_grads``, to every
    gradient, which inside the context is the full one): afterwards every shard holds the edit. Then rank 0 alone
    adds 1 again: rank 0's shard keeps it, rank 1's does not, so a second summon shows rank 0's elements moved
    twice and rank 1's once: rank 0's edit to rank 1's elements is lost."""
    unit = {**LAYOUT_UNIT, "use_orig_params": True}
    spec = spec_of(unit, ctx.world_size)
    model, replica = wrap_unit(ctx, unit), build_unit(unit, ctx.device)
    x, idx = unit_batch(ctx.device)
    model(x, idx).backward()
    replica(x, idx).backward()
    with record_comm() as comm, FSDP.summon_full_params(model, writeback=True, with_grads=with_grads):
        inside = {fqn: _tensor_at(model.module, fqn).grad for fqn in spec.fqns} if with_grads else {}
        inside = {fqn: None if grad is None else grad.detach().clone() for fqn, grad in inside.items()}
        _edit(model, spec, 1.0, with_grads)
    ctx.agreed(_check_full_grads, inside, _grads_of(spec, replica))
    once = _shifted(spec, build_unit(unit, ctx.device), 1.0)
    ctx.agreed(_check_slice, model, spec, once, ctx.rank, "after every rank's edit")
    if with_grads:
        ctx.agreed(_check_grad_slice, model, spec, _grads_of(spec, replica, 1.0), ctx.rank, "after every rank's edit")
    with FSDP.summon_full_params(model, writeback=True, with_grads=with_grads):
        if ctx.rank == 0:
            _edit(model, spec, 1.0, with_grads)
    twice = _shifted(spec, build_unit(unit, ctx.device), 2.0)
    ctx.agreed(_check_slice, model, spec, twice if ctx.rank == 0 else once, ctx.rank, "after rank 0's edit")
    if with_grads:
        mine = _grads_of(spec, replica, 2.0 if ctx.rank == 0 else 1.0)
        ctx.agreed(_check_grad_slice, model, spec, mine, ctx.rank, "after rank 0's edit")
    lo, hi = spec.shard_range(0)
    merged = torch.cat([expected_flat(spec, twice)[lo:hi], expected_flat(spec, once)[hi:]])
    with FSDP.summon_full_params(model, writeback=False):
        gathered = model._handle._get_padded_unsharded_flat_param().detach().clone()
    what = "the gathered flat parameter after rank 0's edit"
    ctx.agreed(partial(require_same_tensor, reason="edit-not-lost", what=what), gathered, merged)
    moved = (gathered - expected_flat(spec, once)).ne(0).sum().item()
    # `unshard_grad` adds an all-reduce of one flag ("are all gradients None?") and the gradient's all-gather.
    padded = spec.padded_unsharded_numel
    want_comm = [["all_gather", padded], *([["all_reduce", 1], ["all_gather", padded]] if with_grads else [])]
    what = "collectives of the first summon_full_params (op, elements)"
    issued = [[c.op, c.numel] for c in comm]
    ctx.agreed(partial(require_equal, reason="summon-collectives", what=what), issued, want_comm)
    return {"shard_numel": spec.shard_numel, "moved_twice": int(moved), "rank0_range": [lo, hi],
            "collectives": issued}  # fmt: skip


def _storage(model: FSDP) -> int:
    return model._handle.flat_param._full_param_padded.untyped_storage().nbytes()


def _check_rank_0_values(values: dict[str, torch.Tensor], replica: nn.Module, rank: int) -> None:
    """On rank 0, each original seen inside the context is the unwrapped unit's parameter (other ranks: nothing)."""
    if rank != 0:
        return
    for fqn, value in values.items():
        want = _tensor_at(replica, fqn).detach().cpu()
        require_same_tensor(value, want, reason="rank-0-not-full", what=f"rank 0: {fqn} inside the context", fqn=fqn)


def summon_rank0_only(ctx: RankContext) -> dict[str, Any]:
    """``summon_full_params(rank0_only=True, writeback=False)``: every rank all-gathers, rank 0 sees every
    original parameter whole, with the unwrapped unit's values; every other rank frees the gathered buffer at
    once and sees its sharded 1-D views. With the default ``writeback=True``, ``rank0_only=True`` raises
    ``NotImplementedError`` on every rank before any collective."""
    unit = {**LAYOUT_UNIT, "use_orig_params": True}
    spec = spec_of(unit, ctx.world_size)
    model, replica = wrap_unit(ctx, unit), build_unit(unit, ctx.device)
    with record_comm() as comm, FSDP.summon_full_params(model, rank0_only=True, writeback=False):
        shapes = {fqn: list(_tensor_at(model.module, fqn).shape) for fqn in spec.fqns}
        values = {fqn: _tensor_at(model.module, fqn).detach().clone() for fqn in spec.fqns}
        held = _storage(model)
    full = {fqn: list(shape) for fqn, shape in zip(spec.fqns, spec.shapes, strict=True)}
    infos = zip(spec.fqns, spec.shard_param_infos(ctx.rank), strict=True)
    pieces = {fqn: [info.numel_in_shard or 0] for fqn, info in infos}
    padded_bytes = 4 * (spec.padded_unsharded_numel or 0)
    seen = {"shapes": shapes, "gathered_bytes": held, "all_gathers": comm.count("all_gather")}
    if ctx.rank == 0:
        want = {"shapes": full, "gathered_bytes": padded_bytes, "all_gathers": 1}
        reason = "rank-0-not-full"
    else:
        want = {"shapes": pieces, "gathered_bytes": 0, "all_gathers": 1}
        reason = "other-rank-unsharded"
    ctx.agreed(partial(require_equal, reason=reason, what=f"rank {ctx.rank} inside the context"), seen, want)
    ctx.agreed(_check_rank_0_values, values, replica, ctx.rank)
    with record_comm() as refused:
        try:
            with FSDP.summon_full_params(model, rank0_only=True):
                pass
        except NotImplementedError as error:
            message = str(error)
        else:
            message = ""
    said = {"raised": message, "collectives": len(refused)}
    want_said = {"raised": "writeback=True and rank0_only=True is not supported yet", "collectives": 0}
    what = "what summon_full_params(rank0_only=True) raised, and the collectives before"
    ctx.agreed(partial(require_equal, reason="writeback-rank0-only-allowed", what=what), said, want_said)
    gathers = seen["all_gathers"]
    return {"shapes": shapes, "gathered_bytes": held, "all_gathers": gathers, "refused": message}


# -- CPU offload -------------------------------------------------------------------------------------------------------
# What `pin_memory()` raises without an accelerator depends on the torch build, not on its version: the CPU wheel
# has no accelerator to ask for, a CUDA wheel finds no driver (measured: 2.13.0+cpu, 2.14.1+cu130).
NO_ACCELERATOR = (
    "Cannot access accelerator device when none is available",
    "Found no NVIDIA driver on your system",
)


def _no_accelerator(message: str) -> bool:
    return any(text in message for text in NO_ACCELERATOR)


def _fails_for_no_accelerator(call: Any, raised_in: str, ran: tuple[str, str]) -> dict[str, Any]:
    """``call()`` must raise one of the no-accelerator errors from a frame of ``raised_in``; ``ran`` is the
    (reason, message) of the violation when it does not raise at all."""
    try:
        call()
    except RuntimeError as error:
        message, frames = str(error), _frames(error)
    else:
        raise Violation(*ran)
    require(_no_accelerator(message), "wrong-offload-error", f"unexpected error: {message}", error=message)
    require(raised_in in frames, "raised-elsewhere", f"raised in {frames[-4:]}", frames=frames)
    return {"error": message, "raised_in": raised_in}


def _frames(error: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def offload_params_needs_accelerator(ctx: RankContext) -> dict[str, Any]:
    """``CPUOffload(offload_params=True)`` pins the sharded flat parameter at lazy initialisation
    (``init_flat_param_attributes``); on a machine without an accelerator pinning raises, at the first forward."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, cpu_offload=CPUOffload(offload_params=True))
    handle = model._handle
    require_equal(str(handle.flat_param.device), "cpu", reason="not-offloaded", what="flat parameter's device")
    if torch.accelerator.is_available():  # the premise does not hold here: show the pinning instead
        model(toy.toy_batch(ctx)).sum().backward()
        require(handle.flat_param._local_shard.is_pinned(), "shard-not-pinned", "the local shard is not pinned")
        return {"error": None, "raised_in": None}
    ran = ("offload-ran-without-accelerator", "the first forward with offload_params=True ran on CPU")
    return _fails_for_no_accelerator(lambda: model(toy.toy_batch(ctx)), "init_flat_param_attributes", ran)


def offload_params_on_gpu(ctx: RankContext) -> dict[str, Any]:
    """On CUDA, ``offload_params=True``: the shard lives on CPU, pinned; the all-gather runs on the device; the
    reduced gradient shard is copied by `_offload_grad` into the pinned ``_cpu_grad``, which is the gradient the
    CPU optimizer sees; and those gradients equal a run without offload."""
    offloaded = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, cpu_offload=CPUOffload(offload_params=True))
    plain = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx)
    x = toy.toy_batch(ctx)
    for model in (offloaded, plain):
        model(x).sum().backward()
    out: dict[str, Any] = {}
    for name, (a, b) in {"root": (offloaded, plain), "0": (offloaded[0], plain[0])}.items():
        fa, fb = a._handle.flat_param, b._handle.flat_param
        require_equal(str(fa.device), "cpu", reason="shard-not-on-cpu", what=f"{name}: sharded flat parameter")
        require(fa._local_shard.is_pinned(), "shard-not-pinned", f"{name}: local shard not pinned")
        require_equal(str(fa.grad.device), "cpu", reason="grad-not-on-cpu", what=f"{name}: gradient's device")
        require(fa._cpu_grad.is_pinned(), "grad-not-pinned", f"{name}: _cpu_grad not pinned")
        require_same_tensor(fa.grad, fb.grad.cpu(), reason="offloaded-grad-differs", what=f"{name}: gradient")
        out[name] = {"grad_device": str(fa.grad.device), "shard_numel": fa.numel()}
    return out


def _storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's storage: metadata only, never its data (a 0-byte storage with elements segfaults)."""
    return tensor.untyped_storage().nbytes()


def summon_offload_frees_storage(ctx: RankContext, use_orig_params: bool) -> dict[str, Any]:
    """torch < 2.14.1, compute device CPU: ``summon_full_params(offload_to_cpu=True)`` goes through
    ``FlatParamHandle.to_cpu``, whose ``.to("cpu")`` is no copy, and then frees the storage it still views. With
    ``use_orig_params=True`` every original parameter inside the context has its full shape on a 0-byte storage
    (read only as metadata here: touching the data kills the rank); with ``writeback=False`` the shard survives.
    With ``use_orig_params=False`` unflattening the freed flat parameter raises ``setStorage: … out of bounds``."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
    with torch.no_grad():
        model(toy.toy_batch(ctx))  # lazy init
    before = model._handle.flat_param.detach().clone()
    if not use_orig_params:
        try:
            with FSDP.summon_full_params(model, offload_to_cpu=True, writeback=False):
                pass
        except RuntimeError as error:
            message, frames = str(error), _frames(error)
        else:
            raise Violation("no-setstorage-error", "summon_full_params(offload_to_cpu=True) did not raise")
        ok = "setStorage" in message and "out of bounds for storage of size 0" in message
        require(ok, "wrong-summon-error", f"unexpected error: {message}", error=message)
        return {"error": message.partition(" requiring")[0], "raised_in": frames[-3:]}
    with FSDP.summon_full_params(model, offload_to_cpu=True, writeback=False):
        numels = {clean(n): p.numel() for n, p in model.named_parameters()}
        storage = {clean(n): _storage_bytes(p) for n, p in model.named_parameters()}
        flat_bytes = _storage_bytes(model._handle.flat_param)
    full = {clean(n): p.numel() for n, p in toy.toy_model(ctx.device).named_parameters()}
    require_equal(numels, full, reason="not-unsharded", what="numel of each parameter inside the context")
    require_equal(storage, dict.fromkeys(storage, 0), reason="storage-kept", what="storage bytes inside the context")
    require_same_tensor(model._handle.flat_param, before, reason="shard-changed", what="local shard after the context")
    return {"storage_bytes": storage, "numel": numels, "flat_param_bytes": flat_bytes}


def summon_offload_is_a_no_op(ctx: RankContext) -> dict[str, Any]:
    """torch >= 2.14.1: ``to_cpu`` does nothing when the flat parameter is already on the CPU, so
    ``summon_full_params(offload_to_cpu=True)`` on a CPU gives the full parameters with their storage and values,
    with and without ``use_orig_params``, and the default ``writeback=True`` leaves every shard as it was."""
    out = {}
    for use_orig_params in (False, True):
        model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
        with torch.no_grad():
            model(toy.toy_batch(ctx))
        before = model._handle.flat_param.detach().clone()
        full = {clean(n): p for n, p in toy.toy_model(ctx.device).named_parameters()}
        with FSDP.summon_full_params(model, offload_to_cpu=True):
            storage = {clean(n): _storage_bytes(p) for n, p in model.named_parameters()}
            short = sorted(n for n, size in storage.items() if size < 4 * full[n].numel())  # views share a storage
            require_equal(
                short, [], reason="storage-freed", what="parameters whose storage cannot hold them", storage=storage
            )
            for n, p in model.named_parameters():
                require_same_tensor(p, full[clean(n)].detach(), reason="unsharded-param-differs", what=clean(n))
        require_same_tensor(model._handle.flat_param, before, reason="shard-changed", what="shard after the context")
        out["orig" if use_orig_params else "flat"] = storage
    return out


# -- FSDP2 offload ---------------------------------------------------------------------------------------------------
def _fsdp2_params(model: nn.Module) -> list[Any]:
    """Every ``FSDPParam`` of an FSDP2 model, module by module."""
    found = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = get_state()._fsdp_param_group if get_state is not None else None
        if group is not None:
            found.extend(group.fsdp_params)
    return found


def fsdp2_offload(ctx: RankContext, pin_memory: bool) -> dict[str, Any]:
    """FSDP2 ``CPUOffloadPolicy`` on a cpu mesh. ``pin_memory=False``: the policy reaches every ``FSDPParam``
    (``offload_to_cpu`` on, ``pin_memory`` off), no sharded parameter or gradient is pinned, and one backward's
    sharded gradients equal a run without offload. The compute device is the CPU here, so the copies offload
    adds are no-ops and where the tensors live proves nothing; the flags and the pinning are what can differ.
    ``pin_memory=True`` (the default): ``fully_shard`` pins each sharded parameter and, without an accelerator,
    raises at once."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = CPUOffloadPolicy(pin_memory=pin_memory)
    if pin_memory and not torch.accelerator.is_available():
        ran = ("pinned-offload-ran", "fully_shard with CPUOffloadPolicy() ran without an accelerator")
        build = lambda: toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, offload_policy=policy)  # noqa: E731
        return _fails_for_no_accelerator(build, "_init_sharded_param", ran)
    x = toy.toy_batch(ctx)
    grads, seen = {}, {}
    for label, kwargs in (("offload", {"offload_policy": policy}), ("plain", {})):
        model = toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, **kwargs)
        model(x).sum().backward()
        grads[label] = {clean(n): p.grad.to_local().detach() for n, p in model.named_parameters()}
        seen[label] = {
            "flags": [list(f) for f in sorted({(p.offload_to_cpu, p.pin_memory) for p in _fsdp2_params(model)})],
            "devices": sorted({p.to_local().device.type for p in model.parameters()}),
            "pinned": sorted({p.to_local().is_pinned() for p in model.parameters()}),
            "grads_pinned": sorted({g.is_pinned() for g in grads[label].values()}),
        }
    want = {"offload": [[True, pin_memory]], "plain": [[False, False]]}
    flags = {label: seen[label]["flags"] for label in seen}
    require_equal(flags, want, reason="policy-not-applied", what="(offload_to_cpu, pin_memory) of every FSDPParam")
    offload = seen["offload"]
    require_equal(offload["devices"], ["cpu"], reason="not-on-cpu", what="devices of the sharded parameters")
    pinned = {"parameters": offload["pinned"], "gradients": offload["grads_pinned"]}
    want_pinned = {"parameters": [pin_memory], "gradients": [False]}  # on a cpu mesh no gradient is copied, so pinned
    require_equal(pinned, want_pinned, reason="pinned", what="is_pinned() of the sharded parameters and gradients")
    for name, grad in grads["offload"].items():
        require_same_tensor(grad, grads["plain"][name].cpu(), reason="offloaded-grad-differs", what=f"{name} gradient")
    return {**offload, "parameters": len(grads["offload"])}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ------------------------
def to_cpu_as_in_2_14_1(original: Any) -> Any:
    """``FlatParamHandle.to_cpu`` as torch 2.14.1 writes it: the same preconditions, then nothing at all when the
    flat parameter is already on the CPU (2.13.0's body otherwise)."""
    import contextlib

    from torch.distributed.fsdp._flat_param import _same_storage

    @contextlib.contextmanager
    def to_cpu(self: Any) -> Any:
        self._check_sharded_strategy()
        assert self.flat_param.size() == self.flat_param._unpadded_unsharded_size
        self._check_on_compute_device(self.flat_param)
        assert _same_storage(self.flat_param, self._get_padded_unsharded_flat_param())
        if self.flat_param.device.type == "cpu":
            yield
            return
        with original(self):
            yield

    return to_cpu


def aligned_off_by_one(original: Any, *args: Any, **kwargs: Any) -> int:
    """`_get_aligned_numel` one element off: fp32 aligns to 5 elements, bf16 to 9."""
    return original(*args, **kwargs) + 1


def shard_offsets_off_by_one(original: Any, handle: Any, *args: Any) -> Any:
    """``_get_shard_metadata`` with every in-shard parameter's ``offset_in_shard`` one further on."""
    from torch.distributed.fsdp._flat_param import _ShardParamInfo

    infos = original(handle, *args)
    return tuple(_ShardParamInfo(i[0], i[1] + 1, *i[2:]) if i.in_shard else i for i in infos)


def zero_padding(original: Any, numel: int, dtype: Any, requires_grad: bool, device: Any) -> Any:
    """`_construct_padding_tensor` filling padding with 0 instead of 42."""
    return torch.zeros((numel,), dtype=dtype, requires_grad=requires_grad, device=device)


def flattened_backwards(original: Any, handle: Any, tensors: Any, aligned_numel: int) -> Any:
    """``FlatParamHandle.flatten_tensors`` that concatenates in reverse element order (same length)."""
    return original(handle, tensors, aligned_numel).flip(0)


def gather_off_by_one(original: Any, handle: Any, padded: Any) -> Any:
    """``_all_gather_flat_param`` that adds 1 to the first gathered element."""
    out = original(handle, padded)
    out[0] += 1
    return out


def views_of_a_rolled_copy(original: Any, handle: Any, padded: Any) -> None:
    """``_use_unsharded_flat_param`` handed the gathered data rolled by one element (a copy)."""
    original(handle, padded.roll(1))


def no_grad_division(original: Any, tensor: Any, div_factor: float) -> None:
    """`_div_if_needed` that never divides: the reduction sums the ranks' gradients instead of averaging."""


def pins_nothing(original: Any, handle: Any) -> None:
    """``init_flat_param_attributes`` as if offload were off: nothing is pinned."""
    offload = handle._offload_params
    handle._offload_params = False
    try:
        original(handle)
    finally:
        handle._offload_params = offload
    flat = handle.flat_param
    flat._cpu_grad = torch.zeros_like(flat._local_shard)  # what offload allocates, unpinned


def double_offloaded_grads(original: Any, fsdp_params: Any, unsharded_grads: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``foreach_reduce`` that doubles the gradients of offloaded parameters before reducing them."""
    if any(getattr(p, "offload_to_cpu", False) for p in fsdp_params):
        unsharded_grads = [g * 2 for g in unsharded_grads]
    return original(fsdp_params, unsharded_grads, *args, **kwargs)


def never_pin(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` with pinning switched off."""
    fsdp_param.pin_memory = False
    return original(fsdp_param, *args, **kwargs)


def writeback_of_rank_0(original: Any, handle: Any, writeback_grad: bool) -> None:
    """``_writeback_to_local_shard`` that first broadcasts rank 0's unsharded parameter (and gradient), as the
    TODO in ``_validate_unshard_params_args`` proposes: rank 0's edits would then reach every shard."""
    import torch.distributed as dist

    dist.broadcast(handle.flat_param.data, src=0, group=handle.process_group)
    if writeback_grad and handle.flat_param.grad is not None:
        dist.broadcast(handle.flat_param.grad, src=0, group=handle.process_group)
    original(handle, writeback_grad)


def writeback_without_grads(original: Any, handle: Any, writeback_grad: bool) -> None:
    """``_writeback_to_local_shard`` that never writes the gradient back."""
    original(handle, False)


def unshard_grad_of_own_shard_only(original: Any, handle: Any) -> None:
    """``FlatParamHandle.unshard_grad`` whose unsharded gradient holds only this rank's shard: zeros elsewhere."""
    original(handle)
    lo = handle.flat_param._sharded_size.numel() * handle.rank
    grad = handle.flat_param.grad
    with torch.no_grad():
        grad[:lo].zero_()
        grad[lo + handle.flat_param._sharded_size.numel() :].zero_()


def everyone_gets_full_params(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``_unshard_fsdp_state_params`` that ignores ``rank0_only``: every rank keeps the full parameters."""
    kwargs["rank0_only"] = False
    return original(*args, **kwargs)


def allow_writeback_with_rank0_only(original: Any, state: Any, writeback: bool, rank0_only: bool, *rest: Any) -> None:
    """``_validate_unshard_params_args`` that lets ``writeback=True`` through with ``rank0_only=True``."""
    original(state, writeback and not rank0_only, rank0_only, *rest)


def always_pin(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` that pins an offloaded parameter whatever ``pin_memory`` says."""
    fsdp_param.pin_memory = fsdp_param.offload_to_cpu
    return original(fsdp_param, *args, **kwargs)


def never_offload(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` that drops the offload policy: the parameter stays on the compute
    device, which on a cpu mesh is the CPU as well."""
    fsdp_param.offload_to_cpu = fsdp_param.pin_memory = False
    return original(fsdp_param, *args, **kwargs)
